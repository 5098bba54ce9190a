"""The SQLite store: restarts, other processes on the same file, failing closed."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from governor.policy.steps import CounterCharge
from governor.store import MemoryStore, SQLiteStore, StoreError, StoreUnavailable, open_store
from governor.store.sqlite import SCHEMA_VERSION

REPO = Path(__file__).resolve().parent.parent
T0 = 1_699_999_980.0

TOKENS_DAY = CounterCharge("per_day", "tokens", 100, 1000)
TOKENS_SESSION = CounterCharge("per_session", "tokens", 100, None)
DAY_TOKENS = ("per_day", None, "tokens")
SESSION_TOKENS = ("per_session", None, "tokens")


def run_python(code: str, *args: str) -> str:
    """Run `code` in a new interpreter (a second governor process) and return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_counters_sessions_and_reservations_survive_a_restart(tmp_path: Path):
    path = tmp_path / "state.db"
    with SQLiteStore(path) as store:
        store.reserve("agent", "s1", [TOKENS_DAY, TOKENS_SESSION], T0)
        store.commit(store.reserve("agent", "s1", [TOKENS_DAY, TOKENS_SESSION], T0).id, None, T0)
        open_one = store.reserve("agent", "s2", [TOKENS_DAY], T0 + 60)
        store.save_session("s1", {"iterations": 2, "personas": {"p": 1}})
        store.put_nonce("n1", T0 + 300, T0)

    with SQLiteStore(path) as store:
        assert store.snapshot("agent", "s1", T0 + 120) == {SESSION_TOKENS: 200, DAY_TOKENS: 300}
        assert store.load_session("s1") == {"iterations": 2, "personas": {"p": 1}}
        assert store.list_sessions() == ["s1"]
        store.commit(open_one.id, [CounterCharge("per_day", "tokens", 40, None)], T0 + 120)
        assert store.snapshot("agent", "s2", T0 + 120, [DAY_TOKENS]) == {DAY_TOKENS: 240}
        assert store.take_nonce("n1", T0 + 1) is True


def test_another_process_sees_and_adds_to_the_same_counters(tmp_path: Path):
    path = tmp_path / "state.db"
    with SQLiteStore(path) as store:
        store.add("agent", "s1", [TOKENS_DAY], T0)
        store.save_session("s1", {"iterations": 5})

    out = run_python(
        """
import json, sys
from governor.policy.steps import CounterCharge
from governor.store import open_store
store = open_store("sqlite://" + sys.argv[1] + "?shared=true")
before = store.snapshot("agent", "s2", float(sys.argv[2]))
r = store.reserve("agent", "s2", [CounterCharge("per_day", "tokens", 850, 1000)], float(sys.argv[2]))
print(json.dumps({"before": before[("per_day", None, "tokens")], "ok": r.ok, "observed": r.observed,
                  "state": store.load_session("s1")}))
store.close()
""",
        str(path),
        str(T0 + 60),
    )
    assert json.loads(out) == {"before": 100, "ok": True, "observed": None, "state": {"iterations": 5}}
    with SQLiteStore(path) as store:  # the other process's reservation stays outstanding: counted
        assert store.snapshot("agent", "s3", T0 + 120, [DAY_TOKENS]) == {DAY_TOKENS: 950}
        assert not store.reserve("agent", "s3", [TOKENS_DAY], T0 + 120).ok
        assert store.settle_reservations(before=T0 + 120) == 1
        assert store.snapshot("agent", "s3", T0 + 120, [DAY_TOKENS]) == {DAY_TOKENS: 950}


RACER = """
import json, sys
from governor.policy.steps import CounterCharge
from governor.store import SQLiteStore
store = SQLiteStore(sys.argv[1], busy_timeout=30)
admitted = 0
for i in range(int(sys.argv[2])):
    charges = [CounterCharge("per_day", "tokens", 7, 500), CounterCharge("per_session", "tokens", 7, 200)]
    r = store.reserve("agent", sys.argv[3], charges, 1699999980.0 + i)
    if r.ok:
        admitted += 7
        store.commit(r.id, None, 1699999980.0 + i)
print(json.dumps(admitted))
store.close()
"""


def test_processes_racing_on_one_file_never_pass_a_cap(tmp_path: Path):
    path = tmp_path / "state.db"
    SQLiteStore(path).close()  # schema first, so the racers only race on counters
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(path), "40", f"s{i}"], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    admitted = []
    for p in racers:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        admitted.append(json.loads(out))
    # each session may take 200 (28 reserves of 7 = 196); together the day allows 500 (71 of 7 = 497)
    assert all(a <= 200 for a in admitted)
    assert sum(admitted) == 497
    with SQLiteStore(path) as store:
        assert store.snapshot("agent", "s0", T0 + 100, [DAY_TOKENS]) == {DAY_TOKENS: 497}


def test_two_stores_on_one_file_share_counters(tmp_path: Path):
    path = tmp_path / "state.db"
    with SQLiteStore(path) as a, SQLiteStore(path) as b:
        assert a.reserve("agent", "s1", [CounterCharge("per_day", "tokens", 600, 1000)], T0).ok
        refused = b.reserve("agent", "s2", [CounterCharge("per_day", "tokens", 600, 1000)], T0)
        assert not refused.ok and refused.observed == 600


def test_the_file_is_in_wal_mode_with_a_schema_version(tmp_path: Path):
    path = tmp_path / "state.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    finally:
        conn.close()


def test_a_file_of_a_newer_schema_is_refused(tmp_path: Path):
    path = tmp_path / "state.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        SQLiteStore(path)


def test_each_thread_gets_its_own_connection(tmp_path: Path):
    with SQLiteStore(tmp_path / "state.db") as store:
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                for j in range(20):
                    r = store.reserve("agent", f"s{i}", [CounterCharge("per_day", "tokens", 1, None)], T0 + j)
                    store.commit(r.id, None, T0 + j)
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.snapshot("agent", "s0", T0 + 20, [DAY_TOKENS]) == {DAY_TOKENS: 80}


# --- failing closed -------------------------------------------------------------------


def test_a_store_in_a_missing_directory_is_unavailable(tmp_path: Path):
    with pytest.raises(StoreUnavailable, match="no-such-dir.*(cannot open its lock file|unable to open)"):
        SQLiteStore(tmp_path / "no-such-dir" / "state.db")


def test_a_store_whose_directory_was_removed_is_unavailable_to_new_connections(tmp_path: Path):
    directory = tmp_path / "state"
    directory.mkdir()
    store = SQLiteStore(directory / "state.db")
    store.add("agent", "s1", [TOKENS_DAY], T0)
    shutil.rmtree(directory)
    failures: list[BaseException] = []

    def other_thread() -> None:
        try:
            store.reserve("agent", "s1", [TOKENS_DAY], T0)
        except BaseException as exc:  # noqa: BLE001 (inspected below)
            failures.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    store.close()
    assert len(failures) == 1 and isinstance(failures[0], StoreUnavailable), failures


def test_a_file_that_is_not_a_database_is_unavailable(tmp_path: Path):
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not an SQLite database, it is a text file" * 100)
    with pytest.raises(StoreUnavailable, match="not a database"):
        SQLiteStore(path)


def test_a_write_lock_held_too_long_fails_closed_and_changes_nothing(tmp_path: Path):
    path = tmp_path / "state.db"
    with SQLiteStore(path, busy_timeout=0.05) as store:
        store.add("agent", "s1", [TOKENS_DAY], T0)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreUnavailable, match="locked"):
                store.reserve("agent", "s1", [TOKENS_DAY], T0)
            with pytest.raises(StoreUnavailable):
                store.save_session("s1", {"iterations": 1})
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert store.snapshot("agent", "s1", T0) == {DAY_TOKENS: 100}
        assert store.load_session("s1") is None
        assert store.reserve("agent", "s1", [TOKENS_DAY], T0).ok  # and works again once free


def test_synchronous_must_be_normal_or_full(tmp_path: Path):
    with pytest.raises(ValueError):
        SQLiteStore(tmp_path / "state.db", synchronous="OFF")


# --- open_store -----------------------------------------------------------------------


def test_open_store_reads_urls_and_paths(tmp_path: Path):
    """The shared SQLite store on request; a plain path or URL opens the write-behind store
    (tests/test_store_writebehind.py)."""
    assert isinstance(open_store("memory:"), MemoryStore)
    for location in (f"sqlite://{tmp_path}/a.db?shared=true", f"sqlite://{tmp_path}/b.db?synchronous=full&shared=true"):
        store = open_store(location)
        assert isinstance(store, SQLiteStore)
        store.close()
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["a.db", "b.db"]


@pytest.mark.parametrize(
    # ids fixed: xdist's workers must collect the same names (the path is random a process)
    "location", ["ftp://x/y", "sqlite://", pytest.param(f"sqlite:///tmp/{uuid.uuid4().hex}.db?journal=off",
                                                         id="sqlite:///tmp/RANDOM.db?journal=off")]
)
def test_open_store_refuses_what_it_cannot_open(location: str):
    with pytest.raises(ValueError):
        open_store(location)
