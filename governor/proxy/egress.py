"""The agent's egress allow-list: the pinned passport's `permissions.network.allowed_hosts`
(ADL Core §4.4 host patterns: `*` within one DNS label, case-insensitive, a trailing dot
ignored). A request to a host outside it is refused before anything else is decided about
it, governed or not, and recorded in its session (governor.proxy.binding).

A passport that declares no `allowed_hosts` restricts no host (an empty list allows none).
The verdict per host is cached: the list is fixed for the process, and the per-request cost
is one dict lookup.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from governor.policy.patterns import Pattern, PatternError, compile_host

log = logging.getLogger("governor.proxy")

_CACHE_LIMIT = 4096  # distinct hosts remembered; past it the cache starts afresh


class EgressHosts:
    """Which hosts the agent may reach (`allows`)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.declared = tuple(patterns)
        self.patterns: tuple[Pattern, ...] = tuple(compile_host(p) for p in self.declared)
        self._verdicts: dict[str, bool] = {}

    def allows(self, host: str) -> bool:
        verdict = self._verdicts.get(host)
        if verdict is None:
            subject = host.strip("[]")  # an IPv6 literal as mitmproxy may give it
            verdict = any(pattern.matches(subject) for pattern in self.patterns)
            if len(self._verdicts) >= _CACHE_LIMIT:
                self._verdicts.clear()
            self._verdicts[host] = verdict
        return verdict

    def message(self, host: str) -> str:
        shown = ", ".join(self.declared[:8]) + (", ..." if len(self.declared) > 8 else "")
        return (f"host {host[:255]} is not in the passport's permissions.network.allowed_hosts "
                f"({shown or 'empty'}): the agent may not reach it")

    @classmethod
    def of_passport(cls, document: Any) -> "EgressHosts | None":
        """The passport's list (a pinned passport's document), or None when it declares none.
        Raises ValueError for a pattern outside the §4.4 language."""
        permissions = document.get("permissions") if isinstance(document, dict) else None
        network = permissions.get("network") if isinstance(permissions, dict) else None
        hosts = network.get("allowed_hosts") if isinstance(network, dict) else None
        if hosts is None:
            return None
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise ValueError("permissions.network.allowed_hosts must be a list of host patterns")
        try:
            return cls(hosts)
        except PatternError as exc:
            raise ValueError(f"permissions.network.allowed_hosts: {exc}") from None


__all__ = ["EgressHosts"]
