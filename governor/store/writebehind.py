"""The embedded default store: budget counters in memory, written behind to one SQLite file.

A governor process owns its state file (an exclusive lock on `<file>.lock`), so
nobody else changes the counters under it: they can live in memory, where a
reservation costs what it costs in MemoryStore, and reach the file in batches.

- Counters and outstanding reservations are authoritative in memory. A session's
  per_session counters are read from the file the first time the session is
  touched (or its state loaded), an agent's per_day buckets the first time the
  agent is; every outstanding reservation (and its session and agent) at open.
- Every counter change marks the counter dirty. A flusher thread, woken when the
  first change after a flush lands, waits `flush_interval` seconds, takes a
  consistent cut of the dirty counters and of the outstanding reservations under
  the store's lock, and writes it in one transaction, in SQLiteStore's schema
  (the file stays readable by `SQLiteStore`, and a file it wrote opens here).
  A crash of the process therefore loses at most the last interval of counter
  changes, and what the file holds is always a state the store was in.
- Session state and nonces are written through (not on the per-request path).
- Fail closed: when a flush fails, nothing is dropped (the cut is marked dirty
  again and retried every interval) and every counter operation raises
  StoreUnavailable until a flush succeeds.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from governor.policy.steps import CounterCharge, CounterKey
from governor.store.base import (
    DAY, CounterDamaged, Reservation, RollingWindow, StoreIntegrityError, StoreUnavailable, state_row, stored_count
)
from governor.store.memory import DayCounter, HeldReservation, MemoryStore
from governor.store.sqlite import AGGREGATE, SQLiteStore, StateFileLock, decode_totals, encode_totals

log = logging.getLogger("governor.store")

# seconds from the first change to the batch that writes it: the most counter change a
# crash can lose. Each batch costs the process ~0.5 ms of CPU and a hand-over of the GIL
# from the event loop, so it is not smaller.
FLUSH_INTERVAL = 0.25

# A batch is one transaction of a few statements, each writing all the rows of a table at
# once: the sqlite3 module releases the GIL around every statement it runs, and each time
# the flusher takes the GIL back from a busy event loop costs the loop a thread switch.
_SESSION_SET = (
    "INSERT INTO session_counters (session, persona, dimension, value) VALUES {rows} "
    "ON CONFLICT (session, persona, dimension) DO UPDATE SET value = excluded.value"
)
_SESSION_DELETE = "DELETE FROM session_counters WHERE (session, persona, dimension) IN (VALUES {rows})"
_DAY_DROP_BELOW = "DELETE FROM day_buckets WHERE agent = ? AND persona = ? AND dimension = ? AND bucket < ?"
_DAY_SET = (
    "INSERT INTO day_buckets (agent, persona, dimension, bucket, value) VALUES {rows} "
    "ON CONFLICT (agent, persona, dimension, bucket) DO UPDATE SET value = excluded.value"
)
_DAY_SET_TOTAL = (
    "INSERT INTO day_totals (agent, persona, dimension, total, oldest) VALUES {rows} "
    "ON CONFLICT (agent, persona, dimension) DO UPDATE SET total = excluded.total, oldest = excluded.oldest"
)
_HOLD = "INSERT OR REPLACE INTO reservations (id, agent, session, bucket, created, totals) VALUES {rows}"
_UNHOLD = "DELETE FROM reservations WHERE id IN (VALUES {rows})"


def _file_identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file at `path`, None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _write_rows(conn: sqlite3.Connection, statement: str, rows: list[tuple]) -> None:
    """Run `statement` with its VALUES list `{rows}` filled by `rows`.

    As many rows per statement as SQLite takes parameters, padded to a power of two by
    repeating the last row (every statement here writes a row twice as it writes it
    once): a few statement texts serve every batch, from the connection's cache.
    """
    if not rows:
        return
    most = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(rows[0])
    one = "(" + ", ".join("?" * len(rows[0])) + ")"
    for start in range(0, len(rows), most):
        batch = rows[start:start + most]
        count = min(most, max(8, 1 << (len(batch) - 1).bit_length()))
        batch += [batch[-1]] * (count - len(batch))
        conn.execute(statement.format(rows=", ".join([one] * count)), [v for row in batch for v in row])


_DayKey = tuple[str, str | None, str]  # (agent, persona, dimension)
_SessionKey = tuple[str, str | None, str]  # (session, persona, dimension)


@dataclass(slots=True)
class _Cut:
    """What one flush writes: the dirty counters' values and the reservations to add or drop."""

    dirty_sessions: set[_SessionKey]
    dirty_days: dict[_DayKey, set[int]]
    session_values: list[tuple[_SessionKey, float | None]] = field(default_factory=list)  # None: gone
    # (key, oldest, total, dirty buckets' values, whether rows below `oldest` may remain in the file)
    day_values: list[tuple[_DayKey, int, float, list[tuple[int, float]], bool]] = field(default_factory=list)
    held: dict[str, HeldReservation] = field(default_factory=dict)  # outstanding, not yet in the file
    dropped: set[str] = field(default_factory=set)  # in the file, no longer outstanding

    def __bool__(self) -> bool:
        return bool(self.session_values or self.day_values or self.held or self.dropped)

    def write(self, conn: sqlite3.Connection) -> None:
        _write_rows(conn, _SESSION_SET, [(s, p or AGGREGATE, d, v) for (s, p, d), v in self.session_values
                                         if v is not None])
        _write_rows(conn, _SESSION_DELETE, [(s, p or AGGREGATE, d) for (s, p, d), v in self.session_values
                                            if v is None])
        buckets, totals = [], []
        for (agent, persona, dimension), oldest, total, values, drop_below in self.day_values:
            key = (agent, persona or AGGREGATE, dimension)
            if drop_below:  # the window moved on since this counter was last written
                conn.execute(_DAY_DROP_BELOW, (*key, oldest))
            buckets += [(*key, bucket, value) for bucket, value in values]
            totals.append((*key, total, oldest))
        _write_rows(conn, _DAY_SET, buckets)
        _write_rows(conn, _DAY_SET_TOTAL, totals)
        _write_rows(conn, _HOLD, [(rid, h.agent, h.session, h.bucket, h.created, encode_totals(h.totals))
                                  for rid, h in self.held.items()])
        _write_rows(conn, _UNHOLD, [(rid,) for rid in self.dropped])


class WriteBehindStore(MemoryStore):
    """MemoryStore's counters, owned and persisted to the SQLite file at `path`.

    Thread-safe (one lock, MemoryStore's). Call `flush()` to write now (it raises
    StoreUnavailable when the file cannot be written) and `close()` at shutdown.
    """

    remote = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        window: RollingWindow = DAY,
        synchronous: str = "NORMAL",
        flush_interval: float = FLUSH_INTERVAL,
        busy_timeout: float = 5.0,
    ) -> None:
        if not (isinstance(flush_interval, (int, float)) and math.isfinite(flush_interval) and flush_interval > 0):
            raise ValueError(f"flush interval must be a positive number of seconds, got {flush_interval!r}")
        super().__init__(window)
        self.path = os.fspath(path)
        self.flush_interval = float(flush_interval)
        self._loaded_sessions: set[str] = set()
        self._loaded_agents: set[str] = set()
        self._dirty_sessions: set[_SessionKey] = set()
        self._dirty_days: dict[_DayKey, set[int]] = {}
        self._persisted: set[str] = set()  # reservation ids the file holds (flush lock)
        self._regrown: set[str] = set()  # reservations extended since the last cut (store lock)
        self._floors: dict[_DayKey, int] = {}  # the file has no bucket row below these (flush lock)
        self._pending = False  # something changed since the last cut (store lock)
        self._refusal: str | None = None  # why counter operations fail closed, if they do
        self._failure: str | None = None  # the last flush's error (flush lock)
        self._flush_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._owner = StateFileLock(self.path, exclusive=True)
        try:
            self._file = SQLiteStore(self.path, window=window, synchronous=synchronous, busy_timeout=busy_timeout,
                                     lock=False)  # we hold the exclusive lock
            try:
                self._load_reservations()
            except BaseException:
                self._file.close()
                raise
        except BaseException:
            self._owner.release()
            raise
        self._synchronous, self._busy_timeout = synchronous, busy_timeout
        self._identity = _file_identity(self.path)  # the file we write: deleted or replaced, we stop
        self._lost: str | None = None  # why counter operations fail closed after that, until acknowledged
        self._flusher = threading.Thread(target=self._flush_behind, name="governor-store-flush", daemon=True)
        self._flusher.start()

    # --- counters: MemoryStore's, once the session and the agent are loaded -------------
    def reserve(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        if session not in self._loaded_sessions or agent not in self._loaded_agents:
            self._load(agent, session)
        return super().reserve(agent, session, charges, now)

    def reserve_within(self, agent: str, session: str, keys: Sequence[CounterKey], charges: Sequence[CounterCharge],
                       now: float) -> tuple[dict[CounterKey, float], Reservation]:
        if session not in self._loaded_sessions or agent not in self._loaded_agents:
            self._load(agent, session)
        return super().reserve_within(agent, session, keys, charges, now)

    def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        super().commit(reservation_id, actual, now)
        self._poke()  # committed as reserved (actual None) changes no counter, but ends the reservation

    def _extended(self, reservation_id: str) -> None:
        self._regrown.add(reservation_id)  # the file's row is rewritten with the grown amounts

    def add(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> None:
        if session not in self._loaded_sessions or agent not in self._loaded_agents:
            self._load(agent, session)
        super().add(agent, session, charges, now)

    def snapshot(
        self, agent: str, session: str, now: float, keys: Sequence[CounterKey] | None = None
    ) -> dict[CounterKey, float]:
        if session not in self._loaded_sessions or agent not in self._loaded_agents:
            self._load(agent, session)
        return super().snapshot(agent, session, now, keys)

    def settle_reservations(self, before: float) -> int:
        settled = super().settle_reservations(before)
        if settled:
            self._poke()
        return settled

    def _changed(self, agent: str, session: str, keys: Iterable[CounterKey], bucket: int) -> None:
        # every reserve, settle and release comes here, with or without keys: the poke also
        # gets the reservation it made or ended written
        for scope, persona, dimension in keys:
            if scope == "per_session":
                self._dirty_sessions.add((session, persona, dimension))
            else:
                self._mark_day((agent, persona, dimension), bucket)
        self._poke()

    def _mark_day(self, key: _DayKey, bucket: int) -> None:
        buckets = self._dirty_days.get(key)
        if buckets is None:
            self._dirty_days[key] = {bucket}
        else:
            buckets.add(bucket)

    def _poke(self) -> None:
        """Wake the flusher on the first change since the last cut: set `_pending`, once.

        Also called after a change the counters do not show (a reservation held or
        dropped), outside the store lock: a stale read of `_pending` there can only
        mean a cut is due that will see the change anyway.
        """
        if not self._pending:
            self._pending = True
            self._wake.set()

    def _locked(self) -> threading.Lock:
        if self._lost is not None:
            raise StoreIntegrityError(self._lost)
        if self._refusal is not None:
            raise StoreUnavailable(self._refusal)
        return self._lock

    # --- loading from the file ---------------------------------------------------------
    def _load(self, agent: str, session: str) -> None:
        """Read the counters of a session and an agent not touched yet since open."""
        if session not in self._loaded_sessions:
            self._load_session(session)
        if agent not in self._loaded_agents:
            self._load_agent(agent)

    def _load_session(self, session: str) -> None:
        with self._file._read() as conn:
            rows = conn.execute(
                "SELECT persona, dimension, value FROM session_counters WHERE session = ?", (session,)
            ).fetchall()
        counters = {(p or None, d): stored_count(v, "session_counters", session=session, persona=p, dimension=d)
                    for p, d, v in rows}  # a value that is not a count: CounterDamaged, nothing loaded
        with self._lock:
            # loaded meanwhile (by another thread, or forgotten by delete_session): memory is ahead
            if session not in self._loaded_sessions:
                if counters:
                    self._session_counters[session] = counters
                self._loaded_sessions.add(session)

    def _load_agent(self, agent: str) -> None:
        with self._file._read() as conn:
            rows = conn.execute(
                "SELECT persona, dimension, bucket, value FROM day_buckets WHERE agent = ?", (agent,)
            ).fetchall()
        counters: dict[tuple[str | None, str], DayCounter] = {}
        for persona, dimension, bucket, value in rows:  # the total from the buckets, not from day_totals
            row = {"agent": agent, "persona": persona, "dimension": dimension, "bucket": bucket}
            if type(bucket) is not int:
                raise CounterDamaged(state_row("day_buckets", **row), str(bucket)[:64])
            value = stored_count(value, "day_buckets", **row)
            counter = counters.get((persona or None, dimension))
            if counter is None:
                counter = counters[(persona or None, dimension)] = DayCounter({}, 0.0, bucket)
            counter.add(bucket, value)
        with self._lock:
            if agent not in self._loaded_agents:
                if counters:
                    self._day_counters[agent] = counters
                self._loaded_agents.add(agent)

    def _load_reservations(self) -> None:
        with self._file._read() as conn:
            rows = conn.execute("SELECT id, agent, session, bucket, created, totals FROM reservations").fetchall()
        for rid, agent, session, bucket, created, totals in rows:
            try:
                self._load(agent, session)
            except CounterDamaged as exc:  # settled as reserved (it keeps counting); the steps that read it refused
                log.error("SQLite store %s: reservation %s settled as reserved at open: %s", self.path, rid, exc)
                with self._file._write() as conn:
                    conn.execute("DELETE FROM reservations WHERE id = ?", (rid,))
                continue
            self._held[rid] = HeldReservation(agent, session, bucket, created, decode_totals(totals))
            self._persisted.add(rid)

    # --- writing behind ----------------------------------------------------------------
    def flush(self) -> None:
        """Write every change made so far to the file now; StoreUnavailable when it cannot."""
        self._check_open()
        with self._flush_lock:
            self._flush()

    def _flush_behind(self) -> None:
        """The flusher thread: a batch `flush_interval` after the first change since the last one.

        While changes keep coming it wakes once an interval; idle, it sleeps until the next change.
        """
        while True:
            self._wake.clear()
            if not self._pending and not self._stopping.is_set():
                self._wake.wait()  # nothing changed since the last cut
            if self._stopping.wait(self.flush_interval):
                return  # close() writes the last batch
            with self._flush_lock:
                try:
                    self._flush()
                except StoreUnavailable:
                    pass  # logged by _flush; the cut is dirty again and retried after the interval

    def _flush(self) -> None:
        """One batch (flush lock held): a consistent cut under the store lock, one transaction."""
        self._check_file()
        with self._lock:
            cut = self._cut()
        try:
            if cut:
                with self._file._write() as conn:
                    cut.write(conn)
        except Exception as exc:  # sqlite3.Error, OSError, whatever it is: nothing is lost, fail closed
            cause = exc.__cause__ if isinstance(exc, StoreUnavailable) and exc.__cause__ else exc
            failure = (
                f"SQLite store {self.path}: cannot write the counters behind ({cause}); "
                "counter operations fail closed until a flush succeeds"
            )
            with self._lock:
                self._restore(cut)
                if not self._closed:
                    self._refusal = failure
            if self._failure is None:
                log.error("%s", failure)
            self._failure = failure
            raise StoreUnavailable(failure) from exc
        self._persisted |= cut.held.keys()
        self._persisted -= cut.dropped
        self._floors.update((key, oldest) for key, oldest, *_ in cut.day_values)
        if self._failure is not None:
            log.warning("SQLite store %s: counters are written behind again", self.path)
            self._failure = None
            with self._lock:
                if not self._closed:
                    self._refusal = None

    def _cut(self) -> _Cut:
        """The dirty counters' current values and the reservations to write (store lock held)."""
        cut = _Cut(self._dirty_sessions, self._dirty_days)
        self._dirty_sessions, self._dirty_days = set(), {}
        self._pending = False
        for key in cut.dirty_sessions:
            session, persona, dimension = key
            cut.session_values.append((key, self._session_counters.get(session, {}).get((persona, dimension))))
        for key, buckets in cut.dirty_days.items():
            agent, persona, dimension = key
            counter = self._day_counters.get(agent, {}).get((persona, dimension))
            if counter is not None:  # buckets the window dropped lie below `oldest`: deleted
                values = [(b, counter.buckets[b]) for b in buckets if b in counter.buckets]
                drop_below = key not in self._floors or counter.oldest > self._floors[key]
                cut.day_values.append((key, counter.oldest, counter.total, values, drop_below))
        # copies: `extend` replaces a reservation's amounts after the cut, the cut keeps its own
        cut.held = {rid: HeldReservation(h.agent, h.session, h.bucket, h.created, h.totals)
                    for rid in (self._held.keys() - self._persisted) | (self._regrown & self._held.keys())
                    for h in (self._held[rid],)}
        self._regrown = set()
        cut.dropped = self._persisted - self._held.keys()
        return cut

    def _restore(self, cut: _Cut) -> None:
        """Mark a cut that could not be written dirty again (store lock held)."""
        self._dirty_sessions |= cut.dirty_sessions
        self._regrown |= cut.held.keys()
        for key, buckets in cut.dirty_days.items():
            for bucket in buckets:
                self._mark_day(key, bucket)
        self._poke()

    # --- session state and nonces: written through ---------------------------------------
    def save_session(self, session: str, state: dict) -> None:
        self._check_open()
        self._file.save_session(session, state)

    def load_session(self, session: str) -> dict | None:
        """The session's state; also reads its counters (this runs off the event loop, at session open)."""
        self._check_open()
        if session not in self._loaded_sessions:
            self._load_session(session)
        return self._file.load_session(session)

    def list_sessions(self) -> list[str]:
        self._check_open()
        return self._file.list_sessions()

    def delete_session(self, session: str) -> bool:
        """Forget the session in memory and in the file at once: no flush runs in between."""
        with self._flush_lock, self._locked():
            had_state = self._file.delete_session(session)  # state, counters, reservations: one transaction
            for rid in [rid for rid, held in self._held.items() if held.session == session]:
                del self._held[rid]
                self._persisted.discard(rid)
            self._session_counters.pop(session, None)
            self._dirty_sessions = {key for key in self._dirty_sessions if key[0] != session}
            self._loaded_sessions.add(session)  # the file has nothing left to load
            return had_state

    def put_nonce(self, nonce: str, expires_at: float, now: float) -> None:
        self._check_open()
        self._file.put_nonce(nonce, expires_at, now)

    def take_nonce(self, nonce: str, now: float) -> bool:
        self._check_open()
        return self._file.take_nonce(nonce, now)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable(f"SQLite store {self.path} is closed")
        if self._lost is not None:
            raise StoreIntegrityError(self._lost)

    # --- integrity: the state file deleted or replaced under the running governor ---------
    def _check_file(self) -> None:
        """Before each batch (a stat, on the flusher's thread): the file at our path is still
        the one we opened. Otherwise the batches would go to a deleted file, or over another
        one, and a restart would find budgets reset: fail closed until acknowledged."""
        if self._lost is None:
            identity = _file_identity(self.path)
            if identity == self._identity:
                return
            lost = (f"SQLite store {self.path}: the state file was {'deleted' if identity is None else 'replaced'} "
                    "under the running governor; every step is refused until an operator acknowledges it "
                    "(POST /v1/store/acknowledge), which writes the counters this process holds to the file now "
                    "at that path (counters of sessions it had not loaded are lost)")
            with self._lock:
                self._lost = lost
            log.error("%s", lost)
        raise StoreIntegrityError(self._lost)

    @property
    def integrity(self) -> str | None:
        """Why the store fails closed after its file was deleted or replaced, or None."""
        return self._lost

    def acknowledge(self) -> dict:
        """An operator accepts that the state file was deleted or replaced: the file now at
        the path (created when missing) receives every counter and reservation held in memory."""
        with self._flush_lock:
            was = self._lost
            if was is None or self._closed:
                return {"acknowledged": False, "lost": None}
            fresh = SQLiteStore(self.path, window=self.window, synchronous=self._synchronous,
                                busy_timeout=self._busy_timeout, lock=False)
            with self._lock:
                old, self._file = self._file, fresh
                self._persisted, self._floors = set(), {}  # the new file holds none of it yet
                for session, subs in self._session_counters.items():
                    self._dirty_sessions.update((session, p, d) for p, d in subs)
                for agent, subs in self._day_counters.items():
                    for (p, d), counter in subs.items():
                        for bucket in counter.buckets:
                            self._mark_day((agent, p, d), bucket)
                self._identity = _file_identity(self.path)
                self._lost = None
            old.close()
            self._flush()
        log.warning("SQLite store %s: the loss of its file was acknowledged; the counters in memory were written "
                    "to the file now at that path", self.path)
        return {"acknowledged": True, "lost": was}

    # --- closing -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop the flusher, write the last batch, release the file. Idempotent.

        Raises StoreUnavailable (after closing) when the last batch cannot be written.
        """
        with self._close_lock:
            if self._closed:
                return
            with self._lock:
                self._closed = True
                self._refusal = f"SQLite store {self.path} is closed"
            self._stopping.set()
            self._wake.set()
            self._flusher.join()
            try:
                with self._flush_lock:
                    self._flush()
            except StoreUnavailable as exc:
                raise StoreUnavailable(f"{exc}; closed: the counter changes since the last flush are lost") from exc
            finally:
                self._file.close()
                self._owner.release()

    def __enter__(self) -> WriteBehindStore:
        return self

