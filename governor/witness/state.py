"""The witness's files under its data directory:

  witness.key     its Ed25519 private key (PKCS#8 PEM, mode 0600), made at the first start
  witness.vkey    its cosignature/v1 verifier key, in the signed-note vkey text form
  state.json      per log origin, the size, root and note it last cosigned

`state.json` is replaced whole (temp file, fsync, rename, directory fsync) before the
witness answers with a cosignature, so a restart, or a kill -9 right after an answer,
continues from every checkpoint it cosigned.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.evidence.record import write_durably
from governor.evidence.tlog.note import CosignatureSigner, NoteError, parse_vkey
from governor.evidence.tlog.witness import LogState

KEY_FILE = "witness.key"
VKEY_FILE = "witness.vkey"
STATE_FILE = "state.json"
DEFAULT_NAME = "governor-witness"


class WitnessSetupError(Exception):
    """The data directory cannot be used (the message says why)."""


def load_or_create_signer(directory: Path, name: str | None) -> CosignatureSigner:
    """The witness's signer; its key is made (mode 0600) and its vkey written on first start.
    The name is kept in witness.vkey: a later `name` that differs is refused, since it would
    change the key ID every verifier pinned."""
    directory.mkdir(parents=True, exist_ok=True)
    key_path, vkey_path = directory / KEY_FILE, directory / VKEY_FILE
    if not key_path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
            fh.flush()
            os.fsync(fh.fileno())
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as problem:
        raise WitnessSetupError(f"{key_path}: not a PEM private key ({problem})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise WitnessSetupError(f"{key_path}: not an Ed25519 key")
    kept = None
    if vkey_path.exists():
        try:
            kept = parse_vkey(vkey_path.read_text("utf-8"))
        except (NoteError, UnicodeDecodeError) as problem:
            raise WitnessSetupError(f"{vkey_path}: {problem}") from None
    if kept is not None and name is not None and name != kept.name:
        raise WitnessSetupError(f"this witness is named {kept.name!r} (in {vkey_path}), not {name!r}")
    try:
        signer = CosignatureSigner(name or (kept.name if kept else DEFAULT_NAME), key)
    except NoteError as problem:
        raise WitnessSetupError(f"the witness name: {problem}") from None
    if kept is not None and kept.public_key != signer.public_key:
        raise WitnessSetupError(f"{vkey_path} is not the key in {key_path}")
    if kept is None:
        write_durably(vkey_path, (signer.vkey() + "\n").encode("ascii"))
    return signer


class StateFile:
    """What the witness last cosigned, per origin, in one JSON file replaced atomically."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / STATE_FILE
        self.states: dict[str, LogState] = {}
        if self.path.exists():
            self.states = self._read()

    def _read(self) -> dict[str, LogState]:
        try:
            document = json.loads(self.path.read_bytes())
            return {
                origin: LogState(int(entry["size"]), base64.b64decode(entry["root"], validate=True),
                                 base64.b64decode(entry["checkpoint"], validate=True))
                for origin, entry in document["logs"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as problem:
            # never start from nothing: that would let a log roll back past what was cosigned
            raise WitnessSetupError(f"{self.path} is unreadable ({problem}); restore it, do not delete it") from None

    def get(self, origin: str) -> LogState | None:
        return self.states.get(origin)

    def put(self, origin: str, state: LogState) -> None:
        states = {**self.states, origin: state}
        document = {"logs": {
            o: {"size": s.size, "root": base64.b64encode(s.root).decode("ascii"),
                "checkpoint": base64.b64encode(s.note).decode("ascii")}
            for o, s in sorted(states.items())
        }}
        write_durably(self.path, json.dumps(document, indent=1).encode("utf-8"))
        self.states = states  # only once it is on disk
