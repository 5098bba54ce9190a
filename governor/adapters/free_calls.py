"""Free endpoints that are still governed steps: OpenAI moderations (POST .../moderations)
and input-token counting (POST .../responses/input_tokens), Anthropic token counting
(POST .../v1/messages/count_tokens, with or without a `max_tokens`).

They generate nothing and cost nothing, but each is a model call of the session: counted
as an iteration (so an agent cannot loop on them past max_iterations), refused when the
session may not act (a halt, a lock), and refused in the provider's own error format. Each
reserves and is charged nothing: zero tokens cost zero whether or not the model is priced
(governor.policy.pricing), so a cost cap never refuses them for want of a price.
"""

from __future__ import annotations

from typing import Any, Mapping

from governor.adapters.anthropic import AnthropicAdapter
from governor.adapters.base import Adapter, SuffixAdapter, AdapterConfig, Exchange, Observation, Reply
from governor.adapters.refusals import describe
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.endpoints import FREE, Endpoint, Probe
from governor.adapters.openai import OpenAIAdapter
from governor.policy.steps import Decision, ModelCall, Step

MODERATIONS = "/moderations"
INPUT_TOKENS = "/responses/input_tokens"
COUNT_TOKENS = "/v1/messages/count_tokens"
DEFAULT_MODERATION_MODEL = "omni-moderation-latest"  # what the API uses when none is named


class _FreeCall(SuffixAdapter):
    """A free endpoint of one provider; `errors` renders that provider's error format."""

    def __init__(self, config: AdapterConfig | None = None) -> None:
        super().__init__(config)
        self.errors: Adapter = self._errors(self.config)

    def _errors(self, config: AdapterConfig) -> Adapter:
        raise NotImplementedError

    def _model(self, body: dict[str, Any], route: str) -> str:
        raise NotImplementedError

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        body = request.json_object()
        return Exchange(adapter=self, method=request.method, host=request.host, path=request.path, body=body,
                        session=session, persona=persona, model=self._model(body, request.match_route),
                        state={"expected_input": 0, "expected_output": 0})

    async def steps(self, exchange: Exchange) -> list[Step]:
        return [ModelCall(model=exchange.model, expected_input_tokens=0, expected_output_tokens=0,
                          persona=exchange.persona, provider=self.provider)]

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        return Observation()  # nothing to charge: its reservation of nothing is released

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        return self.errors.error_response(status, message, governor)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        return self.error_response(403, describe(governor), governor, exchange)


class OpenAIFreeAdapter(_FreeCall):
    name = "openai_free"
    provider = "openai"
    suffixes = (MODERATIONS, INPUT_TOKENS)

    def _errors(self, config: AdapterConfig) -> Adapter:
        return OpenAIAdapter(config)

    def _model(self, body: dict[str, Any], route: str) -> str:
        if body.get("input") is None and route.endswith(MODERATIONS):
            raise BadRequest("'input' is required")
        model = body.get("model")
        if model is None:
            return DEFAULT_MODERATION_MODEL if route.endswith(MODERATIONS) else ""
        if not isinstance(model, str):
            raise BadRequest("'model' must be a string")
        return model


class AnthropicCountAdapter(_FreeCall):
    name = "anthropic_count"
    provider = "anthropic"
    suffixes = (COUNT_TOKENS,)

    def _errors(self, config: AdapterConfig) -> Adapter:
        return AnthropicAdapter(config)

    def _model(self, body: dict[str, Any], route: str) -> str:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' is required and must be a string")
        if not isinstance(body.get("messages"), list):
            raise BadRequest("'messages' must be an array")
        return model


ADAPTERS = (OpenAIFreeAdapter, AnthropicCountAdapter)

__all__ = ["OpenAIFreeAdapter", "AnthropicCountAdapter", "ADAPTERS", "ENDPOINTS"]


ENDPOINTS = (
    Endpoint("OpenAI", "moderations", "POST", "/v1/moderations", FREE, "openai_free",
             Probe("POST", "/v1/moderations", b'{"model":"omni-moderation-latest","input":"hi"}'),
             "free: counted as an iteration, refused after a halt"),
    Endpoint("OpenAI", "responses input tokens", "POST", "/v1/responses/input_tokens", FREE, "openai_free",
             Probe("POST", "/v1/responses/input_tokens", b'{"model":"gpt-4o-mini","input":"hi"}'),
             "free: counted as an iteration, refused after a halt"),
    Endpoint("Anthropic", "count tokens", "POST", "/v1/messages/count_tokens", FREE, "anthropic_count",
             Probe("POST", "/v1/messages/count_tokens",
                   b'{"model":"claude-3-5-haiku-latest","messages":[{"role":"user","content":"hi"}]}'),
             "free (a max_tokens in it changes nothing): counted as an iteration, refused after a halt"),
)
