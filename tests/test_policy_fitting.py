"""Output fitting in the decision point (governor.policy.fitting, issue #22 item 1): a model
call whose output limit does not fit its caps is lowered to the largest that fits, down to the
floor; below it the call is refused as budget-exhausted, projected at the floor."""

from __future__ import annotations

import pytest

from governor.policy import ON_BUDGET_EXHAUSTED, Action, ModelCall, Tier, UsageReport, decide, quiet_model_call
from governor.policy.fitting import FITTED_KEY, ON_OUTPUT_FITTED, fit_output
from tests.test_policy_support import T0, Driver, budget, full_passport, passport, with_runtime

TOKENS_S = ("per_session", None, "tokens")
TOKENS_D = ("per_day", None, "tokens")
COST_S = ("per_session", None, "cost_usd")


def call(output: int, *, input_tokens: int = 113, floor: int | None = 256, choices: int = 1,
         model: str = "gpt-4o", persona: str | None = None) -> ModelCall:
    return ModelCall(model, input_tokens, output * choices, persona=persona, output_floor=floor, output_choices=choices)


def reserved(decision, key) -> float:
    return next(c.amount for c in decision.charges if (c.scope, c.persona, c.dimension) == key)


def test_the_first_call_of_a_3000_token_budget_is_fitted_not_refused():
    driver = Driver(passport(**budget(tokens={"per_session": 3000})))
    decision = driver.run(call(4096))  # the request named no max_tokens: the guess
    assert decision.action is Action.PERMIT and not decision.blocks
    assert decision.details[FITTED_KEY] == 3000 - 113 - 16  # the input's margin left free
    assert reserved(decision, TOKENS_S) == 3000 - 16  # the reservation: all the rest
    event = decision.event
    assert event["cause"] == ON_OUTPUT_FITTED and event["action"] == "fallback"
    detail = event["detail"]
    assert detail["decision"] == "permit" and detail["output_tokens_requested"] == 4096
    assert detail[FITTED_KEY] == 2871 and detail["fit_floor"] == 256
    assert (detail["dimension"], detail["scope"], detail["observed"], detail["limit"]) == ("tokens", "per_session", 0.0, 3000.0)


def test_without_fitting_the_same_call_is_refused_on_the_guess():
    decision = Driver(passport(**budget(tokens={"per_session": 3000}))).run(call(4096, floor=None))
    assert decision.cause == ON_BUDGET_EXHAUSTED and decision.details["projected"] == 4209.0


def test_a_call_that_fits_is_left_alone_and_records_nothing():
    driver = Driver(passport(**budget(tokens={"per_session": 3000})))
    decision = driver.run(call(1000))
    assert decision.event is None and FITTED_KEY not in decision.details
    assert reserved(decision, TOKENS_S) == 1113


def test_fitting_follows_the_counters_down_to_the_floor_then_refuses_naming_used_and_limit():
    driver = Driver(passport(**budget(tokens={"per_session": 3000})))
    driver.counters[TOKENS_S] = 2500.0
    fitted = driver.run(call(4096))
    assert fitted.details[FITTED_KEY] == 3000 - 2500 - 113 - 16
    driver.counters[TOKENS_S] = 2700.0  # 171 left: below the floor of 256
    refused = driver.run(call(4096))
    assert refused.blocks and refused.cause == ON_BUDGET_EXHAUSTED
    details = refused.details
    assert details["observed"] == 2700.0 and details["limit"] == 3000.0
    assert details["projected"] == 2700 + 113 + 256  # the floor, not the 4,096 guess
    assert (details["fit_floor"], details["fit_room"], details["output_tokens_requested"]) == (256, 171, 4096)
    assert refused.event["detail"]["fit_floor"] == 256  # recorded as well


def test_a_call_short_of_the_floor_only_by_the_input_margin_goes_ahead_at_the_floor():
    driver = Driver(passport(**budget(tokens={"per_session": 3000})))
    driver.counters[TOKENS_S] = 3000.0 - 113 - 260  # 260 left: 244 after the margin, the floor 256 fits
    decision = driver.run(call(4096))
    assert not decision.blocks and decision.details[FITTED_KEY] == 256
    assert reserved(decision, TOKENS_S) == 113 + 256  # the reservation is what is sent: never more
    assert decision.event["detail"][FITTED_KEY] == 256


def test_a_request_below_the_floor_that_does_not_fit_is_projected_as_asked():
    driver = Driver(passport(**budget(tokens={"per_session": 300})))
    refused = driver.run(call(200))  # 113 + 200 > 300; 171 left is below the floor
    assert refused.blocks and refused.details["projected"] == 313


def test_the_tightest_cap_binds_per_day_and_persona_share_included():
    doc = budget(tokens={"per_session": 100_000, "per_day": 5_000})
    driver = Driver(passport(**doc))
    driver.counters[TOKENS_D] = 1_000.0
    decision = driver.run(call(8000))
    assert decision.details[FITTED_KEY] == 5_000 - 1_000 - 113 - 16
    assert decision.event["detail"]["scope"] == "per_day"

    persona = Driver(full_passport())
    persona.counters[("per_session", "researcher", "tokens")] = 999_000.0
    shared = persona.run(call(4096, persona="researcher"))
    assert shared.details[FITTED_KEY] == 1000 - 113 - 16
    assert shared.event["detail"]["budget_share"] == "researcher"
    assert shared.event["detail"]["persona"] == "researcher"


def test_a_cost_cap_fits_to_the_largest_output_whose_price_fits():
    # gpt-4o: $2.50 in, $10.00 out per million; $0.01 left after 113 input tokens and 16 of margin
    driver = Driver(passport(**budget(cost_usd={"per_session": 0.01})))
    decision = driver.run(call(4096))
    fitted = decision.details[FITTED_KEY]
    price_in = (113 + 16) * 2.50 / 1e6
    assert fitted == int((0.01 - price_in) * 1e6 / 10.0)  # 967
    assert reserved(decision, COST_S) <= 0.01
    assert ((113 + 16) * 2.50 + (fitted + 1) * 10.0) / 1e6 > 0.01  # one more token would not fit


@pytest.mark.parametrize("used", [0.0, 0.0012345, 0.003, 0.0099])
def test_a_fitted_cost_never_fails_its_own_projection(used):
    driver = Driver(passport(**budget(cost_usd={"per_session": 0.01})))
    driver.counters[COST_S] = used
    decision = driver.run(call(4096, floor=1))
    if decision.blocks:  # nothing at all fits
        assert used + 113 * 2.5e-6 + 1e-5 > 0.01
    else:
        assert used + reserved(decision, COST_S) <= 0.01


def test_choices_are_fitted_per_answer():
    driver = Driver(passport(**budget(tokens={"per_session": 3000})))
    decision = driver.run(call(1000, choices=4))  # 4,000 asked
    assert decision.details[FITTED_KEY] == (3000 - 113 - 16) // 4
    assert reserved(decision, TOKENS_S) == 113 + 4 * ((3000 - 113 - 16) // 4)
    assert decision.event["detail"]["choices"] == 4


def test_an_unpriced_model_under_a_cost_cap_is_refused_as_before():
    driver = Driver(passport(**budget(cost_usd={"per_session": 1.0})))
    decision = driver.run(call(4096, model="no-such-model"))
    assert decision.blocks and decision.details["reason"] == "unpriced_model"


def test_no_fitting_at_r1_or_under_a_declared_continue():
    doc = passport(**budget(tokens={"per_session": 3000}))
    observed = Driver(doc, tier=Tier.R1).run(call(4096))
    assert FITTED_KEY not in observed.details and observed.event["cause"] == ON_BUDGET_EXHAUSTED
    overridden = Driver(with_runtime(doc, degradation={"on_budget_exhausted": {"action": "continue"}})).run(call(4096))
    assert FITTED_KEY not in overridden.details and overridden.action is Action.CONTINUE


def test_a_fitted_call_settles_like_any_other():
    driver = Driver(passport(**budget(tokens={"per_session": 3000})))
    admitted = driver.run(call(4096))
    usage = driver.run(UsageReport("gpt-4o", 100, admitted.details[FITTED_KEY], reserved=admitted.charges))
    assert not usage.blocks and usage.settles
    assert driver.counters[TOKENS_S] == 100 + 2871


def test_the_quiet_path_never_admits_a_call_that_needs_fitting():
    driver = Driver(passport(**budget(tokens={"per_session": 3000})))
    step = call(4096)
    state = driver.snapshot(step)
    assert quiet_model_call(driver.limits, state, step, state.counters, T0) is None
    fits = call(1000)
    quiet = quiet_model_call(driver.limits, driver.snapshot(fits), fits, driver.snapshot(fits).counters, T0)
    assert quiet is not None and quiet[0] == decide(driver.limits, driver.snapshot(fits), fits, T0)


def test_the_input_margin_grows_with_a_large_prompt():
    driver = Driver(passport(**budget(tokens={"per_session": 160_000})))
    decision = driver.run(call(20_000, input_tokens=150_000))
    assert decision.details[FITTED_KEY] == 160_000 - 150_000 - 7_500  # 5% of the estimated input
    assert decision.blocks is False


def test_fit_output_alone():
    driver = Driver(passport(**budget(tokens={"per_session": 3000})))
    meters = driver.limits.meters[None]
    assert fit_output(driver.limits, {}, meters, call(2000), False) is None  # fits
    assert fit_output(driver.limits, {}, meters, call(4096, floor=None), False) is None  # off
    assert fit_output(driver.limits, {}, meters, call(4096), True) is None  # a reviewer released it past the budget
    assert fit_output(driver.limits, {}, meters, ModelCall("gpt-4o", 10, 0, output_floor=1), False) is None
    fit = fit_output(driver.limits, {TOKENS_S: 2990.0}, meters, call(4096), False)
    assert fit is not None and fit.below_floor and fit.fitted == 0  # no room at all: 10 - 113 < 0


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(token_cap=st.integers(1, 50_000), cost_cap=st.sampled_from([None, 0.0005, 0.003, 0.02]),
       used=st.floats(0, 1), input_tokens=st.integers(0, 20_000), output=st.integers(1, 40_000),
       choices=st.integers(1, 8), floor=st.integers(1, 2_000))
def test_a_fitted_call_never_reserves_past_a_cap_and_sends_what_it_reserves(token_cap, cost_cap, used, input_tokens,
                                                                           output, choices, floor):
    caps = {"tokens": {"per_session": token_cap}}
    if cost_cap is not None:
        caps["cost_usd"] = {"per_session": cost_cap}
    driver = Driver(passport(**budget(**caps)))
    driver.counters[TOKENS_S] = float(int(used * token_cap))
    if cost_cap is not None:
        driver.counters[COST_S] = used * cost_cap
    step = call(output, input_tokens=input_tokens, floor=floor, choices=choices, model="gpt-4o-mini")
    before = dict(driver.counters)
    decision = driver.run(step)  # Driver.apply raises if a capped charge would pass its cap
    if decision.blocks:
        assert decision.cause == ON_BUDGET_EXHAUSTED
        return
    sent = decision.details.get(FITTED_KEY, output)  # per answer: what the adapter sends upstream
    assert sent <= output and (sent >= floor or sent == output)
    assert reserved(decision, TOKENS_S) == input_tokens + sent * choices
    assert before.get(TOKENS_S, 0.0) + reserved(decision, TOKENS_S) <= token_cap
    if cost_cap is not None:
        assert before.get(COST_S, 0.0) + reserved(decision, COST_S) <= cost_cap
    assert (FITTED_KEY in decision.details) == (decision.event is not None and decision.event["cause"] == ON_OUTPUT_FITTED)
