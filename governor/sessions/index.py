"""Session ids in sorted order, for paging through them without sorting them all.

The control plane lists sessions a page at a time (`?limit=&after=`): the page's ids
come from a bisect on this list, O(log n + page), so a listing never walks every
session on the proxy's event loop (issue 20, finding 5: 3,000 sessions listed whole
held a proxied request for 30 s). Ids are added as sessions open; an id whose session
is gone from the runtime is skipped when read (`present`), not searched for.
"""

from __future__ import annotations

import bisect
from typing import Callable, Iterator

DEFAULT_PAGE = 100
MAX_PAGE = 1000


class SessionIndex:
    def __init__(self) -> None:
        self._ids: list[str] = []

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, session: str) -> None:
        at = bisect.bisect_left(self._ids, session)
        if at == len(self._ids) or self._ids[at] != session:
            self._ids.insert(at, session)

    def discard(self, session: str) -> None:
        at = bisect.bisect_left(self._ids, session)
        if at < len(self._ids) and self._ids[at] == session:
            del self._ids[at]

    def after(self, cursor: str | None, present: Callable[[str], bool]) -> Iterator[str]:
        """Ids sorted after `cursor` (from the first when None) that are still `present`."""
        start = 0 if cursor is None else bisect.bisect_right(self._ids, cursor)
        for i in range(start, len(self._ids)):
            session = self._ids[i] if i < len(self._ids) else None
            if session is not None and present(session):
                yield session

    def page(self, cursor: str | None, limit: int, present: Callable[[str], bool]) -> list[str]:
        out: list[str] = []
        if limit <= 0:
            return out
        for session in self.after(cursor, present):
            out.append(session)
            if len(out) >= limit:
                break
        return out
