"""Runtime §2: budgets (tokens, cost_usd, wall_clock_sec; per session and per rolling day)."""

from __future__ import annotations

import pytest

from governor.adapters.refusals import describe
from governor.policy import (
    ON_BUDGET_EXHAUSTED,
    Action,
    ModelCall,
    PersonaSpawn,
    PolicyConfig,
    SessionEnd,
    Tick,
    Tier,
    UsageReport,
)
from governor.policy.pricing import ModelPrice, PricingTable
from governor.runtime.api import governor_object
from tests.test_policy_support import PRICING, T0, Driver, StoreRefused, budget, full_passport, passport, tools, with_runtime

TOKENS_S = ("per_session", None, "tokens")
COST_S = ("per_session", None, "cost_usd")


def test_s2_projects_usage_before_admission():
    driver = Driver(passport(**budget(tokens={"per_session": 1000})))
    driver.counters[TOKENS_S] = 300.0
    # 300 used + 800 expected = 1100 > 1000: refused before the call goes upstream,
    # although the counter itself is well under the cap
    decision = driver.run(ModelCall("gpt-4o", 500, 300))
    assert decision.action is Action.HALT and decision.cause == ON_BUDGET_EXHAUSTED
    assert decision.details["observed"] == 300.0 and decision.details["projected"] == 1100.0
    assert decision.details["limit"] == 1000.0
    assert decision.charges == ()  # nothing is reserved for a refused step


def test_s2_reaching_the_cap_exactly_is_permitted():
    driver = Driver(passport(**budget(tokens={"per_session": 1000})))
    driver.counters[TOKENS_S] = 200.0
    assert driver.run(ModelCall("gpt-4o", 500, 300)).action is Action.PERMIT


def test_s2_identifies_dimension_and_scope():
    driver = Driver(passport(**budget(tokens={"per_session": 10**9}, cost_usd={"per_session": 100, "per_day": 1.0})))
    driver.counters[("per_day", None, "cost_usd")] = 0.99
    decision = driver.run(ModelCall("gpt-4o", 10_000, 0))  # $0.025
    assert (decision.details["dimension"], decision.details["scope"]) == ("cost_usd", "per_day")
    assert decision.event["detail"]["limit"] == 1.0


def test_s2_charges_every_declared_cap_for_the_store_to_reserve_atomically():
    doc = budget(tokens={"per_session": 10_000, "per_day": 100_000}, cost_usd={"per_day": 5.0})
    decision = Driver(passport(**doc)).run(ModelCall("gpt-4o-2024-08-06", 1000, 500))
    charges = {(c.scope, c.persona, c.dimension): (c.amount, c.cap) for c in decision.charges}
    expected_cost = (1000 * 2.50 + 500 * 10.00) / 1e6
    assert charges == {
        ("per_session", None, "tokens"): (1500, 10_000.0),
        ("per_day", None, "tokens"): (1500, 100_000.0),
        ("per_session", None, "cost_usd"): (pytest.approx(expected_cost), None),  # tracked, not capped
        ("per_day", None, "cost_usd"): (pytest.approx(expected_cost), 5.0),
    }


def test_s2_store_race_redecides_to_budget_exhausted():
    """Two sessions share the per-day counter; the loser of the race re-decides."""
    shared: dict = {}
    doc = passport(**budget(tokens={"per_day": 1000}))
    first, second = Driver(doc, session="a", counters=shared), Driver(doc, session="b", counters=shared)
    stale = second.snapshot(ModelCall("gpt-4o", 300, 300))  # b reads the counters...
    first.run(ModelCall("gpt-4o", 300, 300))  # ...a reserves 600 meanwhile
    from governor.policy import decide

    racing = decide(second.limits, stale, ModelCall("gpt-4o", 300, 300), T0)
    assert racing.action is Action.PERMIT  # decided on the stale snapshot
    with pytest.raises(StoreRefused):
        second.apply(ModelCall("gpt-4o", 300, 300), racing)  # the store refuses atomically
    redecided = second.run(ModelCall("gpt-4o", 300, 300))  # fresh snapshot
    assert redecided.cause == ON_BUDGET_EXHAUSTED and redecided.details["scope"] == "per_day"
    assert redecided.details["observed"] == 600.0


def test_s2_per_day_counts_across_sessions_per_session_does_not():
    shared: dict = {}
    doc = passport(**budget(tokens={"per_session": 1000, "per_day": 1500}))
    a = Driver(doc, session="a", counters=shared)
    a.call("gpt-4o", 400, 400)
    # per-session counters are the session's own: the runtime keys them per session; the
    # fake store here is shared, so model a new session by clearing its per-session key
    shared.pop(TOKENS_S)
    b = Driver(doc, session="b", counters=shared)
    decision = b.run(ModelCall("gpt-4o", 400, 400))
    assert decision.cause == ON_BUDGET_EXHAUSTED and decision.details["scope"] == "per_day"


def test_s2_usage_replaces_the_reservation():
    driver = Driver(passport(**budget(tokens={"per_session": 10_000})))
    admitted = driver.run(ModelCall("gpt-4o", 1000, 4000))
    assert driver.counters[TOKENS_S] == 5000  # reserved
    usage = driver.run(UsageReport("gpt-4o", 1000, 250, reserved=admitted.charges))
    assert usage.settles and usage.action is Action.PERMIT
    assert all(c.cap is None for c in usage.charges)
    assert driver.counters[TOKENS_S] == 1250  # reservation released, actual committed


def test_s2_final_usage_is_recorded_even_when_it_overshoots():
    driver = Driver(passport(**budget(tokens={"per_session": 1000})))
    admitted = driver.run(ModelCall("gpt-4o", 400, 400))
    usage = driver.run(UsageReport("gpt-4o", 400, 900, reserved=admitted.charges))
    assert usage.settles and usage.halts and usage.cause == ON_BUDGET_EXHAUSTED
    assert usage.details["actual"] is True and usage.details["projected"] == 1300
    assert driver.counters[TOKENS_S] == 1300  # the consumption happened: it is counted
    # the call's own figures, for a message that names what was used (not "used 0")
    assert (usage.details["call_used"], usage.details["call_reserved"], usage.details["observed"]) == (1300, 800, 0)
    text = describe(governor_object(usage, "s"))
    assert "used 1300 > limit 1000 (this call 1300, 800 reserved for it; the rest of the session 0)" in text


def test_s2_running_stream_total_crossing_a_cap_cuts_the_stream():
    driver = Driver(passport(**budget(tokens={"per_session": 1000})))
    admitted = driver.run(ModelCall("gpt-4o", 200, 500))
    ok = driver.decide(UsageReport("gpt-4o", 200, 600, final=False, reserved=admitted.charges))
    assert ok.action is Action.PERMIT and ok.charges == () and not ok.settles  # not committed
    cut = driver.run(UsageReport("gpt-4o", 200, 801, final=False, reserved=admitted.charges))
    assert cut.halts and cut.details["final"] is False
    # the proxy cuts the stream; the usage so far still settles, after the halt
    final = driver.run(UsageReport("gpt-4o", 200, 801, reserved=admitted.charges))
    assert final.halts and final.settles and driver.counters[TOKENS_S] == 1001


def test_s2_persona_draws_down_parent_aggregate_and_its_own_share():
    doc = passport(
        tools=tools("search"),
        permissions={
            "resource_limits": {"budget": {"tokens": {"per_session": 10_000}}},
            "sub_agents": [{"name": "helper", "budget_share": {"tokens": {"per_session": 1000}}}],
        },
    )
    driver = Driver(doc)
    decision = driver.run(ModelCall("gpt-4o", 300, 300, persona="helper"))
    keys = {(c.scope, c.persona, c.dimension): c.cap for c in decision.charges}
    assert keys[TOKENS_S] == 10_000.0  # the parent's aggregate counter
    assert keys[("per_session", "helper", "tokens")] == 1000.0  # and the persona's own share
    # the share binds the persona...
    refused = driver.run(ModelCall("gpt-4o", 300, 300, persona="helper"))
    assert refused.cause == ON_BUDGET_EXHAUSTED and refused.details["budget_share"] == "helper"
    assert refused.details["persona"] == "helper" and refused.details["observed"] == 600.0


def test_s2_persona_does_not_get_a_fresh_budget():
    doc = passport(permissions={
        "resource_limits": {"budget": {"tokens": {"per_session": 1000}}},
        "sub_agents": [{"name": "helper", "budget_share": {"tokens": {"per_session": 5000}}}],
    })
    driver = Driver(doc)
    driver.call("gpt-4o", 400, 400)  # the parent used 800
    refused = driver.run(ModelCall("gpt-4o", 150, 150, persona="helper"))
    assert refused.cause == ON_BUDGET_EXHAUSTED and refused.details["persona"] == "helper"
    assert "budget_share" not in refused.details  # the parent's aggregate cap is the ceiling


def test_s2_wall_clock_is_charged_on_tick_and_enforced():
    driver = Driver(passport(**budget(wall_clock_sec={"per_session": 60, "per_day": 1000})))
    tick = driver.run(Tick(), now=T0 + 30)
    assert tick.settles and {c.amount for c in tick.charges} == {30.0}
    assert driver.counters[("per_session", None, "wall_clock_sec")] == 30.0
    # admission projects the time not yet charged: 30 charged + 35 elapsed > 60
    refused = driver.run(ModelCall("gpt-4o", 1, 1), now=T0 + 65)
    assert refused.cause == ON_BUDGET_EXHAUSTED and refused.details["dimension"] == "wall_clock_sec"
    assert refused.details["projected"] == 65.0


def test_s2_wall_clock_per_day_is_shared_across_sessions():
    shared = {("per_day", None, "wall_clock_sec"): 990.0}
    driver = Driver(passport(**budget(wall_clock_sec={"per_day": 1000})), counters=shared)
    tick = driver.run(Tick(), now=T0 + 11)
    assert tick.halts and tick.details["scope"] == "per_day" and tick.settles
    assert shared[("per_day", None, "wall_clock_sec")] == 1001.0  # elapsed time is counted anyway


def test_s2_max_duration_sec():
    doc = passport(permissions={"resource_limits": {"max_duration_sec": 300}})
    driver = Driver(doc)
    assert driver.run(ModelCall("gpt-4o", 1, 1), now=T0 + 300).action is Action.PERMIT
    decision = driver.run(Tick(), now=T0 + 301)
    assert decision.halts and decision.details["limit_name"] == "max_duration_sec"
    assert decision.details["observed"] == 301.0


def test_s2_warning_once_per_dimension_and_scope():
    driver = Driver(passport(**budget(tokens={"per_session": 1000, "per_day": 100_000})),
                    config=PolicyConfig(warn_fraction=0.5))
    first = driver.run(ModelCall("gpt-4o", 300, 100))
    assert first.warnings == () and first.event is None
    second = driver.run(ModelCall("gpt-4o", 100, 100))  # 600 of 1000
    assert second.warnings == (("tokens", "per_session", 0.6),)
    # recorded in the signed record (#32 item 7), and the step goes ahead as a plain permit
    assert second.action is Action.PERMIT and not second.blocks and second.cause is None
    assert [e["cause"] for e in second.events] == ["on_governor_budget_warning"]
    assert second.event["action"] == "continue" and "overridden_cause" not in second.event["detail"]
    assert {k: second.event["detail"][k] for k in ("dimension", "scope", "fraction", "threshold", "limit", "observed")} \
        == {"dimension": "tokens", "scope": "per_session", "fraction": 0.6, "threshold": 0.5, "limit": 1000.0, "observed": 600.0}
    third = driver.run(ModelCall("gpt-4o", 100, 100))
    assert third.warnings == () and third.event is None  # remembered in the state: fires once
    assert ("tokens", "per_session") in driver.state.warned


def test_s2_warnings_are_recorded_at_every_tier_and_beside_an_observed_cause():
    for tier in (Tier.R1, Tier.R2, Tier.R3):
        driver = Driver(passport(**budget(tokens={"per_session": 1000})), tier=tier, config=PolicyConfig(warn_fraction=0.5))
        decision = driver.run(ModelCall("gpt-4o", 400, 200))
        assert [e["cause"] for e in decision.events] == ["on_governor_budget_warning"], tier
    # at R1 a call past the cap is observed: the warning comes first, then the exhaustion
    driver = Driver(passport(**budget(tokens={"per_session": 1000})), tier=Tier.R1, config=PolicyConfig(warn_fraction=0.5))
    over = driver.run(ModelCall("gpt-4o", 900, 200))
    assert [e["cause"] for e in over.events] == ["on_budget_exhausted"]  # past the cap: no warning, the boundary


def test_s2_unpriced_model_is_refused_where_cost_is_governed():
    driver = Driver(passport(**budget(cost_usd={"per_session": 10})))
    decision = driver.run(ModelCall("mystery-model-7", 10, 10))
    assert decision.halts and decision.cause == ON_BUDGET_EXHAUSTED and decision.fail_closed
    assert decision.details["reason"] == "unpriced_model" and decision.details["model"] == "mystery-model-7"
    assert decision.details["dimension"] == "cost_usd"


def test_s2_unpriced_model_counts_tokens_only_where_cost_is_not_governed():
    driver = Driver(passport(**budget(tokens={"per_session": 1000})))
    decision = driver.run(ModelCall("mystery-model-7", 10, 10))
    assert decision.action is Action.PERMIT
    assert {c.dimension for c in decision.charges} == {"tokens"}


def test_s2_default_price_is_an_explicit_opt_in():
    priced = PricingTable(PRICING.families, default=ModelPrice("default", 1.0, 2.0, 1.0), resolver=PRICING.resolver)
    driver = Driver(passport(**budget(cost_usd={"per_session": 10})), pricing=priced)
    decision = driver.run(ModelCall("mystery-model-7", 1_000_000, 1_000_000))
    assert decision.action is Action.PERMIT
    cost = [c.amount for c in decision.charges if c.dimension == "cost_usd"]
    assert cost == [3.0, 3.0]


def test_s2_cached_input_is_priced_at_the_cached_rate():
    driver = Driver(passport(**budget(cost_usd={"per_session": 10})))
    admitted = driver.run(ModelCall("claude-sonnet-4-20250514", 1_000_000, 0))
    usage = driver.run(UsageReport("claude-sonnet-4-20250514", 1_000_000, 100_000, cached_input_tokens=800_000,
                                   reserved=admitted.charges))
    cost = next(c.amount for c in usage.charges if c.dimension == "cost_usd" and c.scope == "per_session")
    assert cost == pytest.approx(0.2 * 3.00 + 0.8 * 0.30 + 0.1 * 15.00)


def test_s2_r1_records_boundary_without_blocking():
    driver = Driver(passport(**budget(tokens={"per_session": 100})), tier=Tier.R1)
    decision = driver.run(ModelCall("gpt-4o", 80, 80))
    assert not decision.blocks and decision.event["detail"]["would"] == "halt"
    assert driver.state.iterations == 1 and driver.counters[TOKENS_S] == 160


def test_s2_spawn_records_aggregate_draw_down():
    doc = passport(permissions={"resource_limits": {"budget": {"tokens": {"per_session": 10_000}}},
                                "sub_agents": [{"name": "helper"}]})
    driver = Driver(doc)
    driver.call("gpt-4o", 100, 50)
    decision = driver.run(PersonaSpawn("helper"))
    assert decision.details["draw_down"]["tokens"] == 150.0


def test_s2_session_end_settles_the_last_wall_clock_interval():
    driver = Driver(passport(**budget(wall_clock_sec={"per_session": 600})))
    driver.run(Tick(), now=T0 + 10)
    end = driver.run(SessionEnd(), now=T0 + 25)
    assert end.settles and driver.counters[("per_session", None, "wall_clock_sec")] == 25.0
    assert driver.state.ended


@pytest.mark.parametrize("bad", [0, -1, "10", True, float("inf")])
def test_s2_undeclarable_cap_refuses_the_passport(bad):
    from governor.policy import LimitsError, compile_limits

    with pytest.raises(LimitsError, match="budget.tokens.per_session: must be a positive number"):
        compile_limits(passport(**budget(tokens={"per_session": bad})), tier=Tier.R2, pricing=PRICING)


def test_s2_counter_keys_name_everything_the_projection_reads():
    doc = with_runtime(
        passport(permissions={
            "resource_limits": {"budget": {"tokens": {"per_session": 10}, "wall_clock_sec": {"per_day": 99}}},
            "sub_agents": [{"name": "helper", "budget_share": {"cost_usd": {"per_day": 1}}}],
        }),
    )
    limits = Driver(doc).limits
    keys = set(limits.counter_keys(ModelCall("gpt-4o", 1, 1, persona="helper")))
    assert {("per_session", None, "tokens"), ("per_day", None, "cost_usd"), ("per_day", "helper", "cost_usd"),
            ("per_day", None, "wall_clock_sec")} <= keys


def test_s2_persona_wall_clock_counts_while_an_instance_is_live():
    doc = passport(permissions={
        "resource_limits": {"budget": {"wall_clock_sec": {"per_session": 10_000}}},
        "sub_agents": [{"name": "helper", "budget_share": {"wall_clock_sec": {"per_session": 60}}}],
    })
    driver = Driver(doc)
    driver.run(Tick(), now=T0 + 100)  # no helper alive yet: only the parent's clock runs
    assert ("per_session", "helper", "wall_clock_sec") not in driver.counters
    driver.run(PersonaSpawn("helper"), now=T0 + 100)
    driver.run(Tick(), now=T0 + 140)
    assert driver.counters[("per_session", "helper", "wall_clock_sec")] == 40.0
    assert driver.counters[("per_session", None, "wall_clock_sec")] == 140.0  # the aggregate
    over = driver.run(Tick(), now=T0 + 161)
    assert over.halts and over.details["budget_share"] == "helper" and over.details["projected"] == 61.0


# --- a halt while other model calls are in flight -------------------------------------


def test_s6_an_answer_admitted_before_a_halt_is_delivered_within_its_reservation():
    from governor.policy import StepDone

    driver = Driver(passport(**budget(tokens={"per_session": 1000, "per_day": 10_000})))
    first = driver.run(ModelCall(model="gpt-4o-mini", expected_input_tokens=100, expected_output_tokens=300))
    second = driver.run(ModelCall(model="gpt-4o-mini", expected_input_tokens=100, expected_output_tokens=300))
    assert not first.blocks and not second.blocks and driver.state.in_flight == 2
    # a third call would overshoot: the session halts while the first two are in flight
    assert driver.run(ModelCall(model="gpt-4o-mini", expected_input_tokens=100, expected_output_tokens=300)).halts
    within = driver.run(UsageReport(model="gpt-4o-mini", input_tokens=100, output_tokens=250, reserved=first.charges))
    assert within.action is Action.PERMIT and within.settles and within.details["admitted_before_halt"]
    beyond = driver.run(UsageReport(model="gpt-4o-mini", input_tokens=100, output_tokens=900,
                                    final=False, reserved=second.charges))
    assert beyond.halts  # past what was reserved for it: cut
    # in-flight slots are freed after the halt too, so the session can go idle and end
    driver.run(StepDone("model"))
    driver.run(StepDone("model"))
    assert driver.state.in_flight == 0
    # nothing new goes ahead
    assert driver.run(ModelCall(model="gpt-4o-mini", expected_input_tokens=1, expected_output_tokens=1)).halts


# --- usage within its reservation ------------------------------------------------------


def test_s2_usage_within_its_reservation_is_settled_without_reading_the_counters():
    doc = budget(tokens={"per_session": 10_000, "per_day": 100_000}, cost_usd={"per_session": 5.0, "per_day": 50.0})
    driver = Driver(passport(**doc))
    admitted = driver.run(ModelCall("gpt-4o", 1000, 500))
    within = UsageReport("gpt-4o", 900, 500, reserved=admitted.charges)
    assert driver.limits.counter_keys(within) == ()  # no store read for it
    # whatever the counters hold now (even past a cap: others' usage), it settles its own use only
    driver.counters.update({k: 10**9 for k in driver.counters})
    decision = driver.run(within)
    assert decision.action is Action.PERMIT and decision.settles and not decision.events
    settled = {(c.scope, c.dimension): c.amount for c in decision.charges}
    assert settled[("per_session", "tokens")] == 1400
    assert settled[("per_day", "cost_usd")] == pytest.approx((900 * 2.50 + 500 * 10.00) / 1e6)


@pytest.mark.parametrize("usage, why", [
    (UsageReport("gpt-4o", 1001, 500), "more input than estimated"),
    (UsageReport("gpt-4o", 1000, 501), "more output than reserved"),
    (UsageReport("unknown-model", 10, 10), "an unpriced model"),
    (UsageReport("gpt-4o", 10, 10, final=False), "a running figure"),
])
def test_s2_usage_beyond_its_reservation_is_projected_against_the_counters(usage, why):
    driver = Driver(passport(**budget(tokens={"per_session": 10_000}, cost_usd={"per_session": 5.0})))
    admitted = driver.run(ModelCall("gpt-4o", 1000, 500))
    import dataclasses

    usage = dataclasses.replace(usage, reserved=admitted.charges)
    assert driver.limits.counter_keys(usage) != (), why


def test_a_usage_report_with_its_reservation_keeps_every_other_field():
    import dataclasses

    from governor.policy.steps import CounterCharge

    report = UsageReport("m", 1, 2, cached_input_tokens=3, persona="p", final=False, units=(("character", 9),))
    charges = (CounterCharge("per_session", "tokens", 3.0, None),)
    assert report.with_reserved(charges) == dataclasses.replace(report, reserved=charges)
    assert report.with_reserved(charges, ends_call=True) == dataclasses.replace(report, reserved=charges)  # not final
    final = dataclasses.replace(report, final=True)
    assert final.with_reserved(charges, ends_call=True) == dataclasses.replace(final, reserved=charges, ends_call=True)
    # with_reserved names every field: a new one must be added there too
    assert [f.name for f in dataclasses.fields(UsageReport)] == [
        "model", "input_tokens", "output_tokens", "cached_input_tokens", "persona", "final", "reserved", "ends_call", "units",
        "reported_output_tokens", "counted_output_tokens"]
    # the measured figures (not compared: equality is about what is charged) are carried too
    measured = dataclasses.replace(final, reported_output_tokens=1, counted_output_tokens=2).with_reserved(charges)
    assert (measured.reported_output_tokens, measured.counted_output_tokens) == (1, 2)


def test_charges_are_built_in_counter_charge_field_order():
    # the engine builds CounterCharge tuples directly (tuple.__new__) in this field order
    from governor.policy.steps import CounterCharge

    assert CounterCharge._fields == ("scope", "dimension", "amount", "cap", "persona")
    driver = Driver(full_passport(), tier=Tier.R3)
    decision = driver.run(ModelCall("gpt-4o", 1000, 500, persona="researcher"), T0)
    assert decision.charges and all(type(c) is CounterCharge for c in decision.charges)
    assert {(c.scope, c.dimension, c.persona) for c in decision.charges} >= {
        ("per_session", "tokens", None), ("per_session", "tokens", "researcher")}
    assert all(c.amount == 1500 for c in decision.charges if c.dimension == "tokens")
