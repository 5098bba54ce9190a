"""Anthropic's Message Batches (`POST /v1/messages/batches`): every request's `params` is a
Messages call, estimated as the Anthropic adapter estimates one; the batch is one model call
reserved up front at their sum (priced as `<model>@batch`: half the model's price, as
Anthropic bills batches, unless the pricing table names a batch price), refused when it cannot fit the session's caps, and
charged that whole reservation when the answer accepts the batch (its results, read later,
are not charged again and not credited back). A batch mixing models is refused: its work
cannot be priced as one call. Reads, lists, results, cancels and deletes of batches are free
governed steps (counted as an iteration, recorded, refused after a halt).
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from governor.adapters import uploads, withhold
from governor.adapters.anthropic import AnthropicAdapter
from governor.adapters.base import Adapter, Exchange, Observation, Reply, UNREAD_ANSWER
from governor.adapters.model_calls import model_call
from governor.adapters.reading import answered_object
from governor.adapters.refusals import describe
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.endpoints import FREE, GOVERNED, Endpoint, Probe
from governor.policy.pricing import BATCH_TIER
from governor.policy.steps import Decision, Step, UsageReport

MAX_REQUESTS = 100_000  # Anthropic's limit per batch
READS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


def _is_batches(route: str) -> bool:
    """`.../messages/batches` and what lies below it (a batch, its results, its cancel)."""
    return route.endswith("/messages/batches") or "/messages/batches/" in route


class AnthropicBatchesAdapter(Adapter):
    name = "anthropic-batches"
    provider = "anthropic"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.messages = AnthropicAdapter(self.config)  # estimates each request; renders errors

    def claims(self, route: str) -> bool:
        return _is_batches(route)

    def match(self, request: RequestView) -> bool:
        return request.method == "POST" or request.method in READS

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        route = request.match_route
        creates = request.method == "POST" and route.endswith("/messages/batches")
        state: dict[str, Any] = {"creates": creates, "expected_input": 0, "expected_output": 0}
        exchange = Exchange(adapter=self, method=request.method, host=request.host, path=request.path, body=None,
                            session=session, persona=persona, state=state)
        if not creates:  # a free step: a read, the results (relayed unread: JSONL of any size), a cancel
            if route.endswith("/results"):
                state[UNREAD_ANSWER] = True
            return exchange
        body = request.json()
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            raise BadRequest("'requests' must be a non-empty array")
        if len(requests) > MAX_REQUESTS:
            raise BadRequest(f"a message batch holds at most {MAX_REQUESTS} requests")
        model = None
        total_in = total_out = 0
        offered: list[tuple[int, Any, Any]] = []  # (index, tools, mcp_servers) of requests offering tools
        for index, item in enumerate(requests):
            params = item.get("params") if isinstance(item, dict) else None
            if not isinstance(params, dict):
                raise BadRequest(f"requests[{index}].params must be an object")
            try:
                call = self.messages.open(uploads.request_view(request.host, "/v1/messages", orjson.dumps(params)),
                                          session=session, persona=persona)
            except BadRequest as exc:
                raise BadRequest(f"requests[{index}].params: {exc.message}") from None
            if model is None:
                model = call.model
            elif call.model != model:
                raise BadRequest(f"requests[{index}] names model {call.model!r} and an earlier one {model!r}: the "
                                 "governor reserves a batch of one model (send one batch per model)")
            total_in += call.state["expected_input"]
            total_out += call.state["expected_output"]
            if "tools" in call.state or "mcp_servers" in call.state or "tool_choice" in params:
                offered.append((index, call.state.get("tools"), call.state.get("mcp_servers")))
        exchange.body = body
        exchange.model = f"{model}{BATCH_TIER}"
        state.update(expected_input=total_in, expected_output=total_out, offered=offered)
        return exchange

    async def steps(self, exchange: Exchange) -> list[Step]:
        names = [n for _, tools, servers in exchange.state.get("offered", ()) for n in (tools or ()) + (servers or ())]
        return [model_call(self, exchange, withhold.flat(names) if names else ())]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        """Each request's offered tools cut to what the session may use, as for one Messages call."""
        allowed, offered = decision.allowed_tools, exchange.state.get("offered")
        if allowed is None or not offered:
            return None
        requests = exchange.body["requests"]
        withheld: dict[str, None] = {}
        for index, tools, servers in offered:
            cut = withhold.withhold_anthropic(requests[index]["params"], allowed, tools, servers)
            withheld.update(dict.fromkeys(cut or ()))
        if not withheld:
            return None
        exchange.state["withheld"] = list(withheld)  # offered tools the batch may not use: the model never sees them
        return orjson.dumps(exchange.body)

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        state = exchange.state
        data = answered_object(status, body)
        if not state["creates"] or data is None or not isinstance(data.get("id"), str):
            return Observation()
        # accepted: the whole reservation is charged now (the batch runs after this exchange)
        return Observation(usage=UsageReport(exchange.model, state["expected_input"], state["expected_output"],
                                             persona=exchange.persona, final=True))

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        return self.messages.error_response(status, message, governor)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        return self.error_response(403, describe(governor), governor, exchange)


ADAPTERS = (AnthropicBatchesAdapter,)

__all__ = ["AnthropicBatchesAdapter", "ADAPTERS"]


ENDPOINTS = (
    Endpoint("Anthropic", "message batches", "POST", "/v1/messages/batches", GOVERNED, "anthropic-batches",
             Probe("POST", "/v1/messages/batches",
                   b'{"requests":[{"custom_id":"1","params":{"model":"claude-3-5-haiku-latest","max_tokens":64,'
                   b'"messages":[{"role":"user","content":"hi"}]}}]}'),
             "every request's params estimated as a Messages call, the sum reserved up front (at the batch "
             "price, `<model>@batch`) and charged at once; refused when it cannot fit"),
    Endpoint("Anthropic", "message batches (read, results, cancel, delete)", "GET",
             "/v1/messages/batches/{batch_id}", FREE, "anthropic-batches",
             Probe("GET", "/v1/messages/batches/msgbatch_abc"), "free step"),
)
