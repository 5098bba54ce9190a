"""The embedded default store: one SQLite file, safe across threads and processes.

Every write is one `BEGIN IMMEDIATE` transaction, so a reservation's cap checks
and increments happen under SQLite's single writer lock: concurrent reserves
from threads (one connection each) or from processes sharing the file are
serialized, and none can slip past a cap. Readers (snapshots) run alongside
thanks to WAL.

Durability: `synchronous=NORMAL` by default. In WAL mode that survives any
crash of the process (counters, reservations and sessions are intact when the
store is reopened); an operating-system crash or power cut may lose the last
transactions before the WAL checkpoint, never corrupt the file. Pass
`synchronous="FULL"` to fsync every commit and lose nothing even then, at the
cost of one fsync per reservation.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import uuid
from contextlib import contextmanager
from typing import Iterator, Sequence

import orjson

from governor.policy.steps import CounterCharge, CounterKey
from governor.store.base import (
    DAY,
    CounterDamaged,
    Reservation,
    RollingWindow,
    StoreError,
    StoreUnavailable,
    UnknownReservation,
    check_keys,
    encode_state,
    first_overshoot,
    reserve_within,
    state_row,
    stored_count,
    totals_by_key,
)

SCHEMA_VERSION = 1

# persona None (the parent's aggregate) is stored as '' so it can sit in a primary key.
AGGREGATE = ""

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE session_counters (
    session TEXT NOT NULL, persona TEXT NOT NULL, dimension TEXT NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (session, persona, dimension)
) WITHOUT ROWID;
CREATE TABLE day_buckets (
    agent TEXT NOT NULL, persona TEXT NOT NULL, dimension TEXT NOT NULL, bucket INTEGER NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (agent, persona, dimension, bucket)
) WITHOUT ROWID;
-- per per_day counter: the sum of its bucket rows, and a bound below which it has none
CREATE TABLE day_totals (
    agent TEXT NOT NULL, persona TEXT NOT NULL, dimension TEXT NOT NULL, total REAL NOT NULL,
    oldest INTEGER NOT NULL,
    PRIMARY KEY (agent, persona, dimension)
) WITHOUT ROWID;
CREATE TABLE reservations (
    id TEXT PRIMARY KEY, agent TEXT NOT NULL, session TEXT NOT NULL, bucket INTEGER NOT NULL,
    created REAL NOT NULL,
    totals TEXT NOT NULL  -- JSON [[scope, persona, dimension, amount], ...]
);
CREATE INDEX reservations_by_session ON reservations (session);
CREATE INDEX reservations_by_created ON reservations (created);
CREATE TABLE sessions (session TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE nonces (nonce TEXT PRIMARY KEY, expires_at REAL NOT NULL);
CREATE INDEX nonces_by_expiry ON nonces (expires_at);
"""

_SESSION_VALUE = "SELECT value FROM session_counters WHERE session = ? AND persona = ? AND dimension = ?"
_SESSION_ADD = (
    "INSERT INTO session_counters (session, persona, dimension, value) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session, persona, dimension) DO UPDATE SET value = value + excluded.value"
)
_SESSION_TAKE = "UPDATE session_counters SET value = value - ? WHERE session = ? AND persona = ? AND dimension = ?"

# per_day statements take (agent, persona, dimension) first
_DAY_KEY = "agent = ? AND persona = ? AND dimension = ?"
_DAY_TOTAL = f"SELECT total, oldest FROM day_totals WHERE {_DAY_KEY}"
_DAY_EXPIRE = f"DELETE FROM day_buckets WHERE {_DAY_KEY} AND bucket < ? RETURNING bucket, value"
_DAY_EXPIRED = f"SELECT bucket, value FROM day_buckets WHERE {_DAY_KEY} AND bucket < ?"
_DAY_HAS_LIVE = f"SELECT 1 FROM day_buckets WHERE {_DAY_KEY} AND bucket >= ? LIMIT 1"
_DAY_SET_TOTAL = f"UPDATE day_totals SET total = ?, oldest = ? WHERE {_DAY_KEY}"
_DAY_ADD = (
    "INSERT INTO day_buckets (agent, persona, dimension, bucket, value) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (agent, persona, dimension, bucket) DO UPDATE SET value = value + excluded.value"
)
_DAY_ADD_TOTAL = (
    "INSERT INTO day_totals (agent, persona, dimension, total, oldest) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (agent, persona, dimension) DO UPDATE "
    "SET total = total + excluded.total, oldest = MIN(oldest, excluded.oldest)"
)
_DAY_TAKE = f"UPDATE day_buckets SET value = value - ? WHERE {_DAY_KEY} AND bucket = ?"
_DAY_TAKE_TOTAL = f"UPDATE day_totals SET total = total - ? WHERE {_DAY_KEY}"


class StateFileLock:
    """A non-blocking flock on `<database>.lock`: exclusive for the write-behind store (one
    governor process owns the file; its pid is written in the lock file), shared for
    SQLiteStore (any number of processes share the file, but never with an owner that keeps
    the counters in memory, whose changes they would not see)."""

    def __init__(self, database: str, *, exclusive: bool) -> None:
        self.path = f"{database}.lock"
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreUnavailable(f"SQLite store {database}: cannot open its lock file: {exc}") from exc
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _pid_in(fd)
            os.close(fd)
            if not exclusive:
                who = "an unknown pid" if holder is None else f"pid {holder}"
                raise StoreError(
                    f"SQLite store {database} is owned by a governor process ({who}; lock {self.path}) that "
                    "keeps its counters in memory: a shared store would not see its changes. Stop it, or "
                    "open the file with sqlite:///PATH?shared=true in every process that uses it"
                ) from None
            who = "another process using it with shared=true" if holder is None else f"pid {holder}"
            if holder == os.getpid():
                who += ", this process"
            raise StoreError(
                f"SQLite store {database} is already open in another store ({who}; lock {self.path}): "
                "one governor process owns a state file. Replicas that share budgets use Redis "
                "(redis://HOST:PORT/DB); processes that share one SQLite file use sqlite:///PATH?shared=true"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StoreUnavailable(f"SQLite store {database}: cannot lock {self.path}: {exc}") from exc
        if exclusive:
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:
                os.close(fd)
                raise StoreUnavailable(f"SQLite store {database}: cannot write {self.path}: {exc}") from exc
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _pid_in(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


class SQLiteStore:
    """A store in the SQLite file at `path` (created with its directory's permissions)."""

    remote = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        window: RollingWindow = DAY,
        synchronous: str = "NORMAL",
        busy_timeout: float = 5.0,
        lock: bool = True,
    ) -> None:
        if synchronous.upper() not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.path = os.fspath(path)
        # shared with other SQLiteStores, never with a write-behind owner (lock=False: the
        # write-behind store composing this one holds the exclusive lock itself)
        self._lock = StateFileLock(self.path, exclusive=False) if lock else None
        self.window = window
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._registry_lock = threading.Lock()
        self._closed = False
        try:
            self._init_schema()
        except BaseException:
            self.close()
            raise

    # --- connections -------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (SQLite connections must not be shared mid-transaction)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        with self._registry_lock:
            if self._closed:
                raise StoreUnavailable(f"SQLite store {self.path} is closed")
            conn = sqlite3.connect(
                self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            except BaseException:
                conn.close()
                raise
            self._connections.append(conn)
        self._local.conn = conn
        return conn

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn any backend failure into StoreUnavailable, so the caller fails closed."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite store {self.path}: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: the writer lock is taken before anything is read."""
        with self._guard():
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: a consistent view across several SELECTs."""
        with self._guard():
            conn = self._conn()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def _init_schema(self) -> None:
        with self._write() as conn:
            has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
            if not has_meta:
                # statement by statement: executescript() would COMMIT the open transaction
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                return
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else None
        if version != SCHEMA_VERSION:
            self.close()
            raise StoreError(
                f"SQLite store {self.path} has schema version {version}, this governor reads {SCHEMA_VERSION}"
            )

    # --- counters ----------------------------------------------------------------------
    reserve_within = reserve_within  # the default: snapshot, then reserve (governor.store.base)

    def reserve(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        totals = totals_by_key(charges)
        first_live, bucket = self.window.first_live(now), self.window.bucket_of(now)
        with self._write() as conn:
            current = {key: self._live_value(conn, agent, session, key, first_live) for key in totals}
            overshoot = first_overshoot(charges, totals, current)
            if overshoot is not None:
                return Reservation(id=None, ok=False, failed=overshoot[0], observed=overshoot[1])
            for key, amount in totals.items():  # expired buckets were just dropped by _live_value
                self._apply(conn, agent, session, key, bucket, amount, first_live, expired_dropped=True)
            rid = uuid.uuid4().hex
            conn.execute(
                "INSERT INTO reservations (id, agent, session, bucket, created, totals) VALUES (?, ?, ?, ?, ?, ?)",
                (rid, agent, session, bucket, now, encode_totals(totals)),
            )
        return Reservation(id=rid, ok=True)

    def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        actual_totals = None if actual is None else totals_by_key(actual)
        first_live = self.window.first_live(now)
        with self._write() as conn:
            row = self._take_reservation(conn, reservation_id)
            if row is None:
                raise UnknownReservation(reservation_id)
            if actual_totals is None:
                return
            agent, session, bucket, totals = row
            # one net change per counter (actual - reserved), both dated at the reservation
            for key in totals.keys() | actual_totals.keys():
                delta = actual_totals.get(key, 0.0) - totals.get(key, 0.0)
                if delta:
                    self._apply(conn, agent, session, key, bucket, delta, first_live)

    def release(self, reservation_id: str) -> bool:
        with self._write() as conn:
            row = self._take_reservation(conn, reservation_id)
            if row is None:
                return False
            self._unhold(conn, *row)
            return True

    def extend(self, reservation_id: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        totals = totals_by_key(charges)
        first_live = self.window.first_live(now)
        with self._write() as conn:
            row = conn.execute("SELECT agent, session, bucket, totals FROM reservations WHERE id = ?",
                               (reservation_id,)).fetchone()
            if row is None:
                raise UnknownReservation(reservation_id)
            agent, session, bucket, held = row[0], row[1], row[2], decode_totals(row[3])
            current = {key: self._live_value(conn, agent, session, key, first_live) for key in totals}
            overshoot = first_overshoot(charges, totals, current)
            if overshoot is not None:
                return Reservation(id=None, ok=False, failed=overshoot[0], observed=overshoot[1])
            for key, amount in totals.items():  # dated at the reservation, as commit dates its usage
                self._apply(conn, agent, session, key, bucket, amount, first_live, expired_dropped=True)
                held[key] = held.get(key, 0.0) + amount
            conn.execute("UPDATE reservations SET totals = ? WHERE id = ?", (encode_totals(held), reservation_id))
        return Reservation(id=reservation_id, ok=True)

    def add(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> None:
        totals = totals_by_key(charges)
        first_live, bucket = self.window.first_live(now), self.window.bucket_of(now)
        with self._write() as conn:
            for key, amount in totals.items():
                self._apply(conn, agent, session, key, bucket, amount, first_live)

    def snapshot(
        self, agent: str, session: str, now: float, keys: Sequence[CounterKey] | None = None
    ) -> dict[CounterKey, float]:
        """Read-only (expired buckets are left for the next write to drop)."""
        first_live = self.window.first_live(now)
        if keys is not None:
            check_keys(keys)
        with self._read() as conn:
            if keys is not None:
                return {key: self._value(conn, agent, session, key, first_live) for key in keys}
            values = {
                ("per_session", p or None, d):
                    stored_count(v, "session_counters", session=session, persona=p, dimension=d)
                for p, d, v in conn.execute(
                    "SELECT persona, dimension, value FROM session_counters WHERE session = ?", (session,)
                )
            }
            for p, d in conn.execute("SELECT persona, dimension FROM day_totals WHERE agent = ?", (agent,)).fetchall():
                if conn.execute(_DAY_HAS_LIVE, (agent, p, d, first_live)).fetchone():
                    values[("per_day", p or None, d)] = self._value(conn, agent, session, ("per_day", p or None, d),
                                                                    first_live)
        return values

    def settle_reservations(self, before: float) -> int:
        with self._write() as conn:
            return conn.execute("DELETE FROM reservations WHERE created < ?", (before,)).rowcount

    @staticmethod
    def _value(conn: sqlite3.Connection, agent: str, session: str, key: CounterKey, first_live: int) -> float:
        """A counter's value at first_live, without writing."""
        scope, persona, dimension = key
        persona = persona or AGGREGATE
        if scope == "per_session":
            row = conn.execute(_SESSION_VALUE, (session, persona, dimension)).fetchone()
            return 0.0 if row is None else \
                stored_count(row[0], "session_counters", session=session, persona=persona, dimension=dimension)
        row = conn.execute(_DAY_TOTAL, (agent, persona, dimension)).fetchone()
        if row is None:
            return 0.0
        total, oldest = _day_total(agent, persona, dimension, row)
        if oldest < first_live:
            total -= _expired(agent, persona, dimension, conn.execute(_DAY_EXPIRED, (agent, persona, dimension,
                                                                                     first_live)).fetchall())
        return total

    @classmethod
    def _live_value(
        cls, conn: sqlite3.Connection, agent: str, session: str, key: CounterKey, first_live: int
    ) -> float:
        """A counter's value at first_live, dropping the per_day buckets that left the window.

        Each bucket is dropped once, so keeping the rolling sum costs O(1) per step
        instead of a sum over a day of buckets.
        """
        scope, persona, dimension = key
        if scope == "per_session":
            return cls._value(conn, agent, session, key, first_live)
        day_key = (agent, persona or AGGREGATE, dimension)
        row = conn.execute(_DAY_TOTAL, day_key).fetchone()
        if row is None:
            return 0.0
        total, oldest = _day_total(*day_key, row)
        if oldest < first_live:  # (a damaged row raises before the transaction commits: nothing deleted)
            total -= _expired(*day_key, conn.execute(_DAY_EXPIRE, (*day_key, first_live)).fetchall())
            conn.execute(_DAY_SET_TOTAL, (total, first_live, *day_key))
        return total

    @classmethod
    def _apply(
        cls, conn: sqlite3.Connection, agent: str, session: str, key: CounterKey, bucket: int, amount: float,
        first_live: int, *, expired_dropped: bool = False,
    ) -> None:
        scope, persona, dimension = key
        persona = persona or AGGREGATE
        if scope == "per_session":
            conn.execute(_SESSION_ADD, (session, persona, dimension, amount))
        elif bucket >= first_live:  # usage dated before the window no longer counts
            if not expired_dropped:
                cls._live_value(conn, agent, session, key, first_live)
            conn.execute(_DAY_ADD, (agent, persona, dimension, bucket, amount))
            conn.execute(_DAY_ADD_TOTAL, (agent, persona, dimension, amount, bucket))

    @staticmethod
    def _take_reservation(
        conn: sqlite3.Connection, reservation_id: str
    ) -> tuple[str, str, int, dict[CounterKey, float]] | None:
        row = conn.execute(
            "DELETE FROM reservations WHERE id = ? RETURNING agent, session, bucket, totals", (reservation_id,)
        ).fetchone()
        if row is None:
            return None
        agent, session, bucket, totals = row
        return agent, session, bucket, decode_totals(totals)

    @staticmethod
    def _unhold(
        conn: sqlite3.Connection, agent: str, session: str, bucket: int, totals: dict[CounterKey, float]
    ) -> None:
        """Take a reservation's amounts off its counters (rows pruned meanwhile stay gone)."""
        for (scope, persona, dimension), amount in totals.items():
            persona = persona or AGGREGATE
            if scope == "per_session":
                conn.execute(_SESSION_TAKE, (amount, session, persona, dimension))
            elif conn.execute(_DAY_TAKE, (amount, agent, persona, dimension, bucket)).rowcount:
                conn.execute(_DAY_TAKE_TOTAL, (amount, agent, persona, dimension))

    # --- sessions ----------------------------------------------------------------------
    def save_session(self, session: str, state: dict) -> None:
        encoded = encode_state(state).decode()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO sessions (session, state) VALUES (?, ?) "
                "ON CONFLICT (session) DO UPDATE SET state = excluded.state",
                (session, encoded),
            )

    def load_session(self, session: str) -> dict | None:
        with self._guard():
            row = self._conn().execute("SELECT state FROM sessions WHERE session = ?", (session,)).fetchone()
        return None if row is None else orjson.loads(row[0])

    def list_sessions(self) -> list[str]:
        with self._guard():
            rows = self._conn().execute("SELECT session FROM sessions ORDER BY session").fetchall()
        return [r[0] for r in rows]

    def delete_session(self, session: str) -> bool:
        with self._write() as conn:
            conn.execute("DELETE FROM reservations WHERE session = ?", (session,))
            conn.execute("DELETE FROM session_counters WHERE session = ?", (session,))
            return conn.execute("DELETE FROM sessions WHERE session = ?", (session,)).rowcount > 0

    # --- nonces ------------------------------------------------------------------------
    def put_nonce(self, nonce: str, expires_at: float, now: float) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM nonces WHERE expires_at <= ?", (now,))
            conn.execute(
                "INSERT INTO nonces (nonce, expires_at) VALUES (?, ?) "
                "ON CONFLICT (nonce) DO UPDATE SET expires_at = excluded.expires_at",
                (nonce, expires_at),
            )

    def take_nonce(self, nonce: str, now: float) -> bool:
        with self._write() as conn:
            row = conn.execute("DELETE FROM nonces WHERE nonce = ? RETURNING expires_at", (nonce,)).fetchone()
        return row is not None and now < row[0]

    def close(self) -> None:
        with self._registry_lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def encode_totals(totals: dict[CounterKey, float]) -> str:
    return orjson.dumps([[s, p, d, a] for (s, p, d), a in totals.items()]).decode()


def decode_totals(text: str) -> dict[CounterKey, float]:
    return {(s, p, d): a for s, p, d, a in orjson.loads(text)}


def _day_total(agent: str, persona: str, dimension: str, row: tuple) -> tuple[float, int]:
    """A day_totals row's total and oldest bucket, checked (CounterDamaged: edited in the file)."""
    if type(row[1]) is not int:
        raise CounterDamaged(state_row("day_totals", agent=agent, persona=persona, dimension=dimension),
                             str(row[1])[:64])
    return stored_count(row[0], "day_totals", agent=agent, persona=persona,
                        dimension=dimension), row[1]


def _expired(agent: str, persona: str, dimension: str, rows: list[tuple]) -> float:
    """The sum of the bucket rows that left the window, each checked."""
    return sum(stored_count(value, "day_buckets", agent=agent, persona=persona, dimension=dimension, bucket=bucket)
               for bucket, value in rows)
