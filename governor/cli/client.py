"""The `governor sessions|locks|approvals` commands' client: where the control plane is,
its token, and one JSON exchange with it.

Where the control plane is: --control-url / $GOVERNOR_CONTROL_URL, else
<data-dir>/control.json (written by `governor run`). The control token: --token-file,
else $GOVERNOR_CONTROL_TOKEN, else <data-dir>/control-token. Requests never go through
the governor's proxy.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from governor.cli import UsageError

TIMEOUT = 30.0


class Refused(Exception):
    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"{status} {error.get('code', '')}: {error.get('message', body)}")
        self.status = status


def data_dir(args: argparse.Namespace) -> Path:
    return args.data_dir or Path(os.environ.get("GOVERNOR_DATA_DIR") or ".governor")


def control_url(args: argparse.Namespace) -> str:
    url = args.control_url or os.environ.get("GOVERNOR_CONTROL_URL")
    if url:
        return url.rstrip("/")
    path = data_dir(args) / "control.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))["url"].rstrip("/")
    except FileNotFoundError:
        raise UsageError(f"no running governor found: {path} does not exist (is `governor run --data-dir "
                         f"{data_dir(args)}` running?); or give --control-url") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: unreadable ({exc})") from None


def token_from(args: argparse.Namespace, env: str, file_name: str, kind: str) -> str | None:
    """--token-file, else $`env`, else <data-dir>/`file_name`, else None (`kind` names the
    token in the error for an unreadable file)."""
    path = args.token_file
    if path is None:
        value = os.environ.get(env, "").strip()
        if value:
            return value
        path = data_dir(args) / file_name
        if not path.exists():
            return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise UsageError(f"{kind} token file {path}: {exc.strerror or exc}") from None


def control_token(args: argparse.Namespace) -> str | None:
    return token_from(args, "GOVERNOR_CONTROL_TOKEN", "control-token", "control")


def call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None,
          token_of: Callable[[argparse.Namespace], str | None] | None = None) -> Any:
    """The control plane's JSON answer; Refused for an HTTP error, UsageError when it cannot be
    reached. `token_of` finds the bearer token (default: the control token, `control_token`)."""
    url = control_url(args) + path
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    token = (token_of or control_token)(args)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through the governor's proxy
    try:
        with opener.open(request, timeout=TIMEOUT) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = raw.decode("utf-8", "replace")
        raise Refused(exc.code, answer) from None
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"cannot reach the control plane at {url}: {getattr(exc, 'reason', exc)}") from None


def quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")
