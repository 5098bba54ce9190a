"""A delegated call carries its lineage (issue #32 item 6): an A2A request the governor
admitted as a Delegation goes upstream with `ADL-Delegation`, a delegation token
(governor.sessions.identity) whose lineage is the calling session's, from the root of its chain,
plus the calling session and the passport digest it acts under. The peer's principal opens the
delegated session with it (`POST /v1/sessions {"delegation": ...}` on a governor with this one's
key and id, or verifies it against this governor's did.json), so the chain and its depth cross
governors without trusting either agent's word. Only delegated calls pay for the signature.
"""

from __future__ import annotations

from typing import Any

from governor.sessions.identity import Identity, mint_delegation

DELEGATION_HEADER = "ADL-Delegation"


class Lineage:
    """Mints the token of a delegated call, over the session book and the runtime (its key, id,
    passport digest and clock)."""

    def __init__(self, runtime: Any, book: Any) -> None:
        self.runtime = runtime
        self.book = book

    def token_for(self, session: str) -> str | None:
        runtime = self.runtime
        key, limits = getattr(runtime, "key", None), getattr(runtime, "limits", None)
        if key is None or limits is None:
            return None  # a runtime that signs nothing (a scripted test runtime)
        entry = self.book.get(session) if self.book is not None else None
        identity = entry.identity if entry is not None and entry.identity is not None else Identity()
        lineage = identity.child_lineage(session, limits.passport_digest)
        return mint_delegation(key, runtime.governor_id, lineage, runtime.clock())
