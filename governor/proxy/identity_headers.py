"""Who a request acts as (governor.sessions.identity): the persona and delegation depth its
session's principal bound, not the agent's own `ADL-Persona` / `ADL-Delegation-Depth`
headers, which are read only under the operator's opt-in (`--agent-identity headers`: it
trusts the agent). Called by the binding addon once per request: one dict lookup when the
session binds nothing and the agent sends neither header.
"""

from __future__ import annotations

from typing import Any

from governor.proxy.fields import PERSONA_FIELD

DEPTH_FIELD = "adl-delegation-depth"
_DEPTH = DEPTH_FIELD.encode()
NOT_READ = ("ADL-Persona is not read on this governor: a principal binds the persona when it opens the session "
            "(POST /v1/sessions with \"persona\", or `governor sessions open --persona NAME`); the operator's "
            "--agent-identity headers trusts the agent's header instead")


def identity_of(book: Any, session: str, governing: dict[str, str], fields: tuple[tuple[bytes, bytes], ...],
                trust_headers: bool) -> tuple[str | None, tuple[tuple[bytes, bytes], ...], str | None, str | None]:
    """(the persona value the request acts as, the header fields the adapters read its
    delegation depth from, why it is refused or None, the session whose state counts its
    persona instance when that is its parent on this governor, else None)."""
    entry = book.get(session) if book is not None else None
    identity = entry.identity if entry is not None else None
    header = governing.get(PERSONA_FIELD) or None
    if identity is None:
        if trust_headers:
            return header, fields, None, None
        if DEPTH_FIELD in governing:  # the depth is the lineage's (none: the root), never the agent's word
            fields = tuple([f for f in fields if f[0].lower() != _DEPTH])
        return None, fields, NOT_READ if header is not None else None, None
    # bound by the principal: its persona and its lineage's depth, whatever the agent sends
    if DEPTH_FIELD in governing or identity.lineage:
        fields = tuple([f for f in fields if f[0].lower() != _DEPTH])
        if identity.lineage:
            fields += ((b"ADL-Delegation-Depth", str(identity.depth).encode()),)
    parent = identity.lineage[-1][0] if identity.lineage and identity.persona is not None else None
    host = parent if parent is not None and book.get(parent) is not None else None  # counted in its parent
    return identity.persona_value, fields, None, host
