"""The durable journal: fsync before append returns, kill -9 loses nothing, torn and
corrupt lines are reported, and a crashed session's record is finalized and verifies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from governor.evidence import (
    CorruptJournalError,
    Journal,
    JournalClosedError,
    TornJournalError,
    generate_key,
    journal_path,
    recover_journal,
    sign_record,
    verify_record,
)
from tests.conftest import REPO
from tests.test_evidence_record import EVENTS, START, header, spec_chain_ok


@pytest.fixture(scope="module")
def key():
    return generate_key()


def write_journal(path, events=EVENTS, end=None) -> Journal:
    journal = Journal.create(path, header())
    for offset, (cause, action, detail) in enumerate(events):
        journal.append(cause, action, START + offset + 1, detail)
    if end:
        journal.end(end, START + 100)
    return journal


def lines(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_journal_lines_and_round_trip(tmp_path, key):
    path = journal_path(tmp_path, "sess-42")
    with write_journal(path, end="completed") as journal:
        built = journal.record.build(outcome="completed", end=START + 100, iat=START + 101)
    raw = lines(path)
    assert len(raw) == 1 + len(EVENTS) + 1 and all(line.endswith(b"\n") for line in raw)
    entries = [json.loads(line) for line in raw]
    assert [e["kind"] for e in entries] == ["header"] + ["event"] * len(EVENTS) + ["end"]
    assert all(entries[i]["prev"] == entries[i - 1]["hash"] for i in range(1, len(entries)))
    assert oct(path.stat().st_mode & 0o777) == "0o600"

    recovery = recover_journal(path)
    assert recovery.torn_tail is None and recovery.outcome == "completed"
    assert recovery.end == "2026-11-18T11:08:20.000Z"
    again = recovery.build(iat=START + 101)
    assert again == built
    record = sign_record(again, key)
    assert verify_record(record, public_key=key.public_key()).ok and spec_chain_ok(record)


def test_append_returns_the_event_and_refuses_bad_ones_without_writing(tmp_path):
    path = tmp_path / "j.jsonl"
    journal = Journal.create(path, header())
    event = journal.append("on_budget_exhausted", "halt", START, {"observed": 3})
    assert event == {"seq": 0, "cause": "on_budget_exhausted", "action": "halt",
                     "at": "2026-11-18T11:06:40.000Z", "detail": {"observed": 3}}
    size = path.stat().st_size
    with pytest.raises(ValueError):
        journal.append("on_budget_exhausted", "deny", START)
    assert path.stat().st_size == size and len(journal.record) == 1
    assert journal.append("on_anomaly", "continue", START)["seq"] == 1


def test_create_never_overwrites_a_session_journal(tmp_path):
    path = tmp_path / "j.jsonl"
    write_journal(path).close()
    with pytest.raises(FileExistsError):
        Journal.create(path, header())
    assert len(recover_journal(path).events) == len(EVENTS)


def test_end_closes_the_journal_to_appends(tmp_path):
    journal = write_journal(tmp_path / "j.jsonl", end="paused")
    with pytest.raises(JournalClosedError, match="already ended"):
        journal.append("on_anomaly", "continue", START)
    journal.close()
    with pytest.raises(JournalClosedError):
        Journal.open(tmp_path / "j.jsonl").append("on_anomaly", "continue", START)


def test_reopen_and_continue_after_restart(tmp_path, key):
    path = tmp_path / "j.jsonl"
    write_journal(path, EVENTS[:2]).close()
    journal = Journal.open(path)
    assert len(journal.record) == 2
    assert journal.append("on_governor_error", "halt", START + 50, {"reason": "restarted"})["seq"] == 2
    journal.close()
    recovery = recover_journal(path)
    assert recovery.ending is None and recovery.outcome == "halted"
    record = sign_record(recovery.build(iat=START + 60), key)
    assert record["outcome"] == "halted" and len(record["events"]) == 3
    assert verify_record(record, public_key=key.public_key()).ok


def test_concurrent_appends_from_threads_keep_seq_and_chain(tmp_path, key):
    journal = Journal.create(tmp_path / "j.jsonl", header(), sync=False)

    def worker(n):
        for i in range(25):
            journal.append("on_tool_error", "continue", START + i, {"worker": n, "i": i})

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    journal.close()
    recovery = recover_journal(journal.path)
    assert len(recovery.events) == 100
    assert sorted((e["detail"]["worker"], e["detail"]["i"]) for e in recovery.events) == [
        (n, i) for n in range(4) for i in range(25)]
    assert verify_record(sign_record(recovery.build(iat=START), key), public_key=key.public_key()).ok


# --- torn tails and corruption ----------------------------------------------------------


def test_torn_last_line_is_reported_not_dropped_silently(tmp_path, key):
    path = tmp_path / "j.jsonl"
    write_journal(path).close()
    raw = lines(path)
    cut = len(raw[-1]) // 2
    path.write_bytes(b"".join(raw[:-1]) + raw[-1][:cut])

    recovery = recover_journal(path)
    torn = recovery.torn_tail
    assert torn is not None and torn.line == len(raw) and torn.data == raw[-1][:cut]
    assert torn.offset == sum(len(x) for x in raw[:-1]) and "cut short" in torn.reason
    assert len(recovery.events) == len(EVENTS) - 1
    assert f"torn last line {len(raw)}" in torn.describe()

    with pytest.raises(TornJournalError) as caught:
        Journal.open(path)
    assert caught.value.line == len(raw)

    record = sign_record(recovery.build(iat=START + 60), key)  # finalize what is intact
    assert verify_record(record, public_key=key.public_key()).ok


def test_repairing_a_torn_tail_sets_its_bytes_aside(tmp_path, key):
    path = tmp_path / "j.jsonl"
    write_journal(path).close()
    raw = lines(path)
    path.write_bytes(b"".join(raw[:-1]) + raw[-1][:10])
    journal = Journal.open(path, repair_torn_tail=True)
    assert journal.repaired is not None and journal.repaired.data == raw[-1][:10]
    aside = tmp_path / f"j.jsonl.torn-{journal.repaired.offset}"
    assert aside.read_bytes() == raw[-1][:10]
    journal.append("on_governor_error", "halt", START + 90, {"reason": "torn tail after crash", "line": len(raw)})
    journal.close()
    recovery = recover_journal(path)
    assert recovery.torn_tail is None and len(recovery.events) == len(EVENTS)
    assert verify_record(sign_record(recovery.build(iat=START + 91), key), public_key=key.public_key()).ok


def test_damaged_last_line_with_its_newline_is_a_torn_tail(tmp_path):
    path = tmp_path / "j.jsonl"
    write_journal(path).close()
    raw = lines(path)
    damaged = raw[-1].replace(b'"halt"', b'"hall"')
    assert damaged != raw[-1]
    path.write_bytes(b"".join(raw[:-1]) + damaged)
    recovery = recover_journal(path)
    assert recovery.torn_tail is not None and "checksum" in recovery.torn_tail.reason


@pytest.mark.parametrize("damage", ["flip", "garbage", "drop", "swap", "seq"])
def test_mid_journal_corruption_is_detected_with_its_line(tmp_path, damage):
    path = tmp_path / "j.jsonl"
    write_journal(path).close()
    raw = lines(path)
    if damage == "flip":
        raw[2] = raw[2].replace(b"on_tool_error", b"on_tool_errar")
    elif damage == "garbage":
        raw[2] = b"\x00\x00\x00\n"
    elif damage == "drop":
        del raw[2]
    elif damage == "swap":
        raw[2], raw[3] = raw[3], raw[2]
    elif damage == "seq":  # a well-formed, correctly hashed line with an impossible seq
        from governor.evidence.journal import encode_line

        entry = json.loads(raw[2])
        entry["body"]["seq"] = 7
        raw[2] = encode_line("event", entry["body"], entry["prev"])[0]
    path.write_bytes(b"".join(raw))
    with pytest.raises(CorruptJournalError) as caught:
        recover_journal(path)
    assert caught.value.line == 3
    with pytest.raises(CorruptJournalError):
        Journal.open(path, repair_torn_tail=True)


def test_journal_without_a_header(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"kind":"hea')
    with pytest.raises(CorruptJournalError, match="never started"):
        recover_journal(path)


# --- kill -9 ----------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, time
    from governor.evidence import Journal
    from tests.test_evidence_record import header
    journal = Journal.create(sys.argv[1], header())
    seq = 0
    while True:
        event = journal.append("on_tool_error", "continue", time.time(),
                               {"attempt": seq, "padding": "x" * (seq % 50) * 40})
        print(event["seq"], flush=True)
        seq += 1
""")


def test_kill_9_loses_no_event_whose_append_returned(tmp_path, key):
    path = tmp_path / "journals" / "crash.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    printed: list[int] = []
    try:
        for line in child.stdout:
            printed.append(int(line))
            if len(printed) >= 40:
                break
        child.send_signal(signal.SIGKILL)
        printed += [int(x) for x in child.stdout.read().split()]  # printed before the kill landed
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL, child.returncode
    assert printed == list(range(len(printed))) and len(printed) >= 40

    recovery = recover_journal(path)
    journaled = [e["detail"]["attempt"] for e in recovery.events]
    assert journaled[: len(printed)] == printed  # every acknowledged append is there
    assert len(journaled) <= len(printed) + 1  # at most the one in flight when killed
    assert recovery.ending is None and recovery.outcome == "halted"

    record = sign_record(recovery.build(iat=START + 10**6), key)
    assert record["outcome"] == "halted"
    assert verify_record(record, public_key=key.public_key()).ok and spec_chain_ok(record)
