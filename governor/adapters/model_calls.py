"""The step an LLM request is (ModelCall) and the figures it is admitted with: the token
estimate for text the provider has not counted, and whether a running usage figure is still
within what was admitted."""

from __future__ import annotations

from governor.adapters.base import Adapter, Exchange
from governor.policy.steps import ModelCall


def model_call(adapter: Adapter, exchange: Exchange, offered: tuple[str, ...]) -> ModelCall:
    """The step an LLM request is: its model, expected consumption and offered tools."""
    config = adapter.config
    return ModelCall(
        model=exchange.model,
        expected_input_tokens=exchange.state["expected_input"],
        expected_output_tokens=exchange.state["expected_output"],
        tools_offered=offered,
        persona=exchange.persona,
        provider=adapter.provider,
        output_floor=config.fit_floor if config.fit_output and adapter.output_limit_fields(exchange) else None,
        output_choices=exchange.state.get("choices", 1),
    )


def within_admission(exchange: Exchange, model: str, input_tokens: int, output_tokens: int) -> bool:
    """A running usage figure no larger, term by term, than the model call was admitted with
    (model_call() above: the same model, the exchange's expected input and output).

    The runtime reserved exactly that expectation and the decision point does not re-judge
    usage within its reservation, so stream watchers do not report such figures: asking
    about them on every chunk would cost a report, a decision and a store round trip each,
    for nothing. Figures past it are reported at once (and can cut the stream); the final
    figure always is."""
    state = exchange.state
    return (model == exchange.model and input_tokens <= state["expected_input"]
            and output_tokens <= state["expected_output"])


def estimate_tokens(nbytes: int, bytes_per_token: float) -> int:
    """ceil(nbytes / bytes_per_token): the governor's token estimate for text it has not
    seen counted by the provider (request prompts, stream text before usage arrives)."""
    return int(-(-nbytes // bytes_per_token)) if nbytes > 0 else 0
