"""Hostile documents shared by the parsing tests: alias bombs, deep nesting, odd keys."""

from __future__ import annotations

import base64


def alias_bomb(levels: int, fan: int = 10) -> bytes:
    """'Billion laughs' YAML: `fan`**`levels` expansions of one scalar in a few hundred bytes."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * fan) + "]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * fan) + "]")
    return ("\n".join(lines) + "\n").encode()


def nested_json(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def nested_yaml(depth: int) -> bytes:
    """Flow-style YAML nesting `depth` sequences inside a mapping (a passport must be a mapping)."""
    return b"a: " + b"[" * depth + b"1" + b"]" * depth + b"\n"


def header_value(document: bytes) -> str:
    """An ADL-Passport header carrying a document: base64url, no padding."""
    return base64.urlsafe_b64encode(document).rstrip(b"=").decode()
