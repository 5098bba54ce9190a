"""The statistical envelope in the runtime (#32 item 7), with a real SQLite store: calm sessions
build the agent's baseline across sessions and a restart, a burst in one window makes a sticky
deviation that the next sessions record as on_anomaly (§6: the fail-closed halt, or the declared
pause a reviewer answers), until the principal resets it (recorded in the audit journal)."""

from __future__ import annotations

import asyncio
import copy
import math
from pathlib import Path

import pytest

from governor.evidence import generate_key, verify_record
from governor.passport import AdmissionConfig, admit, example_passport_path, load_passport
from governor.policy import ModelCall, Tier, UsageReport, compile_limits
from governor.runtime.prices import price_book
from governor.policy.envelope import EnvelopeConfig
from governor.policy.steps import Action
from governor.runtime.core import Runtime
from governor.runtime.envelope import ON_GOVERNOR_ENVELOPE_RESET
from governor.store import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
NOW = 1_796_000_000.0
WINDOW = 60.0
BASE = math.ceil(NOW / WINDOW) * WINDOW  # the start of a window
CONFIG = EnvelopeConfig(window_sec=WINDOW, k=4.0, min_windows=4)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def pinned():
    report = admit(load_passport(example_passport_path()), AdmissionConfig(now=NOW))
    assert report.verified
    return report


def runtime_at_r3(pinned, data_dir: Path, clock: Clock, *, on_anomaly: dict | None = None, key=None,
                  store=None) -> Runtime:
    document = copy.deepcopy(pinned.pinned.document)
    del document["anomaly_baseline"]["cost_per_session_usd"]  # short sessions: not the subject here
    degradation = document["runtime"]["degradation"]
    if on_anomaly is None:
        del degradation["on_anomaly"]  # undeclared: the fail-closed halt
    else:
        degradation["on_anomaly"] = on_anomaly
    limits = compile_limits(document, tier=Tier.R3, pricing=price_book(),
                            passport_digest=pinned.digest)
    rt = Runtime(limits=limits, store=store or SQLiteStore(data_dir / "state.db"), data_dir=data_dir, key=key or generate_key(),
                 governor_id="did:web:localhost:governor", agent_id=pinned.pinned.id, clock=clock, owns_store=True)
    rt.envelope.config = CONFIG
    return rt


async def model_calls(rt: Runtime, session: str, n: int):
    last = None
    for _ in range(n):
        last = await rt.admit(session, ModelCall(model="gpt-4o-mini", expected_input_tokens=100, expected_output_tokens=50))
        if last.decision.blocks:
            return last
        await rt.usage(session, last.ticket, UsageReport(model="gpt-4o-mini", input_tokens=100, output_tokens=50))
        await rt.finish(session, last.ticket)
    return last


async def calm_then_burst(pinned, tmp_path: Path, clock: Clock, **kw) -> Runtime:
    """Five calm windows (2 calls each, one session per window), a restart, a burst of 24 calls in
    window 6 (three sessions); the runtime after the burst (its session ended), the clock in window 7."""
    rt = runtime_at_r3(pinned, tmp_path, clock, **kw)
    key = rt.key
    for i in range(5):
        clock.t = BASE + i * WINDOW + 1
        assert not (await model_calls(rt, f"calm-{i}", 2)).decision.blocks
        await rt.end_session(f"calm-{i}")
    await rt.close()
    rt = runtime_at_r3(pinned, tmp_path, clock, key=key, **kw)  # a restart: the baseline is in the store
    await rt.recover()
    clock.t = BASE + 6 * WINDOW + 1
    for part in range(3):  # three sessions of 8 calls (each within max_iterations): the burst is the agent's
        assert not (await model_calls(rt, f"burst-{part}", 8)).decision.blocks  # the window is open: no verdict
        record = await rt.end_session(f"burst-{part}")
        assert not [e for e in record["events"] if e["cause"] == "on_anomaly"]
    clock.t = BASE + 7 * WINDOW + 1
    return rt


async def test_a_burst_after_calm_windows_halts_the_next_sessions_until_the_principal_resets(pinned, tmp_path):
    clock = Clock(BASE)
    rt = await calm_then_burst(pinned, tmp_path, clock)
    try:
        stopped = await rt.admit("next", ModelCall(model="gpt-4o-mini", expected_input_tokens=100, expected_output_tokens=50))
        assert stopped.decision.halts and stopped.governor_object["cause"] == "on_anomaly"
        record = await rt.end_session("next")
        assert verify_record(record, public_key=rt.key.public_key()).ok
        (event,) = [e for e in record["events"] if e["cause"] == "on_anomaly"]
        assert event["action"] == "halt" and event["detail"]["across_sessions"] is True
        spikes = {d["metric"]: d for d in event["detail"]["deviations"] if d["kind"] == "envelope_rate_spike"}
        requests = spikes["requests"]
        assert requests["observed"] == 24 and requests["window"]["index"] == BASE // WINDOW + 6
        assert requests["baseline"] == {"windows": 5, "mean": 2.0, "sd": 0.0, "sd_used": 1.0}
        assert requests["statistic"] == 22.0 and requests["k"] == 4.0
        # sticky: another session of the agent records it too, in a later window still
        clock.t += WINDOW
        other = await rt.admit("other", ModelCall(model="gpt-4o-mini", expected_input_tokens=10, expected_output_tokens=5))
        assert other.decision.halts and other.governor_object["cause"] == "on_anomaly"
        view = await rt.envelope.view()
        assert view["deviation"]["window"] == BASE // WINDOW + 6 and view["closed_windows"] == 6
        # the principal resets it: recorded in the audit journal; new sessions go on
        reset = await rt.envelope.reset("principal")
        assert reset["reset"] is True and reset["cleared"]["id"] == view["deviation"]["id"]
        assert not (await model_calls(rt, "after-reset", 2)).decision.blocks
        audit = rt.audit_record()
        (entry,) = [e for e in audit["events"] if e["cause"] == ON_GOVERNOR_ENVELOPE_RESET]
        assert entry["detail"]["reset_by"] == "principal" and entry["detail"]["cleared"]["agent"] == rt.agent_id
        assert verify_record(audit, public_key=rt.key.public_key()).ok
        again = await rt.envelope.reset("principal")
        assert again == {"agent": rt.agent_id, "reset": False, "cleared": None}
    finally:
        await rt.close()


async def test_the_deviation_survives_a_restart(pinned, tmp_path):
    clock = Clock(BASE)
    rt = await calm_then_burst(pinned, tmp_path, clock)
    assert (await rt.admit("next", ModelCall(model="gpt-4o-mini", expected_input_tokens=1, expected_output_tokens=1))).decision.halts
    key = rt.key
    await rt.close()
    rt = runtime_at_r3(pinned, tmp_path, clock, key=key)
    await rt.recover()
    try:
        later = await rt.admit("later", ModelCall(model="gpt-4o-mini", expected_input_tokens=1, expected_output_tokens=1))
        assert later.decision.halts and later.governor_object["cause"] == "on_anomaly"
    finally:
        await rt.close()


async def test_a_declared_pause_holds_the_session_for_a_reviewer_then_the_step_goes_on(pinned, tmp_path):
    clock = Clock(BASE)
    rt = await calm_then_burst(pinned, tmp_path, clock, on_anomaly={"action": "pause", "message": "unusual"})
    try:
        admitting = asyncio.create_task(rt.admit(
            "next", ModelCall(model="gpt-4o-mini", expected_input_tokens=10, expected_output_tokens=5)))
        for _ in range(200):
            if rt.approvals():
                break
            await asyncio.sleep(0.01)
        (pending,) = rt.approvals()
        assert not admitting.done()
        await rt.resolve_approval(pending["id"], True, "reviewer-1")
        admission = await asyncio.wait_for(admitting, 10)
        assert not admission.decision.blocks and admission.decision.action is Action.PERMIT
        await rt.finish("next", admission.ticket)
        record = await rt.end_session("next")
        causes = [(e["cause"], e["action"]) for e in record["events"]]
        assert ("on_anomaly", "pause") in causes
    finally:
        await rt.close()


async def test_below_r3_nothing_is_counted(pinned, tmp_path):
    clock = Clock(BASE)
    document = pinned.pinned.document
    limits = compile_limits(document, tier=Tier.R2, pricing=price_book(),
                            passport_digest=pinned.digest)
    rt = Runtime(limits=limits, store=SQLiteStore(tmp_path / "state.db"), data_dir=tmp_path, key=generate_key(),
                 governor_id="did:web:localhost:governor", agent_id=pinned.pinned.id, clock=clock, owns_store=True)
    try:
        await model_calls(rt, "s", 3)
        assert not rt.envelope.opened  # never opened below R3
    finally:
        await rt.close()


def test_two_books_on_one_sqlite_file_merge_their_counts(tmp_path):
    """Processes that share one SQLite file (sqlite:///PATH?shared=true) feed one envelope: each
    feed reads and writes the agent's row in one transaction, so neither overwrites the other."""
    from governor.store.envelope_books import EnvelopeBook

    path = str(tmp_path / "state.db")
    a, b = EnvelopeBook(path), EnvelopeBook(path)
    try:
        for w in range(3):
            for book in (a, b):
                book.feed("agent", CONFIG, BASE + w * WINDOW + 1, {"requests": 1.0}, {"search": 1})
        state, closed = a.feed("agent", CONFIG, BASE + 3 * WINDOW + 1, {}, {})
        assert closed is not None and closed.counts == {"requests": 2.0} and closed.tools == {"search": 2}
        assert state.stats["requests"].n == 3 and state.stats["requests"].mean == 2.0
        assert b.load("agent").tool_history == {"search": 6}
        assert a.mark("agent", {"id": "first"})["id"] == "first" and b.mark("agent", {"id": "second"})["id"] == "first"
        assert b.reset("agent") == {"id": "first"} and a.load("agent").deviation is None
    finally:
        a.close()
        b.close()


async def test_a_book_that_fails_keeps_the_tally_for_the_next_flush(pinned, tmp_path):
    from governor.store import StoreError

    clock = Clock(BASE + 1)
    rt = runtime_at_r3(pinned, tmp_path, clock)
    try:
        await model_calls(rt, "s", 2)
        book = rt.envelope.book
        real = book.feed
        book.feed = lambda *args: (_ for _ in ()).throw(StoreError("disk full"))  # type: ignore[method-assign]
        clock.t += 2
        await rt.envelope.flush()  # logged; nothing lost
        book.feed = real  # type: ignore[method-assign]
        await rt.envelope.flush()
        assert (await rt.envelope.view())["current"]["requests"] == 2.0
    finally:
        await rt.close()
