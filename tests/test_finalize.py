"""Start-up finalization of interrupted sessions and anti-swap on resumption, in process.

The end-to-end versions (kill -9 under load, a restart with caps x100, a shared store) are
in tests/test_restart.py; these pin down the pieces: what a finalized record holds, what is
left alone, what a changed pin records, and the §6 resolution of a resumed session's fault.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from governor.runtime.prices import price_book
from governor.evidence import Journal, SessionHeader, generate_key, verify_record
from governor.evidence.finalize import Pin, finalize_interrupted, has_ended
from governor.evidence.record import iso_utc, journal_path, record_path
from governor.policy import Action, SessionState, Tier, compile_limits, load_pricing
from governor.policy.integrity import pin_changed
from governor.store import SQLiteStore
from governor.runtime.resume import PIN_KEY, archive_passport
from tests.test_runtime import NOW, REPO, Clock, make_runtime, model_step, pinned  # noqa: F401 (fixture)

GOVERNOR = "did:web:localhost:governor"
DIGEST = "A" * 43


def header(session: str, digest: str = DIGEST, tier: str = "R2") -> SessionHeader:
    return SessionHeader(governor=GOVERNOR, subject_id="agent", passport_digest=digest, session=session, tier=tier,
                         start=NOW, limits={"budget": {"tokens": {"per_session": 20000}}})


def interrupted(data_dir, session: str, events: int = 2, **kwargs) -> Journal:
    journal = Journal.create(journal_path(data_dir, session), header(session, **kwargs), sync=False)
    for i in range(events):
        journal.append("on_budget_exhausted", "continue", NOW + i, {"observed": i})
    return journal


def test_an_interrupted_journal_is_ended_halted_signed_and_loses_nothing(tmp_path):
    key = generate_key()
    interrupted(tmp_path, "cut", events=3)
    path = journal_path(tmp_path, "cut")
    with open(path, "ab") as fh:  # the line being written when the governor died
        fh.write(b'{"kind":"event","body":{"seq":3,"cau')
    ended = Journal.create(journal_path(tmp_path, "done"), header("done"), sync=False)
    ended.end("completed", NOW + 5)

    report = finalize_interrupted(tmp_path, key=key, pin=Pin(DIGEST, "R2"), clock=lambda: NOW + 60)
    assert (sorted(f.session for f in report.finalized), report.already_ended, report.failed) == (["cut", "done"], 0, [])
    record = json.loads(record_path(tmp_path, "cut").read_text())
    assert record == next(f.record for f in report.finalized if f.session == "cut")
    assert verify_record(record, public_key=key.public_key()).ok
    assert record["outcome"] == "halted" and record["window"]["end"] == iso_utc(NOW + 60)
    events = record["events"]
    assert [e["detail"].get("observed") for e in events[:3]] == [0, 1, 2]
    assert (events[3]["cause"], events[3]["action"], events[3]["detail"]["reason"]) == \
        ("on_governor_error", "halt", "governor_stopped")
    assert events[3]["detail"]["last_recorded_at"] == events[2]["at"] and len(events) == 4
    [torn] = path.parent.glob("cut.jsonl.torn-*")  # the torn bytes are set aside, not dropped
    assert torn.read_bytes() == b'{"kind":"event","body":{"seq":3,"cau'
    assert has_ended(path)
    # ended before the governor died, but its record was never written: now it is, as it ended
    done = json.loads(record_path(tmp_path, "done").read_text())
    assert done["outcome"] == "completed" and done["events"] == [] and verify_record(done, public_key=key.public_key()).ok
    assert has_ended(journal_path(tmp_path, "done")) and journal_path(tmp_path, "done").read_bytes().count(b"\n") == 2
    # a second start finds nothing to do
    again = finalize_interrupted(tmp_path, key=key, pin=Pin(DIGEST, "R2"))
    assert (len(again.finalized), again.already_ended) == (0, 2)


def test_a_changed_pin_is_recorded_and_a_corrupt_journal_left_alone(tmp_path):
    key = generate_key()
    interrupted(tmp_path, "swapped")
    interrupted(tmp_path, "retiered", digest="B" * 43)
    interrupted(tmp_path, "damaged", events=3)
    path = journal_path(tmp_path, "damaged")
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"observed":0', b'"observed":9')  # not a crash: an edit
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()

    report = finalize_interrupted(tmp_path, key=key, pin=Pin("B" * 43, "R3"))
    assert sorted(f.session for f in report.finalized) == ["retiered", "swapped"]
    assert [p.name for p, _ in report.failed] == ["damaged.jsonl"] and path.read_bytes() == before
    for session, digest in (("swapped", DIGEST), ("retiered", "B" * 43)):
        record = json.loads(record_path(tmp_path, session).read_text())
        assert record["subject"]["passport_digest"] == digest  # still the pin it was admitted with
        [fault] = [e for e in record["events"] if e["cause"] == "on_governor_session_integrity"]
        assert fault["action"] == "halt"
        assert (fault["detail"]["pinned_digest"], fault["detail"]["admitted_digest"]) == (digest, "B" * 43)
        assert (fault["detail"]["pinned_tier"], fault["detail"]["configured_tier"]) == ("R2", "R3")
        assert verify_record(record, public_key=key.public_key()).ok


# a child that creates a session's journal and is killed (SIGKILL) the moment the first file
# for it is created in journals/, before a byte is written to it
_KILLED_WHILE_CREATING = textwrap.dedent("""
    import os, signal, sys
    from governor.evidence import Journal, SessionHeader
    from governor.evidence.record import journal_path
    data = sys.argv[1]
    real_open = os.open
    def open_then_die(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if flags & os.O_CREAT and "journals" in str(path):
            os.kill(os.getpid(), signal.SIGKILL)
        return fd
    os.open = open_then_die
    header = SessionHeader(governor="did:web:localhost:governor", subject_id="agent", passport_digest="A" * 43,
                           session="cut-at-birth", tier="R2", start=1.7e9)
    Journal.create(journal_path(data, "cut-at-birth"), header)
""")


def test_a_kill_while_a_journal_is_created_leaves_no_journal_without_a_header(tmp_path):
    """kill -9 between creating a session's journal file and writing its header (issue #19: one
    start in a loaded kill -9 run listed 379 of 380 interrupted sessions: the 380th journal was
    such an empty file, which could be neither finalized nor listed). The journal appears whole
    or not at all; the temp file the kill left is removed at the next start."""
    died = subprocess.run([sys.executable, "-c", _KILLED_WHILE_CREATING, str(tmp_path)], capture_output=True,
                          timeout=60)
    assert died.returncode == -9, died.stderr.decode()
    assert list((tmp_path / "journals").iterdir())  # it died with a file created
    assert not journal_path(tmp_path, "cut-at-birth").exists()  # but no journal

    report = finalize_interrupted(tmp_path, key=generate_key(), pin=Pin(DIGEST, "R2"))
    assert (report.finalized, report.failed, report.never_started) == ([], [], [])
    assert list((tmp_path / "journals").iterdir()) == []  # the temp file is gone
    # and the session's name is free: a request naming it again starts it afresh
    Journal.create(journal_path(tmp_path, "cut-at-birth"), header("cut-at-birth"), sync=False)


def test_a_journal_is_created_whole_without_hard_links_too(tmp_path, monkeypatch):
    """Where the file system refuses hard links (EPERM), the journal is still created whole, and
    an existing journal is never replaced."""
    import errno
    import os

    def no_links(*args):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = journal_path(tmp_path, "vfat")
    journal = Journal.create(path, header("vfat"), sync=False)
    journal.append("on_budget_exhausted", "continue", NOW, {"observed": 1})
    with pytest.raises(FileExistsError):
        Journal.create(path, header("vfat"), sync=False)
    assert Journal.open(path).record.events()[0]["detail"] == {"observed": 1}
    assert [p.name for p in path.parent.iterdir()] == ["vfat.jsonl"]


def test_a_journal_left_without_a_header_by_an_older_governor_is_set_aside(tmp_path):
    """A data directory from before journals were created whole may hold an empty journal, or
    a header cut short: its session never started (nothing was served in it), so it is set
    aside (never deleted) and counted, not left to fail every start."""
    key = generate_key()
    interrupted(tmp_path, "kept")
    journal_path(tmp_path, "empty").write_bytes(b"")
    journal_path(tmp_path, "cut").write_bytes(b'{"kind":"header","body":{"format":"gov')
    report = finalize_interrupted(tmp_path, key=key, pin=Pin(DIGEST, "R2"))
    assert [f.session for f in report.finalized] == ["kept"] and report.failed == []
    assert sorted(p.name for p in report.never_started) == ["cut.jsonl.torn-0", "empty.jsonl.torn-0"]
    assert journal_path(tmp_path, "cut").with_name("cut.jsonl.torn-0").read_bytes().startswith(b'{"kind":"header"')
    assert not journal_path(tmp_path, "empty").exists() and "never started" in report.describe()


def test_a_thousand_interrupted_journals(tmp_path):
    key = generate_key()
    for i in range(1000):
        interrupted(tmp_path, f"s{i:04d}", events=3)
    started = time.perf_counter()
    report = finalize_interrupted(tmp_path, key=key, pin=Pin(DIGEST, "R2"))  # fsyncs included
    took = time.perf_counter() - started
    assert len(report.finalized) == 1000 and not report.failed
    assert len(list((tmp_path / "records").glob("*.json"))) == 1000
    print(f"1000 interrupted journals finalized in {took:.2f} s")


# --- the runtime --------------------------------------------------------------------


async def test_finalized_sessions_are_listed_served_and_stay_ended(pinned, tmp_path):  # noqa: F811
    clock = Clock()
    first = make_runtime(pinned, tmp_path, clock)
    assert not (await model_step(first, "crashed", 100, 50)).decision.blocks
    first._save(first._sessions["crashed"])
    first.store.close()  # no end: as if killed

    clock.t += 120
    second = make_runtime(pinned, tmp_path, clock, key=first.key)
    report = await second.recover()
    try:
        assert [f.session for f in report.finalized] == ["crashed"]
        assert second.has_session("crashed")
        [view] = await second.sessions()
        assert (view["session"], view["state"], view["halt_cause"]) == ("crashed", "ended", "on_governor_error")
        record = second.record("crashed", nonce="n-123")
        assert record["nonce"] == "n-123" and record["outcome"] == "halted"
        assert verify_record(record, public_key=first.key.public_key(), passport=pinned.pinned.document).ok
        refused = await model_step(second, "crashed", 10, 10)
        assert refused.decision.blocks and refused.decision.action is Action.HALT
        saved = second.store.load_session("crashed")
        assert saved["halted"] and saved["ended"] and saved[PIN_KEY]["digest"] == pinned.digest
    finally:
        second.store.close()


async def test_a_saved_state_without_a_pin_is_resumed_halted(pinned, tmp_path):  # noqa: F811
    """A session in the store that names no pin (another writer, an older version): its pin is
    unknown, so it cannot be shown to match: fail closed."""
    clock = Clock()
    store = SQLiteStore(tmp_path / "state.db")
    store.save_session("foreign", SessionState.start("foreign", NOW).to_dict())
    rt = make_runtime(pinned, tmp_path, clock, store=store)
    try:
        refused = await model_step(rt, "foreign", 10, 10)
        assert refused.decision.blocks
        [fault] = rt.record("foreign")["events"]
        assert (fault["cause"], fault["action"], fault["detail"]["limits_in_force"]) == \
            ("on_governor_session_integrity", "halt", "unavailable")
    finally:
        store.close()


async def test_a_resumed_session_keeps_its_original_limits(pinned, tmp_path):  # noqa: F811
    """A session admitted under the example passport (20,000 tokens) resumed by a governor
    whose passport allows 100 times more, with `continue` declared for integrity faults."""
    clock = Clock()
    document = pinned.pinned.document
    document["runtime"]["degradation"]["on_governor_session_integrity"] = {"action": "continue"}
    from governor.passport import passport_digest

    original_digest = passport_digest(document)
    archive_passport(tmp_path, original_digest, json.dumps(document).encode())
    pricing = price_book()
    store = SQLiteStore(tmp_path / "state.db")
    state = SessionState.start("roaming", NOW).to_dict()
    store.save_session("roaming", {**state, PIN_KEY: {"digest": original_digest, "tier": "R2", "subject": "agent"}})
    looser = json.loads(json.dumps(document))
    looser["permissions"]["resource_limits"]["budget"]["tokens"] = {"per_session": 2_000_000, "per_day": 20_000_000}
    rt = make_runtime(pinned, tmp_path, clock, store=store)
    rt.limits = compile_limits(looser, tier=Tier.R2, pricing=pricing)
    try:
        assert not (await model_step(rt, "roaming", 100, 50)).decision.blocks
        refused = await model_step(rt, "roaming", 100, 50, expected_out=31_000)
        assert refused.decision.blocks and refused.decision.details["limit"] == 20_000
        fresh = await model_step(rt, "fresh", 100, 50, expected_out=31_000)
        assert not fresh.decision.blocks  # a new session gets the new passport
        caps = {(b["dimension"], b["scope"]): b["limit"] for b in (await rt.session_view("fresh"))["budgets"] if b["persona"] is None}
        assert caps[("tokens", "per_session")] == 2_000_000  # shown against the caps it is held to
        caps = {(b["dimension"], b["scope"]): b["limit"] for b in (await rt.session_view("roaming"))["budgets"] if b["persona"] is None}
        assert caps[("tokens", "per_session")] == 20_000  # the resumed session: its own passport's
        record = rt.record("roaming")
        assert record["subject"]["passport_digest"] == original_digest
        assert record["limits"]["budget"]["tokens"]["per_session"] == 20_000
        assert [e["cause"] for e in record["events"]][:1] == ["on_governor_session_integrity"]
    finally:
        store.close()


# --- the decision ---------------------------------------------------------------------


@pytest.mark.parametrize("declared, action, fail_closed", [
    (None, Action.HALT, True), ({"action": "continue"}, Action.CONTINUE, False),
    ({"action": "pause"}, Action.HALT, True), ({"action": "fallback", "value": "x"}, Action.FALLBACK, False),
])
def test_the_resumed_sessions_fault_resolves_with_its_own_degradation(pinned, declared, action, fail_closed):  # noqa: F811
    document = pinned.pinned.document
    if declared is not None:
        document["runtime"]["degradation"]["on_governor_session_integrity"] = declared
    limits = compile_limits(document, tier=Tier.R2, pricing=price_book())
    decision = pin_changed(limits, {"pinned_digest": "a", "admitted_digest": "b"})
    assert (decision.action, decision.fail_closed, decision.cause) == (action, fail_closed, "on_governor_session_integrity")
    assert decision.event["detail"]["reason"] == "pin_changed_across_restart"
    if action is not Action.HALT:
        assert decision.event["detail"]["overridden_cause"] == "on_governor_session_integrity"
    unknown = pin_changed(None, {})
    assert unknown.halts and unknown.fail_closed and unknown.event["detail"]["limits_in_force"] == "unavailable"
    # anti-swap has no tier exemption: R1 resolves the fault as R2 does
    at_r1 = pin_changed(compile_limits(document, tier=Tier.R1, pricing=limits.pricing), {})
    assert (at_r1.action, at_r1.enforced, at_r1.event["action"]) == (decision.action, True, decision.event["action"])
