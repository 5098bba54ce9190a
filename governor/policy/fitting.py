"""Fitting a model call's output limit to what remains of its budgets (issue #22, item 1).

A model call reserves its expected input plus its output limit (`max_tokens` or the
protocol's equivalent; for a request naming none, the adapters' guess). When that does not
fit every cap the call draws on (per session, per day, the persona's budget_share; tokens
and cost, input estimated and priced as for the reservation), the governor lowers the
output limit to the largest value that fits (leaving a small margin for the input estimate's
error, `input_margin`), provided that is at least the floor the governor is configured with
(`ModelCall.output_floor`); below it the call is projected at the floor (its own limit when
smaller), which the caps refuse as budget-exhausted unless only the margin was missing. The adapter sends the fitted value upstream, so
the reservation is what the call may spend, not a guess.

Pure: no I/O, no clock. `fit_output` decides; the engine charges what it projects and,
when the call goes ahead, `recorded` adds the `on_governor_output_fitted` event that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from governor.policy.causes import ON_GOVERNOR_OUTPUT_FITTED as ON_OUTPUT_FITTED
from governor.policy.limits import COST, TOKENS, Limits, Meter
from governor.policy.steps import ON_BUDGET_EXHAUSTED, Action, Decision, ModelCall

# Not a §6 cause: a call that went ahead with a lower output limit than it asked for is
# recorded under this cause with action `fallback` (the request went upstream reduced;
# governor/policy/causes.py says why not `continue`), detail.decision "permit" (docs/fitting.md).

# Decision.details key of the fitted output limit, per answer (what the adapter sends).
FITTED_KEY = "output_tokens_fitted"

# The input is an estimate (bytes / bytes_per_token) and the provider counts it its own way: a
# call fitted to the last token would cross the cap by the estimate's error, and a plain
# answer that crosses it is refused after the upstream was paid. So a fitted call leaves this
# much room for the input being larger than estimated: INPUT_MARGIN_MIN tokens, or
# INPUT_MARGIN_FRACTION of the estimate when that is more.
INPUT_MARGIN_MIN = 16
INPUT_MARGIN_FRACTION = 0.05


def input_margin(input_tokens: int) -> int:
    return max(INPUT_MARGIN_MIN, int(input_tokens * INPUT_MARGIN_FRACTION))


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitting of one model call that did not fit as asked.

    requested: the output limit it asked for (or the guess), per answer.
    fitted:    the largest output limit per answer that fits every cap, the input's margin
               left free (>= 0).
    floor:     the smallest output limit the governor fits a call to.
    meter / used: the cap that binds hardest and its counter before the call.
    tokens / cost: what the engine projects (and, admitted, charges): `limit` answers' output.
    """

    requested: int
    fitted: int
    floor: int
    choices: int
    meter: Meter
    used: float
    tokens: int
    cost: float | None

    @property
    def below_floor(self) -> bool:
        """Less than the floor fits with the margin: projected at min(requested, floor), which
        the caps refuse unless only the margin was missing (then it goes ahead at that)."""
        return self.fitted < self.floor

    @property
    def limit(self) -> int:
        """The output limit per answer projected and, admitted, sent upstream."""
        return self.fitted if self.fitted >= self.floor else min(self.requested, self.floor)

    def refusal_detail(self) -> dict[str, Any]:
        """Added to the on_budget_exhausted detail of a call refused below the floor."""
        return {"output_tokens_requested": self.requested, "fit_room": self.fitted, "fit_floor": self.floor}

    def detail(self) -> dict[str, Any]:
        """The on_governor_output_fitted event's detail: what was asked, what was sent, which cap bound."""
        detail: dict[str, Any] = {
            "decision": "permit", "output_tokens_requested": self.requested, FITTED_KEY: self.limit,
            "dimension": self.meter.dimension, "scope": self.meter.scope, "observed": self.used,
            "limit": self.meter.cap, "fit_floor": self.floor,
        }
        if self.choices > 1:
            detail["choices"] = self.choices
        if self.meter.persona is not None:
            detail["budget_share"] = self.meter.persona
        return detail


def _room(limits: Limits, meter: Meter, used: float, step: ModelCall, price: Any) -> int | None:
    """The largest total output (tokens) the call can have within this meter's cap, given its
    input; None when the meter does not bound output (no cap, an unpriced or free output)."""
    cap = meter.cap
    if cap is None:
        return None
    inputs = step.expected_input_tokens
    if meter.dimension == TOKENS:
        if used + inputs + step.expected_output_tokens <= cap:
            return None  # fits as asked
        return int(cap - used - inputs - input_margin(inputs))
    if meter.dimension != COST or price is None or price.output <= 0:
        return None  # an unpriced model is refused by the projection itself (it cannot be fitted)
    if used + price.cost(inputs, step.expected_output_tokens) <= cap:
        return None  # fits as asked: the projection's own comparison, not a rounded inverse
    padded = inputs + input_margin(inputs)
    room = int((cap - used - price.cost(padded, 0)) * 1_000_000.0 / price.output_at(padded))  # its tier's
    # the projection compares used + cost(input, output) > cap in floating point: step down
    # until that comparison passes, so a fitted call is never refused by a rounding error
    for _ in range(4):
        if room < 0 or used + price.cost(padded, room) <= cap:
            break
        room -= 1
    return room


def fit_output(limits: Limits, counters: Mapping[Any, float], meters: tuple[Meter, ...], step: ModelCall,
               budget_open: bool) -> Fit | None:
    """The fitting of `step` against `meters` (its caps; `counters` as the projection reads
    them), or None when nothing is fitted: fitting is off for the step (no floor), the step
    generates nothing, the tier does not enforce budgets, a budget cause is overridden (a
    declared `continue`, a reviewer's release), or the call fits as asked."""
    floor = step.output_floor
    output = step.expected_output_tokens
    if floor is None or output <= 0 or budget_open or not limits.enforce_hard:
        return None
    if limits.resolution(ON_BUDGET_EXHAUSTED).action is Action.CONTINUE:
        return None  # the passport lets calls go past the caps: nothing to fit to
    price = limits.pricing.price_for(step.model)
    room: int | None = None
    binding: Meter | None = None
    for meter in meters:
        used = counters.get(meter.key, 0.0)
        fits = _room(limits, meter, used, step, price)
        if fits is not None and (room is None or fits < room):
            room, binding = fits, meter
    if room is None or binding is None:
        return None
    choices = max(step.output_choices, 1)
    requested = output // choices
    fitted = max(room, 0) // choices
    total = (fitted if fitted >= floor else min(requested, floor)) * choices  # Fit.limit, all answers
    cost = limits.pricing.cost(step.model, step.expected_input_tokens, total, 0, step.units)
    return Fit(requested, fitted, floor, choices, binding, counters.get(binding.key, 0.0),
               step.expected_input_tokens + total, cost)


def recorded(decision: Decision, fit: Fit, step_kind: str, persona: str | None) -> Decision:
    """A fitted call that goes ahead: its decision names the fitted limit (details) and
    records it (an on_governor_output_fitted event after any the call's checks recorded)."""
    if decision.blocks:
        return decision
    detail = fit.detail()
    detail["step"] = step_kind
    if persona is not None:
        detail["persona"] = persona
    event = {"cause": ON_OUTPUT_FITTED, "action": Action.FALLBACK.value, "detail": detail}
    return replace(decision, details={**decision.details, FITTED_KEY: fit.limit}, event=event,
                   prior_events=decision.events)
