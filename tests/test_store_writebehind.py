"""The write-behind store: restarts, crashes, one owner per file, failing closed, open_store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from governor.policy.steps import CounterCharge
from governor.store import (
    FLUSH_INTERVAL,
    MemoryStore,
    RollingWindow,
    SQLiteStore,
    StoreError,
    StoreUnavailable,
    UnknownReservation,
    WriteBehindStore,
    open_store,
)

REPO = Path(__file__).resolve().parent.parent
T0 = 1_699_999_980.0  # a bucket boundary
NEVER = 3600.0  # a flush interval no test waits for: only flush() and close() write

DAY_TOKENS = ("per_day", None, "tokens")
DAY_COST = ("per_day", None, "cost_usd")
SESSION_TOKENS = ("per_session", None, "tokens")
PERSONA_TOKENS = ("per_session", "p", "tokens")


def charge(scope: str, dimension: str, amount: float, cap: float | None = None, persona: str | None = None):
    return CounterCharge(scope=scope, dimension=dimension, amount=amount, cap=cap, persona=persona)


def model_call(tokens: float, cost: float = 0.0, persona: str | None = None) -> list[CounterCharge]:
    charges = [charge("per_session", "tokens", tokens), charge("per_day", "tokens", tokens),
               charge("per_day", "cost_usd", cost)]
    if persona:
        charges.append(charge("per_session", "tokens", tokens, None, persona))
    return charges


def rows(path: Path, sql: str) -> list[tuple]:
    """Read the file as another program would."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def execute(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def views(store, pairs, times) -> dict:
    """Whole snapshots (every counter in use) of (agent, session) pairs at several times, in time order
    (a snapshot lets the window move on: in memory, buckets it leaves behind are dropped)."""
    return {(a, s, t): store.snapshot(a, s, t) for t in sorted(times) for a, s in pairs}


def work(store) -> str:
    """Usage over a few hours in several buckets, personas, two agents; returns an open reservation."""
    for i in range(6):
        r = store.reserve("agent", "s1", model_call(100, 0.5, "p"), T0 + i * 1800)
        store.commit(r.id, model_call(80 + i, 0.25, "p"), T0 + i * 1800 + 5)
    store.add("agent", "s2", [charge("per_session", "wall_clock_sec", 3.5), charge("per_day", "tokens", 7)], T0 + 60)
    store.add("other", "s3", model_call(11, 0.125), T0 + 120)
    released = store.reserve("agent", "s2", model_call(1000), T0 + 9000)
    assert store.release(released.id)
    return store.reserve("agent", "s2", model_call(40, 1.0, "p"), T0 + 9060).id


def more_work(store, held: str) -> str:
    """Settles the open reservation, ages some buckets out; returns a new open reservation."""
    store.commit(held, model_call(10), T0 + 9100)
    store.add("agent", "s1", model_call(5, 0.0625), T0 + 86400 + 1000)
    return store.reserve("other", "s3", model_call(3), T0 + 86400 + 1000).id


PAIRS = [("agent", "s1"), ("agent", "s2"), ("other", "s3"), ("nobody", "s4")]
# the last three let the buckets of the first minutes, then of the first hours, leave the day
TIMES = [T0 + 9100, T0 + 86400 + 1700, T0 + 86400 + 9000, T0 + 86400 + 9120]


# --- restarts ---------------------------------------------------------------------------


def test_counters_day_buckets_and_reservations_survive_a_restart(tmp_path: Path):
    path = tmp_path / "state.db"
    reference = MemoryStore()  # the same work, never restarted
    reference_held = work(reference)
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        held = work(store)
        store.save_session("s1", {"iterations": 6})
        store.put_nonce("n1", T0 + 300, T0)

    with WriteBehindStore(path, flush_interval=NEVER) as store:
        assert store.load_session("s1") == {"iterations": 6} and store.list_sessions() == ["s1"]
        assert store.take_nonce("n1", T0 + 1) is True
        # the outstanding reservation is outstanding again: it can be committed, once
        store.commit(held, model_call(30, 0.5, "p"), T0 + 9100)
        with pytest.raises(UnknownReservation):
            store.commit(held, None, T0 + 9100)
        reference.commit(reference_held, model_call(30, 0.5, "p"), T0 + 9100)
        # and the buckets came back one by one: usage still leaves the day when it should
        expected = views(reference, PAIRS, TIMES)
        assert views(store, PAIRS, TIMES) == expected
    assert expected[("agent", "s1", T0 + 9100)] == {
        SESSION_TOKENS: 80 + 81 + 82 + 83 + 84 + 85, PERSONA_TOKENS: 495, DAY_TOKENS: 495 + 7 + 30, DAY_COST: 2.0,
    }
    assert expected[("agent", "s2", T0 + 86400 + 1700)] == {
        SESSION_TOKENS: 30, PERSONA_TOKENS: 30, ("per_session", None, "wall_clock_sec"): 3.5,
        DAY_TOKENS: 495 - 80 + 30, DAY_COST: 1.25 + 0.5,  # the first half hour has left the day
    }


def test_the_file_reads_the_same_in_the_shared_sqlite_store_and_back(tmp_path: Path):
    path = tmp_path / "state.db"
    reference, carried_on = MemoryStore(), MemoryStore()
    work(reference)
    more_work(carried_on, work(carried_on))
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        held = work(store)
    with SQLiteStore(path) as shared:
        assert views(shared, PAIRS, TIMES) == views(reference, PAIRS, TIMES)
        # the shared store carries on with the same reservations and buckets
        kept = more_work(shared, held)
        written_through = views(shared, PAIRS, TIMES)
    assert written_through == views(carried_on, PAIRS, TIMES)
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        assert views(store, PAIRS, TIMES) == written_through
        assert store.release(kept) is True


def test_a_reservation_made_and_settled_between_flushes_never_reaches_the_file(tmp_path: Path):
    path = tmp_path / "state.db"
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        store.add("agent", "s1", model_call(1), T0)
        store.flush()
        execute(path, "CREATE TRIGGER no_reservations BEFORE INSERT ON reservations "
                      "BEGIN SELECT RAISE(ABORT, 'a reservation was written'); END")
        committed = store.reserve("agent", "s1", model_call(10), T0)
        store.commit(committed.id, None, T0)
        released = store.reserve("agent", "s1", model_call(20), T0)
        store.release(released.id)
        store.flush()  # the trigger would refuse it if a reservation row were inserted
        assert rows(path, "SELECT value FROM session_counters WHERE persona = ''") == [(11.0,)]
        held = store.reserve("agent", "s1", model_call(30), T0)
        with pytest.raises(StoreUnavailable, match="a reservation was written"):
            store.flush()
        execute(path, "DROP TRIGGER no_reservations")
        store.flush()
        assert rows(path, "SELECT id FROM reservations") == [(held.id,)]


def test_the_flusher_writes_changes_behind_without_being_asked(tmp_path: Path):
    path = tmp_path / "state.db"
    with WriteBehindStore(path, flush_interval=0.01) as store:
        r = store.reserve("agent", "s1", model_call(25), T0)
        wait_for(lambda: rows(path, "SELECT id FROM reservations") == [(r.id,)])
        store.commit(r.id, model_call(20), T0)
        wait_for(lambda: rows(path, "SELECT id FROM reservations") == []
                 and rows(path, "SELECT value FROM session_counters") == [(20.0,)])
        assert rows(path, "SELECT bucket, value FROM day_buckets WHERE dimension = 'tokens'") == [(T0 // 60, 20.0)]
        assert rows(path, "SELECT total, oldest FROM day_totals WHERE dimension = 'tokens'") == [(20.0, T0 // 60)]


def test_load_session_reads_the_sessions_counters_ahead_of_its_first_step(tmp_path: Path):
    path = tmp_path / "state.db"
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        store.add("agent", "s1", model_call(42), T0)
        store.save_session("s1", {"iterations": 1})
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        assert store.load_session("s1") == {"iterations": 1}
        # from now on the session's counters are the store's own: the file is not read again
        execute(path, "DELETE FROM session_counters")
        assert store.snapshot("agent", "s1", T0, [SESSION_TOKENS]) == {SESSION_TOKENS: 42}


def test_expired_buckets_leave_the_file_with_the_next_change(tmp_path: Path):
    path = tmp_path / "state.db"
    window = RollingWindow(length=600.0, bucket=60.0)
    base = T0 // 60
    with WriteBehindStore(path, window=window, flush_interval=NEVER) as store:
        for minute in range(5):
            store.add("agent", "s1", [charge("per_day", "tokens", 1)], T0 + 60 * minute)
        store.flush()
        assert rows(path, "SELECT COUNT(*) FROM day_buckets") == [(5,)]
        store.add("agent", "s1", [charge("per_day", "tokens", 10)], T0 + 60 * 13)  # minutes 0..2 left the window
        store.flush()
        assert rows(path, "SELECT bucket FROM day_buckets ORDER BY bucket") == [(base + 3,), (base + 4,), (base + 13,)]
        assert rows(path, "SELECT total, oldest FROM day_totals") == [(12.0, base + 3)]
        store.add("agent", "s1", [charge("per_day", "tokens", 100)], T0 + 60 * 15)  # and minutes 3 and 4
        store.flush()
        assert rows(path, "SELECT bucket FROM day_buckets ORDER BY bucket") == [(base + 13,), (base + 15,)]
    with SQLiteStore(path, window=window) as shared:  # its reserve drops expired rows: none are left to drop twice
        assert shared.reserve("agent", "s1", [charge("per_day", "tokens", 1)], T0 + 60 * 16).ok
        assert shared.snapshot("agent", "s1", T0 + 60 * 16, [DAY_TOKENS]) == {DAY_TOKENS: 111}


def test_deleting_a_session_while_the_flusher_runs_leaves_nothing_of_it(tmp_path: Path):
    """Steps keep coming on sessions that are deleted over and over; the flusher runs all along."""
    path = tmp_path / "state.db"
    stop = threading.Event()
    errors: list[BaseException] = []

    def steps(session: str) -> None:
        try:
            i = 0
            while not stop.is_set():
                r = store.reserve("agent", session, model_call(1, 0.0, "p"), T0 + i)
                if i % 3:
                    try:
                        store.commit(r.id, None, T0 + i)
                    except UnknownReservation:
                        if session != "s1":  # only a deleted session's reservations may vanish
                            raise
                i += 1
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    with WriteBehindStore(path, flush_interval=0.001) as store:
        workers = [threading.Thread(target=steps, args=(s,)) for s in ("s1", "s2")]
        for w in workers:
            w.start()
        for _ in range(50):
            store.delete_session("s1")
            time.sleep(0.002)
        stop.set()
        for w in workers:
            w.join()
        assert errors == []
        store.delete_session("s1")
        expected = views(store, [("agent", "s1"), ("agent", "s2")], [T0 + 100])
    assert expected[("agent", "s1", T0 + 100)].keys() == {DAY_TOKENS, DAY_COST}  # per_day keeps counting
    assert rows(path, "SELECT COUNT(*) FROM session_counters WHERE session = 's1'") == [(0,)]
    assert rows(path, "SELECT COUNT(*) FROM reservations WHERE session = 's1'") == [(0,)]
    with SQLiteStore(path) as shared:
        assert views(shared, [("agent", "s1"), ("agent", "s2")], [T0 + 100]) == expected


# --- crashes ----------------------------------------------------------------------------

CRASH_EXACT = """
import json, os, sys
from governor.policy.steps import CounterCharge as C
from governor.store import WriteBehindStore
T0 = 1699999980.0
calls = lambda n: [C("per_session", "tokens", n, None), C("per_day", "tokens", n, None),
                   C("per_session", "tokens", n, None, "p")]
store = WriteBehindStore(sys.argv[1], flush_interval=3600)
first = store.reserve("agent", "s1", calls(100), T0)
store.commit(first.id, calls(70), T0 + 1)
held = store.reserve("agent", "s1", calls(50), T0 + 60)
store.add("agent", "s2", calls(5), T0 + 120)
store.flush()
flushed = {s: {repr(k): v for k, v in store.snapshot("agent", s, T0 + 180).items()} for s in ("s1", "s2")}
print(json.dumps({"held": held.id, "flushed": flushed}), flush=True)
# more work after the flush, never written: lost with the process, and only that
store.commit(held.id, calls(10), T0 + 200)
store.add("agent", "s3", calls(1000), T0 + 200)
store.reserve("agent", "s1", calls(1), T0 + 200)
os._exit(0)
"""


def test_a_crash_keeps_exactly_what_was_flushed(tmp_path: Path):
    path = tmp_path / "state.db"
    done = subprocess.run([sys.executable, "-c", CRASH_EXACT, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    with WriteBehindStore(path, flush_interval=NEVER) as store:  # the dead owner's lock went with it
        after = {s: {repr(k): v for k, v in store.snapshot("agent", s, T0 + 180).items()} for s in ("s1", "s2")}
        assert after == out["flushed"]
        assert store.snapshot("agent", "s3", T0 + 180) == {DAY_TOKENS: 125.0}  # s3's 1000 never reached the file
        assert store.release(out["held"]) is True  # outstanding at the flush: outstanding now


# Step i reserves 1 (created at T0 + i) and commits the previous reservation with 3, so
# every whole state is one of: after step i, value 3i + 1 with {i} outstanding; within
# step i, value 3i - 1 with {i - 1, i} outstanding. Anything else is a torn batch.
# The clock moves a second per step, and the child makes ~80,000 steps a second here: the
# rolling window is made long enough never to drop a bucket, or the per_day counter would
# rightly fall below the session's (expiry has its own test above).
NO_EXPIRY = RollingWindow(length=1e9)
CRASH_TORN = """
import os, sys
from governor.policy.steps import CounterCharge as C
from governor.store import RollingWindow, WriteBehindStore
T0 = 1699999980.0
one = lambda n: [C("per_session", "tokens", n, None), C("per_day", "tokens", n, None)]
store = WriteBehindStore(sys.argv[1], flush_interval=0.0005, window=RollingWindow(length=1e9))
previous, i = None, 0
while True:
    r = store.reserve("agent", "s1", one(1), T0 + i)
    if previous is not None:
        store.commit(previous.id, one(3), T0 + i)
    previous = r
    if i == 500:
        store.flush()
        print(i, flush=True)
    i += 1
"""


def whole_batch(conn: sqlite3.Connection) -> tuple[int, float]:
    """Check the file holds one of CRASH_TORN's whole states (one read transaction); (step, value)."""
    conn.execute("BEGIN")
    try:
        outstanding = sorted(int(created - T0) for (created,) in conn.execute("SELECT created FROM reservations"))
        (session_value,) = conn.execute("SELECT value FROM session_counters").fetchone()
        (day_value,) = conn.execute("SELECT SUM(value) FROM day_buckets").fetchone()
        (day_total,) = conn.execute("SELECT total FROM day_totals").fetchone()
    finally:
        conn.execute("COMMIT")
    i = outstanding[-1]
    if outstanding == [i]:
        assert session_value == 3 * i + 1, (outstanding, session_value)
    else:
        assert outstanding == [i - 1, i] and session_value == 3 * i - 1, (outstanding, session_value)
    assert day_value == day_total == session_value
    return i, session_value


def test_batches_are_whole_while_written_and_after_a_kill(tmp_path: Path):
    path = tmp_path / "state.db"
    child = subprocess.Popen([sys.executable, "-c", CRASH_TORN, str(path)], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "500", child.stderr.read()
        conn = sqlite3.connect(path, isolation_level=None)
        seen: set[int] = set()
        try:  # read batches as they land
            wait_for(lambda: seen.add(whole_batch(conn)[0]) or len(seen) >= 20, pause=0)
        finally:
            conn.close()
        child.send_signal(signal.SIGKILL)  # while flushes keep landing
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        i, value = whole_batch(conn)
    finally:
        conn.close()
    assert i >= max(seen)  # at least everything flushed before the kill
    with WriteBehindStore(path, flush_interval=NEVER, window=NO_EXPIRY) as store:
        assert store.snapshot("agent", "s1", T0 + i, [SESSION_TOKENS, DAY_TOKENS]) == {
            SESSION_TOKENS: value, DAY_TOKENS: value}


# --- one owner per file -------------------------------------------------------------------


def test_a_second_store_on_the_file_in_this_process_is_refused_until_the_first_closes(tmp_path: Path):
    path = tmp_path / "state.db"
    store = WriteBehindStore(path)
    with pytest.raises(StoreError) as refused:
        WriteBehindStore(path)
    message = str(refused.value)
    assert str(path) in message and f"pid {os.getpid()}" in message
    assert "Redis" in message and "shared=true" in message
    with pytest.raises(StoreError):
        open_store(f"sqlite://{path}?flush=1")
    store.close()
    WriteBehindStore(path).close()


OWNER = """
import sys
from governor.store import WriteBehindStore
store = WriteBehindStore(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
store.close()
"""

SECOND = """
import sys
from governor.store import StoreError, open_store
try:
    open_store(sys.argv[1])
except StoreError as exc:
    print(exc)
else:
    print("opened")
"""


def test_a_second_process_on_the_file_is_refused_until_the_owner_closes(tmp_path: Path):
    path = tmp_path / "state.db"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(path)], cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "open", owner.stderr.read()
        with pytest.raises(StoreError) as refused:
            WriteBehindStore(path)
        assert str(path) in str(refused.value) and f"pid {owner.pid}" in str(refused.value)
        assert "shared=true" in str(refused.value)
        owner.communicate("\n", timeout=30)
        assert owner.returncode == 0
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    WriteBehindStore(path).close()

    with WriteBehindStore(path):
        other = subprocess.run([sys.executable, "-c", SECOND, str(path)], cwd=REPO, capture_output=True, text=True,
                               timeout=60)
        assert f"pid {os.getpid()}" in other.stdout and "sqlite:///PATH?shared=true" in other.stdout, other
    other = subprocess.run([sys.executable, "-c", SECOND, str(path)], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
    assert other.stdout.strip() == "opened", other


def test_the_lock_file_names_its_owner(tmp_path: Path):
    path = tmp_path / "state.db"
    with WriteBehindStore(path):
        assert (tmp_path / "state.db.lock").read_text().strip() == str(os.getpid())


# --- failing closed ---------------------------------------------------------------------

REFUSE_COUNTER_WRITES = (
    "CREATE TRIGGER refuse_insert BEFORE INSERT ON session_counters BEGIN SELECT RAISE(ABORT, 'disk says no'); END",
    "CREATE TRIGGER refuse_update BEFORE UPDATE ON session_counters BEGIN SELECT RAISE(ABORT, 'disk says no'); END",
)
ALLOW_COUNTER_WRITES = ("DROP TRIGGER refuse_insert", "DROP TRIGGER refuse_update")


def test_a_failed_flush_fails_closed_until_a_flush_succeeds_and_loses_nothing(tmp_path: Path):
    path = tmp_path / "state.db"
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        store.add("agent", "s1", model_call(10, 0.5), T0)
        store.flush()  # the row exists: the next write of it is an UPDATE
        held = store.reserve("agent", "s1", model_call(100, 1.0), T0).id
        store.add("agent", "s2", model_call(7), T0)  # a new row: an INSERT
        execute(path, *REFUSE_COUNTER_WRITES)

        with pytest.raises(StoreUnavailable, match="disk says no") as failed:
            store.flush()
        assert str(path) in str(failed.value)
        for operation in (
            lambda: store.reserve("agent", "s1", model_call(1), T0),
            lambda: store.snapshot("agent", "s1", T0),
            lambda: store.commit(held, None, T0),
            lambda: store.release(held),
            lambda: store.add("agent", "s1", model_call(1), T0),
            lambda: store.delete_session("s1"),
        ):
            with pytest.raises(StoreUnavailable, match="disk says no"):
                operation()
        with pytest.raises(StoreUnavailable, match="disk says no"):  # still failing: still refused
            store.flush()
        # nothing was written: the batch is one transaction
        assert rows(path, "SELECT COUNT(*) FROM reservations") == [(0,)]
        assert rows(path, "SELECT total FROM day_totals WHERE dimension = 'tokens'") == [(10.0,)]

        execute(path, *ALLOW_COUNTER_WRITES)
        store.flush()
        assert store.snapshot("agent", "s1", T0) == {SESSION_TOKENS: 110, DAY_TOKENS: 117, DAY_COST: 1.5}
        store.commit(held, model_call(60, 0.75), T0)
        assert store.snapshot("agent", "s1", T0) == {SESSION_TOKENS: 70, DAY_TOKENS: 77, DAY_COST: 1.25}
    with SQLiteStore(path) as shared:
        assert shared.snapshot("agent", "s1", T0) == {SESSION_TOKENS: 70, DAY_TOKENS: 77, DAY_COST: 1.25}
        assert shared.snapshot("agent", "s2", T0, [SESSION_TOKENS]) == {SESSION_TOKENS: 7}


def test_the_flusher_retries_a_failed_flush_on_its_own(tmp_path: Path):
    path = tmp_path / "state.db"
    with WriteBehindStore(path, flush_interval=0.01) as store:
        execute(path, *REFUSE_COUNTER_WRITES)
        store.add("agent", "s1", model_call(10), T0)
        wait_for(lambda: refused(lambda: store.snapshot("agent", "s1", T0)))
        execute(path, *ALLOW_COUNTER_WRITES)
        wait_for(lambda: not refused(lambda: store.snapshot("agent", "s1", T0)))
        assert rows(path, "SELECT value FROM session_counters") == [(10.0,)]


def test_closing_when_the_last_batch_cannot_be_written_says_so_and_releases_the_file(tmp_path: Path):
    path = tmp_path / "state.db"
    store = WriteBehindStore(path, flush_interval=NEVER)
    store.add("agent", "s1", model_call(10), T0)
    execute(path, *REFUSE_COUNTER_WRITES)
    with pytest.raises(StoreUnavailable, match="disk says no.*lost"):
        store.close()
    store.close()  # idempotent
    with pytest.raises(StoreUnavailable, match="closed"):
        store.snapshot("agent", "s1", T0)
    execute(path, *ALLOW_COUNTER_WRITES)
    with WriteBehindStore(path) as reopened:
        assert reopened.snapshot("agent", "s1", T0) == {}


def test_a_closed_store_refuses_everything(tmp_path: Path):
    store = WriteBehindStore(tmp_path / "state.db")
    r = store.reserve("agent", "s1", model_call(1), T0)
    store.close()
    for operation in (
        lambda: store.reserve("agent", "s1", model_call(1), T0),
        lambda: store.commit(r.id, None, T0),
        lambda: store.release(r.id),
        lambda: store.add("agent", "s1", model_call(1), T0),
        lambda: store.snapshot("agent", "s1", T0),
        lambda: store.settle_reservations(T0 + 1),
        store.flush,
        lambda: store.save_session("s1", {}),
        lambda: store.load_session("s1"),
        store.list_sessions,
        lambda: store.delete_session("s1"),
        lambda: store.put_nonce("n", T0 + 1, T0),
        lambda: store.take_nonce("n", T0),
    ):
        with pytest.raises(StoreUnavailable, match="closed"):
            operation()


def test_a_store_in_a_missing_directory_is_unavailable(tmp_path: Path):
    with pytest.raises(StoreUnavailable, match="no-such-dir"):
        WriteBehindStore(tmp_path / "no-such-dir" / "state.db")


def test_a_file_of_a_newer_schema_is_refused_and_left_unlocked(tmp_path: Path):
    path = tmp_path / "state.db"
    SQLiteStore(path).close()
    execute(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    for _ in range(2):  # the refused open released its lock
        with pytest.raises(StoreError, match="schema version 99"):
            WriteBehindStore(path)


# --- open_store ---------------------------------------------------------------------------


def test_open_store_opens_the_write_behind_store_by_default_and_the_shared_one_on_request(tmp_path: Path):
    assert isinstance(open_store("memory:"), MemoryStore)
    for location, kind, interval in (
        (tmp_path / "a.db", WriteBehindStore, FLUSH_INTERVAL),
        (f"sqlite://{tmp_path}/b.db", WriteBehindStore, FLUSH_INTERVAL),
        (f"sqlite://{tmp_path}/c.db?flush=0.5&synchronous=FULL", WriteBehindStore, 0.5),
        (f"sqlite://{tmp_path}/d.db?shared=true", SQLiteStore, None),
        (f"sqlite://{tmp_path}/e.db?shared=true&synchronous=full", SQLiteStore, None),
        (f"sqlite://{tmp_path}/f.db?shared=false", WriteBehindStore, FLUSH_INTERVAL),
    ):
        store = open_store(location)
        try:
            assert type(store) is kind, location
            if interval is not None:
                assert store.flush_interval == interval
        finally:
            store.close()
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["a.db", "b.db", "c.db", "d.db", "e.db", "f.db"]
    # the shared store does not take the owner's lock: several processes open it
    with open_store(f"sqlite://{tmp_path}/d.db?shared=true"), open_store(f"sqlite://{tmp_path}/d.db?shared=true"):
        pass


@pytest.mark.parametrize("query, complaint", [
    ("flush=0", "positive"),
    ("flush=-1", "positive"),
    ("flush=soon", "positive"),
    ("flush=nan", "positive"),
    ("flush=inf", "positive"),
    ("flush=", "positive"),
    ("shared=true&flush=1", "flush"),
    ("shared=yes", "shared must be true or false"),
    ("synchronous=OFF", "synchronous"),
    ("journal=off", "unknown option"),
])
def test_open_store_refuses_bad_options(tmp_path: Path, query: str, complaint: str):
    with pytest.raises(ValueError, match=complaint):
        open_store(f"sqlite://{tmp_path}/state.db?{query}")
    WriteBehindStore(tmp_path / "state.db").close()  # a refused open leaves the file free


def test_a_bad_flush_interval_is_refused(tmp_path: Path):
    for bad in (0, -0.5, float("nan"), "1"):
        with pytest.raises(ValueError, match="flush interval"):
            WriteBehindStore(tmp_path / "state.db", flush_interval=bad)


# --- helpers ------------------------------------------------------------------------------


def refused(operation) -> bool:
    try:
        operation()
    except StoreUnavailable:
        return True
    return False


def wait_for(condition, timeout: float = 30.0, pause: float = 0.005) -> None:
    """Poll until the flusher (another thread or process) has done its part; not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(pause)


def test_a_shared_store_and_a_write_behind_owner_never_open_one_file_together(tmp_path: Path):
    path = tmp_path / "state.db"
    with WriteBehindStore(path) as owner:
        with pytest.raises(StoreError, match="keeps its counters in memory.*shared=true"):
            SQLiteStore(path)
        owner.add("agent", "s1", [CounterCharge("per_day", "tokens", 5, None)], T0)
    with SQLiteStore(path) as shared, SQLiteStore(path) as other:  # shared stores share
        assert shared.snapshot("agent", "s1", T0, [("per_day", None, "tokens")]) == {("per_day", None, "tokens"): 5}
        other.add("agent", "s1", [CounterCharge("per_day", "tokens", 1, None)], T0)
        with pytest.raises(StoreError, match="already open.*shared=true"):
            WriteBehindStore(path)
    with WriteBehindStore(path) as owner:  # every shared store closed: the owner opens
        assert owner.snapshot("agent", "s1", T0, [("per_day", None, "tokens")]) == {("per_day", None, "tokens"): 6}


def test_each_operation_alone_wakes_the_flusher(tmp_path: Path):
    """No explicit flush: reserve, commit as reserved, and release each reach the file on
    their own (the flusher sleeps until a change pokes it)."""
    path = tmp_path / "state.db"
    with WriteBehindStore(path, flush_interval=0.01) as store:
        held = store.reserve("agent", "s1", model_call(10), T0)
        wait_for(lambda: rows(path, "SELECT COUNT(*) FROM reservations") == [(1,)])
        store.commit(held.id, None, T0)  # consumed as reserved: no counter moves
        wait_for(lambda: rows(path, "SELECT COUNT(*) FROM reservations") == [(0,)])
        released = store.reserve("agent", "s1", model_call(10), T0)
        wait_for(lambda: rows(path, "SELECT COUNT(*) FROM reservations") == [(1,)])
        store.release(released.id)
        wait_for(lambda: rows(path, "SELECT COUNT(*) FROM reservations") == [(0,)])
        empty = store.reserve("agent", "s2", [], T0)  # a reservation of no charge
        wait_for(lambda: rows(path, "SELECT COUNT(*) FROM reservations") == [(1,)])
        assert empty.ok


def test_a_grown_reservation_reaches_the_file_with_its_grown_amounts(tmp_path):
    from governor.policy.steps import CounterCharge as Charge
    from governor.store import WriteBehindStore as WB

    path = tmp_path / "grown.db"
    store = WB(path, flush_interval=0.01)
    r = store.reserve("agent", "s1", [Charge("per_session", "tokens", 100, 1000)], 1_699_999_980.0)
    store.flush()  # the reservation is in the file with 100
    assert store.extend(r.id, [Charge("per_session", "tokens", 250, 1000)], 1_699_999_981.0).ok
    store.close()
    reopened = WB(path, flush_interval=0.01)
    try:  # the reservation came back grown: releasing it takes all 350 off
        assert reopened.snapshot("agent", "s1", 1_699_999_982.0) == {("per_session", None, "tokens"): 350}
        assert reopened.release(r.id)
        assert reopened.snapshot("agent", "s1", 1_699_999_982.0) == {("per_session", None, "tokens"): 0}
    finally:
        reopened.close()


def _remove_state_file(path) -> None:
    import os

    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def test_a_state_file_deleted_under_the_store_fails_closed_until_acknowledged(tmp_path):
    from governor.policy.steps import CounterCharge as Charge
    from governor.store import StoreIntegrityError
    from governor.store import WriteBehindStore as WB

    path = tmp_path / "state.db"
    t0 = 1_699_999_980.0
    store = WB(path, flush_interval=0.01)
    try:
        store.add("agent", "s1", [Charge("per_session", "tokens", 9_995, None)], t0)
        held = store.reserve("agent", "s1", [Charge("per_session", "tokens", 3, 10_000)], t0)
        store.flush()
        _remove_state_file(path)  # an operator's mistake, a cleanup job, a volume remounted empty
        with pytest.raises(StoreIntegrityError, match="deleted"):
            store.flush()
        with pytest.raises(StoreIntegrityError):  # every operation refuses, not just the flush
            store.reserve("agent", "s1", [Charge("per_session", "tokens", 1, 10_000)], t0)
        with pytest.raises(StoreIntegrityError):
            store.load_session("s1")
        assert store.integrity is not None
        answer = store.acknowledge()
        assert answer["acknowledged"] is True and "deleted" in answer["lost"]
        assert store.acknowledge()["acknowledged"] is False
        # what the process held went to the new file: the budget was not reset
        assert not store.reserve("agent", "s1", [Charge("per_session", "tokens", 50, 10_000)], t0).ok
        store.commit(held.id, None, t0)
    finally:
        store.close()
    reopened = WB(path, flush_interval=0.01)
    try:
        assert reopened.snapshot("agent", "s1", t0) == {("per_session", None, "tokens"): 9_998}
    finally:
        reopened.close()


def test_a_state_file_replaced_under_the_store_is_detected(tmp_path):
    import shutil

    from governor.policy.steps import CounterCharge as Charge
    from governor.store import StoreIntegrityError
    from governor.store import WriteBehindStore as WB

    path = tmp_path / "state.db"
    store = WB(path, flush_interval=0.01)
    try:
        store.add("agent", "s1", [Charge("per_session", "tokens", 10, None)], 1_699_999_980.0)
        store.flush()
        shutil.copy(path, tmp_path / "copy.db")
        (tmp_path / "copy.db").replace(path)  # another file at the same path (a restored backup)
        with pytest.raises(StoreIntegrityError, match="replaced"):
            store.flush()
    finally:
        from governor.store import StoreUnavailable

        with pytest.raises(StoreUnavailable, match="replaced"):  # the last batch cannot be written: said so
            store.close()
