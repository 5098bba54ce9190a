"""The session book: who may name a session, and the locks that stop every session.

A session is opened by a principal (the orchestrator, the platform, the developer at the
terminal), never by the governed agent: `open` issues an unguessable token that the
agent presents in `ADL-Session`. Per request the proxy asks `resolve` which session a
request belongs to: a dict hit for a known token, and a `Refusal` (never a new session)
for a malformed, unknown or ended token. So a request can act only in a session whose
token it holds: it cannot open one, escape a halted one or halt another.

Token-less traffic goes to the default session (`default`: "auto", "on", "off"). Agent-
named sessions (any `ADL-Session` value opens a session, the governor's old behaviour)
exist only as the explicit `mode="agent-named"`, which trusts the agent and is capped:
at most `agent_sessions_per_day` names opened per rolling day.

A halt whose cause is in `lock_causes` locks the agent: every request is refused until
a principal lifts the lock (`lift`). What the book decides is persisted in an append-
only log (`<data-dir>/sessions/book.jsonl`; tokens only by their SHA-256), so tokens,
ended sessions, the halted default session and locks survive a restart. The log is
compacted (rewritten whole, then renamed over the old one) at start-up and whenever it has
doubled since the last compaction: see `governor.sessions.book_log.snapshot` for what a compacted log keeps.

The book does no evidence work itself: a `recorder` (the runtime) journals locks, lifts
and the agent-named cap's refusal in the session's record and the audit journal.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import re
import secrets
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable

from governor.sessions.book_log import COMPACT_MIN_LINES, ENDED_RETENTION, BookLog, Snapshot, snapshot
from governor.sessions.entries import (DAY, HOW_TO_OPEN, ON_AGENT_LOCK, ON_SESSION_CAP, Lock, Opened, Recorder,
                                       Refusal, SessionBookError, halted_reason, iso)
from governor.sessions.identity import Identity
from governor.sessions.lock_causes import DEFAULT_LOCK_CAUSES, LOCKABLE_CAUSES, parse_lock_causes
from governor.sessions.shared_log import SharedLog, is_news

log = logging.getLogger("governor.sessions")

MODES = ("principal", "agent-named")
DEFAULT_MODES = ("auto", "on", "off")
DEFAULT_AGENT_SESSIONS_PER_DAY = 100

TOKEN_PREFIX = "adls_"
TOKEN_BYTES = 24  # 192 bits, 32 base64url characters
_TOKEN = re.compile(r"adls_[A-Za-z0-9_-]{32}")
MAX_NAME_LENGTH = 200  # agent-named sessions
MAX_LABEL_LENGTH = 200


class SessionBook:
    def __init__(
        self,
        data_dir: Path | str | None,
        *,
        mode: str = "principal",
        default: str = "auto",
        default_name: str | None = None,
        agent_sessions_per_day: int = DEFAULT_AGENT_SESSIONS_PER_DAY,
        lock_causes: Iterable[str] = DEFAULT_LOCK_CAUSES,
        clock: Callable[[], float] = time.time,
        metrics: Any = None,
        ended_retention: float = ENDED_RETENTION,
        compact_min_lines: int = COMPACT_MIN_LINES,
        shared: Any = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"sessions mode must be one of {', '.join(MODES)}, not {mode!r}")
        if default not in DEFAULT_MODES:
            raise ValueError(f"default session must be one of {', '.join(DEFAULT_MODES)}, not {default!r}")
        if agent_sessions_per_day < 0:
            raise ValueError("agent_sessions_per_day must be >= 0")
        self.mode = mode
        self.default = default
        self.default_name = default_name
        self.agent_sessions_per_day = agent_sessions_per_day
        self.lock_causes = frozenset(lock_causes)
        self.clock = clock
        self.metrics = metrics
        self.recorder: Recorder | None = None
        self._by_token: dict[str, Opened] = {}  # tokens presented to this process (a dict hit per request)
        self._by_digest: dict[str, Opened] = {}  # every token issued, by its SHA-256
        self._by_id: dict[str, Opened] = {}
        self._agent_openings: collections.deque[float] = collections.deque()  # rolling day, agent-named
        self._cap_recorded = False  # the refusal that hit the cap is recorded once per saturation
        self.principal_opened = False  # a principal ever opened a session here (default "auto")
        self.default_id: str | None = None
        self._default_generation = 0
        self.default_halted: tuple[str, str] | None = None  # (session, cause): refused until a principal ends it
        self.locks: dict[str, Lock] = {}
        self._active: dict[str, Lock] = {}
        self.refusals: collections.Counter[str] = collections.Counter()
        self.ended_retention = ended_retention
        self._log = BookLog(Path(data_dir) / "sessions" / "book.jsonl", clock=clock, compact_min_lines=compact_min_lines,
                            snapshot=self._snapshot, forget=self._forget) if data_dir is not None else None
        # replicas sharing sessions: the log kept in the store too (governor.sessions.shared_log)
        self.shared = SharedLog(shared, self._replay_shared, clock) if shared is not None else None
        if self._log is not None and self._log.load(self._replay) and self.metrics is not None:
            self.metrics.set_locks(len(self._active))
        if self.shared is not None:
            self.shared.catch_up(force=True)

    # --- per request -------------------------------------------------------------------

    def resolve(self, value: str | None) -> str | Refusal:
        """The session a request naming `value` (its ADL-Session, None when absent) acts in,
        or why it may not act. Opens nothing but the default session or, in agent-named
        mode, a capped new name."""
        if self.shared is not None:  # other replicas' opens, ends, locks and lifts (at most every REFRESH_SEC)
            self.shared.catch_up()
        if self._active:
            return self._refused(self._locked())
        if not value:
            return self._default_session()
        entry = self._by_token.get(value)
        if entry is None:
            entry = self._lookup(value)
            if type(entry) is not Opened:
                return entry  # type: ignore[return-value]
        if entry.ended_at is not None:
            return self._refused(self._ended(entry))
        return entry.id

    def _lookup(self, value: str) -> Opened | str | Refusal:
        if _TOKEN.fullmatch(value):
            entry = self._by_digest.get(_digest(value))
            if entry is None and self.shared is not None and self.shared.catch_up(force=True):
                entry = self._by_digest.get(_digest(value))  # opened on another replica just now
            if entry is None:
                return self._refused(Refusal(
                    "session_unknown", "this governor never opened a session with that token (ADL-Session); "
                    + HOW_TO_OPEN))
            self._by_token[value] = entry
            return entry
        if self.mode != "agent-named":
            return self._refused(Refusal(
                "session_token_malformed", "ADL-Session must carry a session token issued by this governor "
                f"({TOKEN_PREFIX}... ); sessions are not named by the agent here: " + HOW_TO_OPEN))
        return self._agent_named(value)

    def _agent_named(self, name: str) -> Opened | Refusal:
        entry = self._by_id.get(name)
        if entry is not None:
            if entry.by == "agent":
                self._by_token[name] = entry
            return entry if entry.by == "agent" else self._refused(Refusal(
                "session_name_taken", f"session {name!r} was not opened by an agent-named request"))
        if len(name) > MAX_NAME_LENGTH or not name.isprintable():
            return self._refused(Refusal(
                "session_name_malformed", f"ADL-Session must be printable text of at most {MAX_NAME_LENGTH} characters"))
        now = self.clock()
        openings = self._agent_openings
        while openings and openings[0] <= now - DAY:
            openings.popleft()
        if len(openings) >= self.agent_sessions_per_day:
            audit = None
            if not self._cap_recorded:  # the refusal that hit the cap; the rest are counted and logged
                self._cap_recorded = True
                audit = {"refused_session": name[:MAX_NAME_LENGTH], "limit": self.agent_sessions_per_day,
                         "window_seconds": int(DAY), "opened_in_window": len(openings),
                         "reason": "agent-named sessions per rolling day exhausted"}
            return self._refused(Refusal(
                "session_cap", f"this agent opened {len(openings)} sessions in the last 24 hours, the most it may "
                f"name itself (agent-named sessions, {self.agent_sessions_per_day} a day); " + HOW_TO_OPEN,
                cause=ON_SESSION_CAP, audit=audit))
        self._cap_recorded = False
        openings.append(now)
        entry = Opened(name, "agent", now)
        self._by_id[name] = self._by_token[name] = entry
        self._append({"op": "open", "id": name, "by": "agent", "at": now})
        if self.metrics is not None:
            self.metrics.session_opened("agent")
        return entry

    def _default_session(self) -> str | Refusal:
        if self.default == "off":
            return self._refused(Refusal(
                "session_token_required", "this governor refuses requests without a session token "
                "(default session: off); " + HOW_TO_OPEN))
        if self.default == "auto" and self.principal_opened:
            return self._refused(Refusal(
                "session_token_required", "a principal opened a session on this governor's data directory, so "
                "requests without a session token are refused from then on (--default-session auto); send a "
                "session's token in the ADL-Session header: " + HOW_TO_OPEN + "; to let token-less requests use a "
                "default session again, restart the governor with --default-session on"))
        if self.default_halted is not None:
            session, cause = self.default_halted
            return self._refused(Refusal(
                "default_session_halted", f"the default session {session} is halted ({cause}) and stays halted: "
                f"{HOW_TO_OPEN}, or ends the halted one (`governor sessions end {session}`), after which requests "
                "without a token start a new default session", session=session, cause=cause))
        if self.default_id is None:
            self.default_id = self._next_default()
        return self.default_id

    def _next_default(self) -> str:
        self._default_generation += 1
        n = self._default_generation
        if self.default_name:
            base = self.default_name
        else:
            base = "default-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        name = base if n == 1 and self.default_name else f"{base}-{n}"
        while name in self._by_id:  # a name used before (an earlier process) is never reopened
            self._default_generation += 1
            name = f"{base}-{self._default_generation}"
        entry = Opened(name, "default", self.clock())
        self._by_id[name] = entry
        self._append({"op": "open", "id": name, "by": "default", "at": entry.opened_at})
        return name

    def _locked(self) -> Refusal:
        lock = next(iter(self._active.values()))
        return Refusal(
            "agent_locked", f"the agent is locked: session {lock.session} halted with {lock.cause} at "
            f"{iso(lock.at)}, and every session is refused until a principal lifts lock {lock.id} "
            f"(`governor locks lift {lock.id} --by NAME`, or POST /v1/locks/{lock.id}/lift)",
            cause=ON_AGENT_LOCK, lock=lock.id)

    def _ended(self, entry: Opened) -> Refusal:
        how = f"halted ({entry.halt_cause})" if entry.halt_cause else "ended"
        return Refusal("session_ended", f"session {entry.id} has {'ended, ' if entry.halt_cause else ''}{how} and "
                       f"takes no more requests; {HOW_TO_OPEN}", session=entry.id, cause=entry.halt_cause)

    def _refused(self, refusal: Refusal) -> Refusal:
        self.refusals[refusal.code] += 1
        if self.metrics is not None:
            self.metrics.session_refused(refusal.code)
        return refusal

    async def record_refusal(self, refusal: Refusal) -> None:
        """Journal a refusal's audit event (the agent-named cap) before it is answered."""
        if refusal.audit is not None and self.recorder is not None:
            await self.recorder.record_audit(refusal.cause or ON_SESSION_CAP, "halt", refusal.audit)

    # --- principals (control plane) ----------------------------------------------------

    def open(self, *, label: str | None = None, nonce: str | None = None,
             identity: Identity | None = None) -> tuple[Opened, str]:
        """A new session for a principal: its entry and its token (shown once, kept only hashed)."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
        now = self.clock()
        session = f"session-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}-{secrets.token_hex(4)}"
        digest = _digest(token)
        entry = Opened(session, "principal", now, label=label, nonce=nonce, token_sha256=digest, identity=identity)
        self._append({"op": "open", "id": session, "by": "principal", "at": now, "token_sha256": digest, "label": label,
                      "nonce": nonce, **({"identity": identity.to_json()} if identity else {})}, sync=True)
        self._by_id[session] = self._by_digest[digest] = self._by_token[token] = entry
        self.principal_opened = True
        if self.metrics is not None:
            self.metrics.session_opened("principal")
        return entry, token

    def get(self, session: str) -> Opened | None:
        return self._by_id.get(session)

    def entries(self) -> list[Opened]:
        return list(self._by_id.values())

    def nonce(self, session: str) -> str | None:
        entry = self._by_id.get(session)
        return entry.nonce if entry is not None else None

    def ended(self, session: str, halt_cause: str | None) -> None:
        """The runtime ended `session` (halted with `halt_cause`, or not): its token is refused
        from now on; a halted default session keeps token-less traffic refused."""
        now = self.clock()
        entry = self._by_id.get(session)
        if entry is not None and entry.ended_at is None:
            entry.ended_at, entry.halt_cause = now, halt_cause
            self._append({"op": "end", "id": session, "at": now, "halt_cause": halt_cause})
        if session == self.default_id:
            self.default_id = None
            if halt_cause is not None:
                self.default_halted = (session, halt_cause)
                self._append({"op": "default_halted", "id": session, "cause": halt_cause, "at": now}, sync=True)

    def ended_by_principal(self, session: str) -> None:
        """A principal ended `session` through the control plane: a halted default session
        it names is released, so token-less traffic starts a new default session."""
        if self.default_halted is not None and self.default_halted[0] == session:
            self.default_halted = None
            self._append({"op": "default_released", "id": session, "at": self.clock()}, sync=True)

    # --- locks -------------------------------------------------------------------------

    @property
    def locked(self) -> bool:
        return bool(self._active)

    def holds_lock(self, session: str) -> bool:
        return any(lock.session == session for lock in self._active.values())

    def lock(self, session: str, cause: str | None) -> Lock | None:
        """Lock the agent for a halt of `session` with `cause`, when the cause is a locking
        one and the session holds no lock yet. Takes effect at once (the next request is
        refused); the caller records it."""
        if cause not in self.lock_causes or self.holds_lock(session):
            return None
        lock = Lock(f"lock-{secrets.token_hex(6)}", session, cause, self.clock())
        self.locks[lock.id] = self._active[lock.id] = lock
        self._append({"op": "lock", **asdict(lock)}, sync=True)
        log.warning("governor: agent LOCKED by %s in session %s (lock %s): every session is refused until a "
                    "principal lifts it: governor locks lift %s --by NAME", cause, session, lock.id, lock.id)
        if self.metrics is not None:
            self.metrics.set_locks(len(self._active))
        return lock

    async def lift(self, lock_id: str, by: str) -> Lock:
        """A principal lifts a lock: recorded first (the session's record and the audit
        journal), then lifted. KeyError: no such lock; ValueError: already lifted."""
        lock = self.locks[lock_id]
        if not lock.active:
            raise ValueError(f"lock {lock_id} was lifted by {lock.lifted_by} at {iso(lock.lifted_at or 0)}")
        lifted = Lock(lock.id, lock.session, lock.cause, lock.at, by, self.clock())
        if self.recorder is not None:
            await self.recorder.record_lock(lifted, lifted=True)
        if not lock.active:  # lifted by someone else meanwhile
            raise ValueError(f"lock {lock_id} was lifted by {lock.lifted_by}")
        lock.lifted_by, lock.lifted_at = by, lifted.lifted_at
        self._active.pop(lock_id, None)
        self._append({"op": "lift", "id": lock_id, "by": by, "at": lock.lifted_at}, sync=True)
        log.warning("governor: lock %s lifted by %s", lock_id, by)
        if self.metrics is not None:
            self.metrics.set_locks(len(self._active))
        return lock

    # --- persistence (governor.sessions.book_log) -------------------------------------

    def _append(self, entry: dict[str, Any], *, sync: bool = False, share: bool = True) -> None:
        if self.shared is not None and share:
            self.shared.append(entry)
        if self._log is not None:
            self._log.append(entry, sync=sync)

    def _snapshot(self, now: float) -> Snapshot:
        return snapshot(self._by_id.values(), self.default_halted, self.locks.values(), now, self.ended_retention)

    def _forget(self, dropped: list[Opened]) -> None:
        """Sessions a compaction left out of the log: forgotten in memory too."""
        for opened in dropped:
            del self._by_id[opened.id]
            if opened.token_sha256 is not None:
                self._by_digest.pop(opened.token_sha256, None)
        if dropped:
            self._by_token = {token: entry for token, entry in self._by_token.items() if entry.id in self._by_id}

    def _replay(self, entry: dict[str, Any], now: float) -> None:
        op = entry["op"]
        if op == "open":
            opened = Opened(entry["id"], entry["by"], float(entry["at"]), entry.get("label"), entry.get("nonce"),
                            token_sha256=entry.get("token_sha256"), identity=Identity.from_json(entry.get("identity")))
            if entry.get("ended_at") is not None:  # a compacted log's ended session
                opened.ended_at, opened.halt_cause = float(entry["ended_at"]), entry.get("halt_cause")
            self._by_id[opened.id] = opened
            if opened.by == "principal":
                self._by_digest[entry["token_sha256"]] = opened
                self.principal_opened = True
            elif opened.by == "agent" and opened.opened_at > now - DAY:
                self._agent_openings.append(opened.opened_at)
            elif opened.by == "default":  # an earlier process's default session is not reused
                opened.ended_at = opened.ended_at or opened.opened_at
        elif op == "end":
            opened = self._by_id[entry["id"]]
            opened.ended_at, opened.halt_cause = float(entry["at"]), entry.get("halt_cause")
        elif op == "default_halted":
            self.default_halted = (entry["id"], entry["cause"])
        elif op == "default_released":
            if self.default_halted is not None and self.default_halted[0] == entry["id"]:
                self.default_halted = None
        elif op == "lock":
            lock = Lock(entry["id"], entry["session"], entry["cause"], float(entry["at"]),
                        entry.get("lifted_by"), entry.get("lifted_at"))
            self.locks[lock.id] = lock
            if lock.active:
                self._active[lock.id] = lock
        elif op == "lift":
            lock = self.locks[entry["id"]]
            lock.lifted_by, lock.lifted_at = entry["by"], float(entry["at"])
            self._active.pop(lock.id, None)
        else:
            raise ValueError(f"unknown op {op!r}")

    def _replay_shared(self, entry: dict[str, Any]) -> None:
        """Another replica's entry (its open, end, lock or lift), learnt here and kept in this
        replica's log too; one this book holds already (or knows nothing of) changes nothing."""
        if not is_news(entry, self._by_id, self.locks):
            return
        self._replay(entry, self.clock())
        self._append(entry, share=False)
        if self.metrics is not None:
            self.metrics.set_locks(len(self._active))

    def locks_view(self) -> list[dict[str, Any]]:
        return [lock.view() for lock in self.locks.values()]


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# Also importable from here, where other modules imported them before the book was split
# (their homes: entries.py, lock_causes.py, book_log.py).
__all__ = ["SessionBook", "Refusal", "Opened", "Lock", "Recorder", "SessionBookError", "MODES", "DEFAULT_MODES",
           "ON_AGENT_LOCK", "ON_SESSION_CAP", "HOW_TO_OPEN", "halted_reason", "parse_lock_causes",
           "LOCKABLE_CAUSES"]
