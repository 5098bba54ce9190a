"""Decisions as HTTP: the status of a refusal, the one-line human reason an error message
carries (from the machine-readable governor object), the text a fallback answers with."""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from governor.policy.steps import ON_BUDGET_EXHAUSTED, ON_GOVERNOR_ERROR, ON_ITERATION_LIMIT, Decision
from governor.policy.causes import ON_GOVERNOR_RATE_LIMIT


def status_for(decision: Decision) -> int:
    """HTTP status of a refusal: 429 exhausted budget or iteration limit, 503 governor
    failure (fail closed), 403 anything else the policy denies."""
    if decision.cause == ON_GOVERNOR_ERROR:
        return 503
    if decision.cause in (ON_BUDGET_EXHAUSTED, ON_ITERATION_LIMIT, ON_GOVERNOR_RATE_LIMIT):
        return 429
    return 403


def describe(governor: Mapping[str, Any]) -> str:
    """A one-line human reason for an error message, from a governor object."""
    cause = governor.get("cause") or "governor"
    parts = [f"governor: {governor.get('action', 'halt')} ({cause})"]
    if "dimension" in governor:
        scope = governor.get("scope")
        parts.append(f"{governor['dimension']}{' ' + scope if scope else ''}")
    unpriced = governor.get("reason") in ("unpriced_model", "unpriced_unit")
    if governor.get("loop") is True:
        parts.append(f"loop: {governor.get('tool')} called again with the same arguments after "
                     f"{governor.get('repeats_in_window')} identical calls in the last {governor.get('window')} "
                     f"tool calls (loop threshold {governor.get('threshold')})")
    elif unpriced and governor.get("reason") == "unpriced_unit":
        limit = f" (limit {governor['limit']} USD)" if "limit" in governor else ""
        parts.append(f"model {governor.get('model')!r} has no price for {governor.get('unit')!r}, so the cost of "
                     f"this call cannot be checked{limit}: price it in the pricing file, under the model's "
                     f"family: units: {{{governor.get('unit')}: USD per unit}} (governor run --pricing FILE, "
                     f"overrides over genai-prices; docs/reference/pricing.md)")
    elif unpriced:
        limit = f" (limit {governor['limit']} USD)" if "limit" in governor else ""
        parts.append(f"model {governor.get('model')!r} has no price, so its cost cannot be checked{limit}: "
                     f"price it in a pricing file (governor run --pricing FILE, overrides over genai-prices: "
                     f"models: {{{str(governor.get('model')).lower()}: {{input: USD, output: USD}}}} per million "
                     f"tokens, or fallback: MODEL to price every unpriced model as MODEL; docs/reference/pricing.md)")
    elif "call_used" in governor and "projected" in governor and "limit" in governor:
        # a call's actual usage crossed (mid-stream or at its end): the session's use with it,
        # and the call's own part against what it had reserved
        so_far = "" if governor.get("final") else " so far"
        parts.append(f"used {_figure(governor['projected'])} > limit {_figure(governor['limit'])} "
                     f"(this call {_figure(governor['call_used'])}{so_far}, "
                     f"{_figure(governor.get('call_reserved', 0))} reserved for it; "
                     f"the rest of the session {_figure(governor.get('observed', 0))})")
    elif "projected" in governor and "limit" in governor:
        parts.append(f"projected {governor['projected']} > limit {governor['limit']}"
                     + (f" (used {governor['observed']})" if "observed" in governor else ""))
    elif "observed" in governor and "limit" in governor:
        parts.append(f"observed {governor['observed']} > limit {governor['limit']}")
    if "fit_floor" in governor:  # output fitting could not fit the call (docs/fitting.md)
        parts.append(f"at most {governor.get('fit_room')} output tokens would fit, under the fitting floor of "
                     f"{governor['fit_floor']} (--fit-floor)")
    if governor.get("reason") and not unpriced:
        parts.append(str(governor["reason"]))
    if governor.get("message"):  # the passport's declared message for this degradation
        parts.append(str(governor["message"]))
    return "; ".join(parts)


def _figure(value: Any) -> str:
    """A budget figure for people: whole numbers without a fraction, costs to 6 digits."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.6g}"
    return str(value)


def fallback_text(decision: Decision) -> str:
    """The text a fallback answers with: the declared value (JSON when not a string),
    else the declared message."""
    value = decision.fallback_value
    if isinstance(value, str):
        return value
    if value is not None:
        return orjson.dumps(value).decode()
    return decision.fallback_message or ""
