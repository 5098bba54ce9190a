"""`governor run`'s files in the data directory: the control and reviewer tokens (mode 0600,
made on first run) and control.json (where this governor's control plane and proxy listen)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from governor.cli import UsageError


CONTROL_TOKEN_FILE = "control-token"
CONTROL_FILE = "control.json"


def ensure_control_token(settings: Any) -> Path | None:
    """With a control plane and no control token configured: the one in
    <data-dir>/control-token (mode 0600), created on first run. Opening sessions and
    lifting locks always need a token; `governor sessions` finds it there. Returns the
    file when the token came from it."""
    if settings.control is None or settings.control_token:
        return None
    settings.control_token = token_file(settings.data_dir / CONTROL_TOKEN_FILE, "control token")
    return settings.data_dir / CONTROL_TOKEN_FILE


REVIEWER_TOKEN_FILE = "reviewer-token"


def ensure_reviewer_token(settings: Any) -> Path | None:
    """With a control plane and no reviewer token configured: the one in
    <data-dir>/reviewer-token (mode 0600), created on first run, so a reviewer on this
    machine can answer approvals (`governor approvals` finds it there) instead of every
    held step timing out. Returns the file when the token came from it."""
    if settings.control is None or settings.reviewer_tokens:
        return None
    token = token_file(settings.data_dir / REVIEWER_TOKEN_FILE, "reviewer token")
    settings.reviewer_tokens = (token,)
    return settings.data_dir / REVIEWER_TOKEN_FILE


def token_file(path: Path, what: str) -> str:
    """The token in `path` (mode 0600), written with a fresh random one when missing or empty."""
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    except OSError as exc:
        raise UsageError(f"{what} file {path}: {exc.strerror or exc}") from None
    if not token:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def write_control_file(running: Any) -> None:
    """<data-dir>/control.json: where this governor's control plane listens (for `governor sessions`)
    and its explicit proxy (for `governor exec`)."""
    import json

    if not running.control_url:
        return
    path = running.settings.data_dir / CONTROL_FILE
    tmp = path.with_name(path.name + ".tmp")
    # the explicit proxy too, for `governor exec` (not in reverse mode: no CONNECT there)
    proxy = {"proxy": running.proxy_url} if running.settings.mode == "regular" else {}
    tmp.write_text(json.dumps({"url": running.control_url, "pid": os.getpid(), **proxy}) + "\n", encoding="utf-8")
    os.replace(tmp, path)


