"""A counter edited into the SQLite state file so that it is not a count (docs/reference/stores.md,
"A count that is not a count"): the embedded stores meet the same damage as Redis, with the
same answer. On main the write-behind store summed text into a TypeError (or, for a negative
number, read it as credit), and the shared SQLite store's sums read text as zero.

Each step that reads the row raises CounterDamaged naming it; other sessions and agents go on;
the operator deletes or corrects the row with sqlite3 and the next step is served."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from governor.policy.steps import CounterCharge
from governor.store import CounterDamaged, SQLiteStore, StoreUnavailable, WriteBehindStore

T0 = 1_699_999_980.0
NEVER = 3600.0  # a flush interval no test waits for: close() writes
SESSION_TOKENS = ("per_session", None, "tokens")
DAY_TOKENS = ("per_day", None, "tokens")
STEP = [CounterCharge("per_session", "tokens", 5, 1000), CounterCharge("per_day", "tokens", 5, 1000)]


def open_store(kind: str, path: Path):
    return WriteBehindStore(path, flush_interval=NEVER) if kind == "write-behind" else SQLiteStore(path)


def edit(path: Path, statement: str, *args: object) -> None:
    """What an operator (or an attacker with the file) does with sqlite3 to the state file."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(statement, args)
    finally:
        conn.close()


def used(path: Path) -> None:
    """Counters for two sessions of agent "a" and one of agent "b", written to the file."""
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        for agent, session in (("a", "victim"), ("a", "bystander"), ("b", "other")):
            store.add(agent, session, STEP, T0)


# (what is edited, the statement, its arguments, the row CounterDamaged names)
EDITS = [
    ("session text", "UPDATE session_counters SET value = ? WHERE session = 'victim'", "lots",
     "session_counters(session='victim', persona='', dimension='tokens')"),
    ("session negative", "UPDATE session_counters SET value = ? WHERE session = 'victim'", -1000.0,
     "session_counters(session='victim', persona='', dimension='tokens')"),
    ("bucket infinite", "UPDATE day_buckets SET value = ? WHERE agent = 'a'", float("inf"),
     "day_buckets(agent='a', persona='', dimension='tokens', bucket="),
    ("bucket text", "UPDATE day_buckets SET value = ? WHERE agent = 'a'", "many",
     "day_buckets(agent='a', persona='', dimension='tokens', bucket="),
]


# the shared store reads a per_day counter's day_totals row, and its bucket rows only as they
# leave the window (the next test); the write-behind store sums the bucket rows when it loads
CASES = [(kind, *e) for kind in ("write-behind", "shared") for e in EDITS
         if kind == "write-behind" or e[0].startswith("session")]


@pytest.mark.parametrize("kind,what,statement,value,row", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_counter_edited_in_the_state_file_refuses_its_steps_until_the_row_is_mended(
        tmp_path: Path, kind: str, what: str, statement: str, value: object, row: str):
    path = tmp_path / "state.db"
    used(path)
    edit(path, statement, value)
    with open_store(kind, path) as store:
        for call in (lambda: store.reserve("a", "victim", STEP, T0),
                     lambda: store.snapshot("a", "victim", T0, [SESSION_TOKENS, DAY_TOKENS])):
            with pytest.raises(CounterDamaged) as raised:
                call()
            assert raised.value.key.startswith(row) and not isinstance(raised.value, StoreUnavailable)
            assert "is not a count" in str(raised.value)
        if what.startswith("session"):  # one session's counter: the agent's other sessions go on
            assert store.reserve("a", "bystander", STEP, T0).ok
        assert store.reserve("b", "other", STEP, T0).ok  # another agent's counters: untouched
        # the operator corrects the row while the store is open: the next step is served
        table = "session_counters" if what.startswith("session") else "day_buckets"
        edit(path, f"UPDATE {table} SET value = 5.0 WHERE value = ? OR typeof(value) = 'text'", value)
        assert store.reserve("a", "victim", STEP, T0).ok
        assert store.snapshot("a", "victim", T0, [SESSION_TOKENS])[SESSION_TOKENS] == 10.0


def test_a_day_total_or_an_expiring_bucket_edited_in_the_shared_file_is_named(tmp_path: Path):
    """The shared SQLite store's per_day counter: its day_totals row, and each bucket row as it
    leaves the window (subtracted from the total: on main a text bucket summed as zero and left
    its amount counted for good)."""
    path = tmp_path / "state.db"
    used(path)
    edit(path, "UPDATE day_totals SET total = 'lots' WHERE agent = 'a'")
    with SQLiteStore(path) as store:
        with pytest.raises(CounterDamaged) as raised:
            store.reserve("a", "victim", STEP, T0)
        assert raised.value.key == "day_totals(agent='a', persona='', dimension='tokens')"
        assert raised.value.found == "lots"
        edit(path, "UPDATE day_totals SET total = 10.0 WHERE agent = 'a'")  # corrected
        assert store.reserve("a", "victim", STEP, T0).ok
        edit(path, "UPDATE day_buckets SET value = 'many' WHERE agent = 'a'")
        later = T0 + 2 * 86400.0  # the bucket leaves the window
        for call in (lambda: store.snapshot("a", "victim", later, [DAY_TOKENS]),
                     lambda: store.reserve("a", "victim", STEP, later)):
            with pytest.raises(CounterDamaged) as raised:
                call()
            assert raised.value.key.startswith("day_buckets(agent='a'") and raised.value.found == "many"
        assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM day_buckets").fetchone()[0] == 2  # nothing dropped
        edit(path, "DELETE FROM day_buckets WHERE agent = 'a'")
        edit(path, "UPDATE day_totals SET total = 0.0 WHERE agent = 'a'")
        assert store.reserve("a", "victim", STEP, later).ok


def test_a_reservation_held_on_a_damaged_counter_at_open_is_settled_and_the_store_opens(tmp_path: Path):
    """The write-behind store loads the counters of every outstanding reservation at open: one
    on a damaged row no longer stops the governor from starting (on main: a TypeError at open).
    It is settled as reserved (it keeps counting, as settle_reservations does) and logged; the
    steps that read the row are refused as any other."""
    path = tmp_path / "state.db"
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        store.add("a", "victim", STEP, T0)
        held = store.reserve("a", "victim", STEP, T0)
        kept = store.reserve("a", "bystander", STEP, T0)
        assert held.ok and kept.ok
    edit(path, "UPDATE session_counters SET value = 'lots' WHERE session = 'victim'")
    with WriteBehindStore(path, flush_interval=NEVER) as store:
        assert store.release(held.id) is False  # settled at open
        assert store.release(kept.id) is True  # the sound one is outstanding as before
        with pytest.raises(CounterDamaged):
            store.reserve("a", "victim", STEP, T0)
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM reservations").fetchone()[0] == 0
