"""Duplicate-identity detection (issue #32 item 7): two live governors with one identifier or
one signing key. Records of two governors under one `governor` id cannot be told apart (and a
verifier resolving the id gets one key: the other's records fail), and two transparency logs
under one origin and key fork each other's checkpoints.

Every governor on a shared store (Redis: the store's `announce`) says, each sweep and at most
every `interval` seconds, that it is live (an entry that expires after three intervals) with its
id, its key's fingerprint (base64url SHA-256 of the raw Ed25519 public key) and its
transparency log's origin (None when it keeps no log), and reads the others'. Reported: another
live instance with the same id and another key, or the same key and another id, or a log under
the same origin (two logs under one origin fork each other's checkpoints). Not reported: an
instance with the same id and key whose log has another origin (or that keeps none): one
governor's processes, as a gateway's replicas (docs/reference/shared-sessions.md: one id and
key, each pod's log its own origin) and the workers of `governor run --workers N` (each its
log's origin "/worker-K") are, whatever their store's session mode. Reported instances are
logged as an error once per instance, counted in `governor_duplicate_identities` (how many
there are now), and listed in `/readyz`'s `duplicate_identity` member (readiness itself does
not fail: which of the two is the impostor is the operator's call). A store without `announce`
(memory, SQLite: one process owns it) has no other governor to compare with.

Beside them, another live governor of the same agent whose sessions are in the store's other
mode (`?sessions=local` beside shared ones) is logged once as a warning, not counted: the modes
keep their sessions apart (store/redis.py LOCAL_SESSIONS), so a session name both use is two
sessions, each with its own step count and per-session budgets (per-day budgets are one).

Forks of one log are also caught by its witnesses (a witness refuses a checkpoint inconsistent
with one it cosigned: `governor_witness_refusals_total`, docs/transparency-log.md).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any, Callable

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from governor.common.canonical import sha256_b64url

log = logging.getLogger("governor.runtime")

DEFAULT_INTERVAL_SEC = 10.0


def key_fingerprint(public_key: Any) -> str:
    return sha256_b64url(public_key.public_bytes(Encoding.Raw, PublicFormat.Raw))


class DuplicateWatch:
    def __init__(self, store: Any, *, governor_id: str, public_key: Any, log_origin: str | None = None,
                 agent: str | None = None, metrics: Any = None, interval: float = DEFAULT_INTERVAL_SEC,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.metrics = metrics
        self.interval = interval
        self.clock = clock
        self.instance = uuid.uuid4().hex
        self.identity = {"instance": self.instance, "governor_id": governor_id, "key": key_fingerprint(public_key),
                         "log_origin": log_origin, "host": socket.gethostname()[:200], "pid": os.getpid(),
                         "started": clock(), "sessions": getattr(getattr(store, "options", None), "sessions", None),
                         "agent": agent}
        self.found: list[dict[str, Any]] = []
        self._reported: set[str] = set()
        self._other_modes: set[str] = set()  # instances of this agent in the other session mode, warned of
        self._last = -float("inf")

    def check(self) -> list[dict[str, Any]]:
        """Announce this instance, compare with the others (blocking: a store round trip)."""
        others = self.store.announce(self.instance, self.identity, 3 * self.interval)
        mine = self.identity
        found = []
        for other in others:
            if not isinstance(other, dict) or other.get("instance") == self.instance:
                continue
            self._other_mode(other)
            shared = [what for what in ("governor_id", "key", "log_origin")
                      if mine[what] is not None and other.get(what) == mine[what]]
            if shared == ["governor_id", "key"]:
                continue  # another process of this governor (a replica, a worker), its log its own
            if shared:
                found.append({"instance": other.get("instance"), "host": other.get("host"), "pid": other.get("pid"),
                              "governor_id": other.get("governor_id"), "shares": shared})
        self.found = found
        if self.metrics is not None:
            self.metrics.duplicate_identities.set(len(found))
        for duplicate in found:
            if duplicate["instance"] not in self._reported:
                self._reported.add(str(duplicate["instance"]))
                shares = duplicate["shares"]
                log.error("another live governor on this store shares this governor's %s (%s, instance %s on %s, "
                          "pid %s): %s", " and ".join(shares), duplicate["governor_id"], duplicate["instance"],
                          duplicate["host"], duplicate["pid"], _advice(shares))
        return found

    def _other_mode(self, other: dict[str, Any]) -> None:
        mine = self.identity
        mode = other.get("sessions")
        if (mine["agent"] is None or other.get("agent") != mine["agent"] or mode not in ("shared", "local")
                or mode == mine["sessions"] or str(other.get("instance")) in self._other_modes):
            return
        self._other_modes.add(str(other.get("instance")))
        log.warning("another live governor of agent %s on this store keeps its sessions %s (%s, instance %s on %s, "
                    "pid %s), this one %s: a session name both use is two sessions, each counting its own steps and "
                    "per-session budgets (per-day budgets are one); docs/reference/shared-sessions.md",
                    mine["agent"], other.get("sessions"), other.get("governor_id"), other.get("instance"),
                    other.get("host"), other.get("pid"), mine["sessions"])

    async def tick(self, call: Callable[..., Any]) -> None:
        """From the sweeper: a check when `interval` has passed (`call` runs it off the loop);
        a store that does not answer is the store's problem, reported elsewhere."""
        now = self.clock()
        if now - self._last < self.interval:
            return
        self._last = now
        try:
            await call(self.check)
        except Exception:
            log.debug("the duplicate-identity check could not reach the store", exc_info=True)

    def mark(self, ready: dict[str, Any]) -> None:
        if self.found:
            ready["duplicate_identity"] = self.found


def watch_duplicates(store: Any, **kwargs: Any) -> DuplicateWatch | None:
    """A watch when the store is shared across governors (it can `announce`), else None."""
    if not callable(getattr(store, "announce", None)):
        return None
    return DuplicateWatch(store, **kwargs)


def _advice(shares: list[str]) -> str:
    """What to change, for what two live governors share (the default log origin follows the id)."""
    if shares == ["governor_id", "key", "log_origin"]:  # processes of one governor, one log origin
        return "their transparency logs fork each other's checkpoints; give each process its own --log-origin"
    if "governor_id" in shares or "key" in shares:
        return ("their records and transparency logs cannot be told apart; give each its own --id and key"
                + (" and --log-origin" if "log_origin" in shares and "governor_id" not in shares else ""))
    return "their transparency logs fork each other's checkpoints under one origin; give each its own --log-origin"
