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
doubled since the last compaction: see `_snapshot` for what a compacted log keeps.

The book does no evidence work itself: a `recorder` (the runtime) journals locks, lifts
and the agent-named cap's refusal in the session's record and the audit journal.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from governor.evidence.record import remove_stale_temp_files, write_durably
from governor.policy import causes, steps
from governor.sessions.identity import Identity
from governor.sessions.shared_log import SharedLog, is_news

log = logging.getLogger("governor.sessions")

MODES = ("principal", "agent-named")
DEFAULT_MODES = ("auto", "on", "off")
DEFAULT_LOCK_CAUSES = (causes.ON_GOVERNOR_SESSION_INTEGRITY,)
DEFAULT_AGENT_SESSIONS_PER_DAY = 100

TOKEN_PREFIX = "adls_"
TOKEN_BYTES = 24  # 192 bits, 32 base64url characters
_TOKEN = re.compile(r"adls_[A-Za-z0-9_-]{32}")
MAX_NAME_LENGTH = 200  # agent-named sessions
MAX_LABEL_LENGTH = 200
DAY = 86400.0
ENDED_RETENTION = DAY  # how long a compacted book keeps a session after it ended
COMPACT_MIN_LINES = 10_000  # a running governor compacts its book past this many lines, then past double

ON_AGENT_LOCK = causes.ON_GOVERNOR_AGENT_LOCK  # the cause of lock and lift events (records: action halt / continue)
ON_SESSION_CAP = causes.ON_GOVERNOR_SESSION_CAP  # the agent-named cap's refusal (audit journal, action halt)

HOW_TO_OPEN = ("a principal opens a new session with `governor sessions open` (or POST /v1/sessions on the "
               "control plane) and gives the agent its token for the ADL-Session header")


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request names no session it may act in. It belongs to no session: it is
    counted and logged, and recorded nowhere but (`audit`) the governor's audit journal."""

    code: str
    message: str
    session: str | None = None
    cause: str | None = None
    lock: str | None = None
    audit: dict[str, Any] | None = None  # an event for the audit journal, recorded before the answer

    def governor_object(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"cause": self.cause, "action": "halt" if self.cause else "deny",
                               "refusal": self.code, "reason": self.message, "session": self.session}
        if self.lock:
            obj["lock"] = self.lock
        return obj


@dataclass(slots=True)
class Opened:
    """A session the book knows: opened by a principal, the default one, or agent-named."""

    id: str
    by: str  # "principal" | "default" | "agent"
    opened_at: float
    label: str | None = None
    nonce: str | None = None
    ended_at: float | None = None
    halt_cause: str | None = None
    token_sha256: str | None = None  # a principal's session: its token, hashed
    identity: Identity | None = None  # the persona and lineage its principal bound (governor.sessions.identity)

    def view(self) -> dict[str, Any]:
        return {"session": self.id, "opened_by": self.by, "opened_at": _iso(self.opened_at), "label": self.label,
                "nonce": self.nonce, "ended_at": _iso(self.ended_at) if self.ended_at else None,
                "halt_cause": self.halt_cause, "identity": self.identity.view() if self.identity else None}


@dataclass(slots=True)
class Lock:
    """The agent locked by a halt of `session` with `cause`, until a principal lifts it."""

    id: str
    session: str
    cause: str
    at: float
    lifted_by: str | None = None
    lifted_at: float | None = None

    @property
    def active(self) -> bool:
        return self.lifted_at is None

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "session": self.session, "cause": self.cause, "locked_at": _iso(self.at),
                "state": "locked" if self.active else "lifted", "lifted_by": self.lifted_by,
                "lifted_at": _iso(self.lifted_at) if self.lifted_at else None}


class Recorder(Protocol):
    """What records the book's enforcement (the runtime: session journals, audit journal)."""

    async def record_lock(self, lock: Lock, *, lifted: bool) -> None: ...

    async def record_audit(self, cause: str, action: str, detail: dict[str, Any]) -> None: ...


class SessionBookError(Exception):
    """The book's log cannot be read or written."""


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
        self._write_lock = threading.Lock()
        self.ended_retention = ended_retention
        self._lines = 0  # lines in the log
        self._compact_at = compact_min_lines  # the line count that triggers the next compaction
        self._compact_min_lines = compact_min_lines
        self._path = Path(data_dir) / "sessions" / "book.jsonl" if data_dir is not None else None
        # replicas sharing sessions: the log kept in the store too (governor.sessions.shared_log)
        self.shared = SharedLog(shared, self._replay_shared, clock) if shared is not None else None
        if self._path is not None:
            self._load()
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
            f"{_iso(lock.at)}, and every session is refused until a principal lifts lock {lock.id} "
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
            raise ValueError(f"lock {lock_id} was lifted by {lock.lifted_by} at {_iso(lock.lifted_at or 0)}")
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

    # --- persistence -------------------------------------------------------------------

    def _append(self, entry: dict[str, Any], *, sync: bool = False, share: bool = True) -> None:
        if self.shared is not None and share:
            self.shared.append(entry)
        if self._path is None:
            return
        line = (json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        with self._write_lock:
            if self._lines + 1 >= self._compact_at:
                # the snapshot, then this line: an op whose state is already in memory replays
                # idempotently, and one whose state is not yet (open) is kept by the line
                self._compact(extra=line)
                return
            try:
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)
                    if sync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise SessionBookError(f"cannot write {self._path}: {exc.strerror or exc}") from None
            self._lines += 1

    def _snapshot(self, now: float) -> tuple[list[dict[str, Any]], list[Opened]]:
        """The log's entries that rebuild what the book holds now, minus what it no longer
        needs: every session still open, every one that ended within `ended_retention`,
        every agent-named one opened within the rolling day (the cap counts them) and every
        default session (a configured default name is never reopened); the halted default
        session; every lock, with its lift. A principal's session dropped here has ended long
        ago: its token is refused as unknown instead of as ended. Returns the entries and the
        sessions left out."""
        entries: list[dict[str, Any]] = []
        dropped: list[Opened] = []
        for opened in self._by_id.values():
            keep = (opened.ended_at is None or opened.ended_at > now - self.ended_retention or opened.by == "default"
                    or (opened.by == "agent" and opened.opened_at > now - DAY))
            if not keep:
                dropped.append(opened)
                continue
            entry: dict[str, Any] = {"op": "open", "id": opened.id, "by": opened.by, "at": opened.opened_at}
            if opened.token_sha256 is not None:
                entry["token_sha256"] = opened.token_sha256
            entry.update({"identity": opened.identity.to_json()} if opened.identity is not None else {})
            for key in ("label", "nonce", "ended_at", "halt_cause"):
                if (value := getattr(opened, key)) is not None:
                    entry[key] = value
            entries.append(entry)
        if self.default_halted is not None:
            session, cause = self.default_halted
            entries.append({"op": "default_halted", "id": session, "cause": cause, "at": now})
        entries.extend({"op": "lock", **asdict(lock)} for lock in self.locks.values())
        return entries, dropped

    def _compact(self, extra: bytes = b"") -> None:
        """Rewrite the log as its snapshot (plus `extra`, a line being appended): a temp file,
        fsync'ed, renamed over the log. A crash leaves the old log or the new one, whole."""
        assert self._path is not None
        entries, dropped = self._snapshot(self.clock())
        lines = [json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n" for entry in entries]
        data = "".join(lines).encode() + extra
        try:
            write_durably(self._path, data)
        except OSError as exc:
            raise SessionBookError(f"cannot compact {self._path}: {exc.strerror or exc}") from None
        for opened in dropped:  # forgotten in memory too: the book stays as small as its log
            del self._by_id[opened.id]
            if opened.token_sha256 is not None:
                self._by_digest.pop(opened.token_sha256, None)
        if dropped:
            self._by_token = {token: entry for token, entry in self._by_token.items() if entry.id in self._by_id}
        before, self._lines = self._lines, len(lines) + (1 if extra else 0)
        self._compact_at = max(self._compact_min_lines, 2 * self._lines)
        log.info("%s compacted: %d lines to %d", self._path, before + (1 if extra else 0), self._lines)

    def _load(self) -> None:
        assert self._path is not None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(self._path.parent)  # a compaction a crash cut short: the old log stands
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise SessionBookError(f"cannot read {self._path}: {exc.strerror or exc}") from None
        now = self.clock()
        *complete, tail = data.split(b"\n")
        for number, raw in enumerate(complete, 1):
            if not raw.strip():
                continue
            try:
                self._replay(json.loads(raw), now)
            except (ValueError, KeyError, TypeError) as exc:
                raise SessionBookError(f"{self._path} line {number}: {exc}") from None
            self._lines += 1
        if tail:  # a last line without its newline: a write a crash cut short, set aside
            intact = len(data) - len(tail)
            aside = self._path.with_name(f"{self._path.name}.torn-{intact}")
            try:
                aside.write_bytes(tail)
                os.truncate(self._path, intact)
            except OSError as exc:
                raise SessionBookError(f"cannot set aside the torn last line of {self._path}: {exc}") from None
            log.warning("%s: torn last line (%d bytes) set aside in %s", self._path, len(tail), aside)
        if len(self._snapshot(now)[0]) < self._lines:  # something to drop or merge: start from a compact log
            self._compact()
        self._compact_at = max(self._compact_min_lines, 2 * self._lines)
        if self.metrics is not None:
            self.metrics.set_locks(len(self._active))

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


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def halted_reason(cause: str | None) -> str:
    """What the agent is told when its session is halted."""
    return (f"the session is halted ({cause or 'halted'}) and stays halted: nothing more runs in it; "
            + HOW_TO_OPEN)


# The causes a session can halt for (the §6 degradation causes and the governor's own), the
# only ones a lock can follow.
LOCKABLE_CAUSES = (steps.ON_BUDGET_EXHAUSTED, steps.ON_ITERATION_LIMIT, steps.ON_SUB_AGENT_DENIED,
                   steps.ON_DELEGATION_DENIED, steps.ON_OVERSIGHT_TIMEOUT, steps.ON_TOOL_ERROR, steps.ON_ANOMALY,
                   steps.ON_SESSION_INTEGRITY, steps.ON_GOVERNOR_ERROR, steps.ON_TOOL_DENIED,
                   steps.ON_OVERSIGHT_TRIGGER)


def parse_lock_causes(value: Any) -> tuple[str, ...]:
    """`--lock-on`: comma-separated causes (on_*), or "none"."""
    if isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    else:
        items = [v.strip() for v in str(value).split(",")]
    items = [v for v in items if v]
    if items == ["none"]:
        return ()
    for old in [v for v in items if v in causes.LEGACY_NAMES]:  # typed as before the on_governor_ namespace
        log.warning("lock cause %s is deprecated: it is now %s (docs/reference/deciding.md)", old,
                    causes.LEGACY_NAMES[old])
    items = [causes.canonical_cause(v) for v in items]
    bad = [v for v in items if v not in LOCKABLE_CAUSES]
    if bad:  # a typo would otherwise disable the lock it meant to set
        raise ValueError(f"lock causes must be causes a session halts for (or none), not {', '.join(bad)}; known: "
                         + ", ".join(LOCKABLE_CAUSES))
    return tuple(dict.fromkeys(items))


__all__ = ["SessionBook", "Refusal", "Opened", "Lock", "Recorder", "SessionBookError", "MODES", "DEFAULT_MODES",
           "ON_AGENT_LOCK", "ON_SESSION_CAP", "HOW_TO_OPEN", "halted_reason", "parse_lock_causes",
           "LOCKABLE_CAUSES"]
