"""Growing a stream's reservation: the pure part (governor.policy.extension) and the
runtime's (governor.runtime.stream_budget, through Runtime.usage on a real store)."""

from __future__ import annotations

import pytest

from governor.policy import ModelCall, UsageReport
from governor.policy.extension import HEADROOM_MIN, covered, extension, grown, headroom
from governor.policy.steps import CounterCharge
from governor.store import MemoryStore
from tests.test_policy_support import Driver, budget, passport

TOKENS_S = ("per_session", None, "tokens")
COST_D = ("per_day", None, "cost_usd")


def limits_for(**caps):
    return Driver(passport(**budget(**caps))).limits


def admitted(limits, expected_in: int, expected_out: int):
    """The charges a model call's admission reserves under `limits`."""
    from governor.policy import SessionState, decide

    decision = decide(limits, SessionState.start("s", 0.0), ModelCall("gpt-4o", expected_in, expected_out), 0.0)
    assert decision.charges
    return decision.charges


def running(output: int, input_tokens: int = 10) -> UsageReport:
    return UsageReport("gpt-4o", input_tokens, output, final=False)


def test_usage_within_the_reservation_is_covered_and_needs_nothing():
    limits = limits_for(tokens={"per_session": 10_000})
    reserved = admitted(limits, 10, 20)
    assert covered(limits, running(20), reserved)
    assert extension(limits, running(20), reserved, 0) == ()
    assert covered(limits, running(500), ())  # nothing reserved: nothing metered, nothing to grow


def test_usage_past_the_reservation_grows_every_counter_with_its_cap():
    limits = limits_for(tokens={"per_session": 10_000}, cost_usd={"per_day": 5.0})
    reserved = admitted(limits, 10, 20)
    report = running(100)
    assert not covered(limits, report, reserved)
    more = extension(limits, report, reserved, 0)
    by_key = {(c.scope, c.persona, c.dimension): c for c in more}
    assert by_key[TOKENS_S].amount == 110 - 30 and by_key[TOKENS_S].cap == 10_000
    assert by_key[COST_D].cap == 5.0 and by_key[COST_D].amount > 0
    after = grown(reserved, more)
    assert covered(limits, report, after)
    assert {(c.scope, c.persona, c.dimension): c.amount for c in after}[TOKENS_S] == 110
    assert len(after) == len(reserved)  # one charge per counter


def test_headroom_is_a_quarter_of_the_output_and_at_least_the_minimum():
    assert headroom(running(10)) == HEADROOM_MIN
    assert headroom(running(4000)) == 1000
    limits = limits_for(tokens={"per_session": 10_000})
    reserved = admitted(limits, 10, 20)
    more = extension(limits, running(4000), reserved, headroom(running(4000)))
    assert {(c.scope, c.persona, c.dimension): c.amount for c in more}[TOKENS_S] == 4010 + 1000 - 30


def test_an_unpriced_model_cannot_be_covered_while_cost_is_metered():
    limits = limits_for(cost_usd={"per_session": 1.0})
    reserved = (CounterCharge("per_session", "cost_usd", 0.01, 1.0),)
    assert extension(limits, UsageReport("no-such-model", 10, 500, final=False), reserved, 0) is None


# --- the runtime: Runtime.usage on a running report ------------------------------------------


@pytest.fixture
async def runtime(tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from governor.runtime.core import Runtime

    limits = limits_for(tokens={"per_session": 1_000})
    rt = Runtime(limits=limits, store=MemoryStore(), data_dir=tmp_path, key=Ed25519PrivateKey.generate(),
                 governor_id="did:web:localhost:governor", agent_id="agent", journal_sync=False)
    yield rt
    await rt.close()


async def test_a_running_report_past_the_reservation_grows_it_in_the_store(runtime):
    admission = await runtime.admit("s", ModelCall("gpt-4o", 10, 20))
    ticket = admission.ticket
    assert not runtime.covers(ticket, running(100))
    decision = await runtime.usage("s", ticket, running(100))
    assert not decision.blocks
    assert runtime.covers(ticket, running(100))
    held = runtime.store.snapshot("agent", "s", 0, [TOKENS_S])[TOKENS_S]
    assert held == 110 + HEADROOM_MIN  # the usage so far plus headroom, in the store
    final = await runtime.usage("s", ticket, UsageReport("gpt-4o", 10, 120))
    assert not final.blocks
    assert runtime.store.snapshot("agent", "s", 0, [TOKENS_S])[TOKENS_S] == 130  # settled at the actual


async def test_a_growth_past_the_cap_is_refused_recorded_and_the_stream_cut(runtime):
    first = (await runtime.admit("s", ModelCall("gpt-4o", 10, 20))).ticket
    second = (await runtime.admit("s", ModelCall("gpt-4o", 10, 800))).ticket  # 840 of 1,000 held
    assert not (await runtime.usage("s", first, running(150))).blocks  # exactly: 160 + 810 fits
    decision = await runtime.usage("s", first, running(200))  # 210 + 810 > 1,000
    assert decision.blocks and decision.cause == "on_budget_exhausted"
    assert runtime.store.snapshot("agent", "s", 0, [TOKENS_S])[TOKENS_S] <= 1_000
    # halted: a running report past what a call holds is cut, never grown
    assert (await runtime.usage("s", second, running(900))).blocks
    assert runtime.store.snapshot("agent", "s", 0, [TOKENS_S])[TOKENS_S] <= 1_000
    events = [e["cause"] for e in runtime.record("s")["events"]]
    assert "on_budget_exhausted" in events
