"""`governor run`'s transparency-log options (docs/transparency-log.md): their help, and how
their values (flags, environment, config file) become the Settings' log fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.cli import UsageError
from governor.cli.option_values import seconds, whole_number
from governor.evidence.tlog.note import NoteError, parse_vkey

LOG_OPTIONS: dict[str, tuple[str, str]] = {
    "log": ("GOVERNOR_LOG", "on (default) or off: append every final record's entry to the transparency log in "
            "DATA_DIR/log, served at /log/ (docs/transparency-log.md)"),
    "log_origin": ("GOVERNOR_LOG_ORIGIN", "the log's origin line and key name (default: derived from the governor's "
                   "id, e.g. localhost/governor/log); each worker of --workers N appends /worker-K"),
    "log_checkpoint_entries": ("GOVERNOR_LOG_CHECKPOINT_ENTRIES", "sign a new checkpoint at least every this many "
                               "entries (default 256)"),
    "log_checkpoint_seconds": ("GOVERNOR_LOG_CHECKPOINT_SECONDS", "and at least every this many seconds while "
                               "entries wait (default 10)"),
    "log_access": ("GOVERNOR_LOG_ACCESS", "open (default: anyone may read /log/) or token (/log/ needs the "
                   "control token, like the /v1 reads)"),
    "witness": ("GOVERNOR_WITNESSES", "URL=VKEYFILE: a C2SP tlog-witness that cosigns the log's checkpoints (its "
                "vkey in the file); repeat the option, or comma-separate in the variable. Proofs are served only "
                "at checkpoints the quorum cosigned (docs/transparency-log.md)"),
    "witness_quorum": ("GOVERNOR_WITNESS_QUORUM", "how many of the witnesses must cosign a proof's checkpoint "
                       "(default: all)"),
    "witness_wait": ("GOVERNOR_WITNESS_WAIT", "a proof asked for waits at most this many seconds for the "
                     "witnesses' quorum, then answers 503 not_witnessed (default 10)"),
}


def seconds_value(value: Any, what: str) -> float:
    return seconds(value, what)  # positive and finite (governor/cli/option_values.py)


def apply_log_settings(settings: Any, value: Any) -> None:
    """The transparency log's options (docs/transparency-log.md)."""
    def switch(name: str) -> bool | None:
        given = value(name)
        if given is None or isinstance(given, bool):
            return given
        word = str(given).strip().lower()
        if word not in ("on", "off", "yes", "no", "true", "false"):
            raise UsageError(f"--{name.replace('_', '-')}: expected on or off, got {given!r}")
        return word in ("on", "yes", "true")

    if (enabled := switch("log")) is not None:
        settings.log = enabled
    if (access := value("log_access")) is not None:
        if str(access).strip().lower() not in ("open", "token"):
            raise UsageError(f"--log-access: expected open or token, got {access!r}")
        settings.log_require_token = str(access).strip().lower() == "token"
    if (origin := value("log_origin")) is not None:
        origin = str(origin)
        if not origin or any(c.isspace() or c == "+" or ord(c) < 0x21 for c in origin):
            raise UsageError(f"--log-origin: a name without spaces or plus signs, got {origin!r}")
        settings.log_origin = origin
    if (entries := value("log_checkpoint_entries")) is not None:
        settings.log_checkpoint_entries = whole_number(entries, "--log-checkpoint-entries", least=1)
    if (seconds := value("log_checkpoint_seconds")) is not None:
        settings.log_checkpoint_seconds = seconds_value(seconds, "--log-checkpoint-seconds")
    apply_witness_settings(settings, value)


def apply_witness_settings(settings: Any, value: Any) -> None:
    """--witness URL=VKEYFILE (repeatable), --witness-quorum, --witness-wait."""
    given = value("witness")
    if given is not None:
        items = given if isinstance(given, list) else [given]
        pairs = [piece.strip() for item in items for piece in str(item).split(",") if piece.strip()]
        witnesses = []
        for pair in pairs:
            url, sep, key_file = pair.partition("=")
            if not sep or not url.startswith(("http://", "https://")) or not key_file:
                raise UsageError(f"--witness: expected URL=VKEYFILE (an http(s) URL), got {pair!r}")
            try:
                vkey = Path(key_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"--witness {url}: cannot read the vkey file {key_file}: {exc}") from None
            try:
                parse_vkey(vkey)
            except NoteError as exc:
                raise UsageError(f"--witness {url}: {key_file} holds no witness vkey: {exc}") from None
            witnesses.append((url, vkey))
        settings.witnesses = tuple(witnesses)
    if (quorum := value("witness_quorum")) is not None:
        if whole_number(quorum, "--witness-quorum", least=1) > len(settings.witnesses):
            raise UsageError(f"--witness-quorum {quorum}: more than the {len(settings.witnesses)} witnesses given")
        settings.witness_quorum = int(quorum)
    if (wait := value("witness_wait")) is not None:
        settings.witness_wait = seconds_value(wait, "--witness-wait")
