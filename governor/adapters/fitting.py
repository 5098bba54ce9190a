"""The request side of output fitting (docs/fitting.md): the output limit a model call asks
for, read strictly, and the admitted limit written into the body that goes upstream.

The decision is the policy's (governor.policy.fitting); each adapter names its endpoint's
output-limit fields (`Adapter.output_limit_fields`: OpenAI chat `max_completion_tokens` /
`max_tokens`, Responses `max_output_tokens`, legacy completions `max_tokens`, Anthropic
`max_tokens`, Gemini `generationConfig.maxOutputTokens`, in the object
`Adapter.output_limit_holder` names), and this module only rewrites those fields, in the
already parsed body.
"""

from __future__ import annotations

from typing import Any

from governor.adapters.base import Exchange
from governor.adapters.request_view import BadRequest
from governor.policy.fitting import FITTED_KEY
from governor.policy.limits import COST, TOKENS
from governor.policy.steps import Decision

# Response header naming the output limit per answer the governor sent upstream in place of
# the request's own (lowered to fit the caps, or inserted into a request that named none).
FITTED_HEADER = "ADL-Fitted-Output-Tokens"
# Exchange.state key of that value (set only when the governor set the limit).
FITTED_STATE = "fitted_output"


def requested_limit(body: dict[str, Any], name: str) -> int:
    """The output limit a request names in `name`: 0 when absent or null; a positive integer
    as given; anything else (zero, negative, fractional, a string, a boolean) is refused with
    a 400 rather than guessed at, since it would be reserved and sent as something else."""
    value = body.get(name)
    if value is None:
        return 0
    if type(value) is int and value > 0:
        return value
    shown = repr(value)
    raise BadRequest(f"'{name}' must be a positive integer, got {shown if len(shown) <= 40 else shown[:40] + '...'}")


def _capped(decision: Decision) -> bool:
    """The admission reserved against a token or cost cap (at R2/R3: R1 reserves uncapped)."""
    return any(c.cap is not None and c.dimension in (TOKENS, COST) for c in decision.charges)


def fit_request(exchange: Exchange, decision: Decision) -> bool:
    """Write the admitted output limit into `exchange.body`; True when it changed.

    The fields are in the adapter's `output_limit_holder` (the body, or the object in it that
    holds them: Ollama's `options`, TGI's `parameters`).
    Lowered (the decision's details name the fitted value): every output-limit field the
    request names above it is lowered to it, or, naming none, the first field is set to it;
    the exchange's expected output becomes the fitted reservation. Not lowered: a request
    naming no limit whose admission reserved against a cap gets its reservation's limit
    inserted, so what it may generate is what it holds. Nothing else is touched."""
    adapter = exchange.adapter
    if not adapter.config.fit_output:
        return False
    fields = adapter.output_limit_fields(exchange)
    if not fields:
        return False
    body = adapter.output_limit_holder(exchange)  # the body, or the object in it holding the fields
    # a named limit is a positive integer (adapters refuse others at open); one that is not
    # means "no limit" where a protocol allows it (Ollama's num_predict -1): set, not kept
    named = [name for name in fields if type(body.get(name)) is int and body[name] > 0] if body is not None else []
    state = exchange.state
    choices = state.get("choices", 1)
    fitted = decision.details.get(FITTED_KEY) if decision.details else None
    if fitted is None:
        if named or not _capped(decision):
            return False
        value = state["expected_output"] // choices
    else:
        value = fitted
        state["expected_output"] = fitted * choices  # what the call now holds (stream watchers compare)
    for name in named:
        if body[name] > value:
            body[name] = value
    if not named:
        body = adapter.output_limit_holder(exchange, create=True)
        if body is None:  # an adapter bug: never send a fitted reservation without its limit (fail closed)
            raise RuntimeError(f"{adapter.name}: no object to hold the output limit {fields[0]!r}")
        body[fields[0]] = value
    state[FITTED_STATE] = value
    return True
