"""Amazon Bedrock Runtime: Converse, ConverseStream, InvokeModel and
InvokeModelWithResponseStream (POST /model/{modelId}/...), plain and event-streamed.

The model id is the path's label, percent-encoded by the clients (`anthropic.claude-3-5-
haiku-20241022-v1%3A0`, ARNs with `%2F`): read from the normalized route and decoded once,
as Bedrock decodes it. Converse bodies are the same for every model; InvokeModel bodies are
the model's own, and the adapter reads the families whose shapes it knows from the model id
(`anthropic.`, `meta.`, `amazon.titan-text`, after an ARN's last `/` and one cross-region
prefix such as `us.` or `global.`). InvokeModel for any other model is refused (400): its
output limit and usage fields are unknown, so it cannot be reserved or charged; Converse
governs such a model (docs/wire-protocols.md).

Signed requests. boto3 signs each request with SigV4 and the signature covers the body's
hash, so a body the governor rewrote would be refused by Bedrock (InvalidSignatureException).
This adapter therefore never rewrites a request: it names no output-limit field (no output
fitting: a declared limit that does not fit the caps is refused as the caps refuse it, with
a message saying why it was not lowered), and a request offering a tool the session may not
use is refused (403) instead of having the tool withheld.

Errors are Bedrock's: a JSON `{"message"}` with `x-amzn-ErrorType`, which boto3 raises as a
ClientError carrying the message. A budget refusal (429 elsewhere) is sent as HTTP 400
`ServiceQuotaExceededException`: boto3 retries every 429 (up to 4 times, with back-off), and a
refusal the governor repeats each time must not cost the agent retries.

Answers, usage and stream watchers: governor.adapters.bedrock_answers.
"""

from __future__ import annotations

import re
from typing import Any, Mapping
from urllib.parse import unquote

import orjson

from governor.adapters import withhold
from governor.adapters.base import Adapter, Exchange, Observation, Reply, StreamWatcher
from governor.adapters.model_calls import estimate_tokens, model_call
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.bedrock_answers import (
    ANTHROPIC,
    CONVERSE,
    CONVERSE_BODY,
    CONVERSE_STREAM,
    INVOKE,
    INVOKE_STREAM,
    LLAMA,
    TITAN,
    FramedWatcher,
    fallback_reply,
    observe,
    readable,
    watcher_for,
)
from governor.adapters.endpoints import GOVERNED, REFUSED, Endpoint, Probe
from governor.adapters.fitting import requested_limit
from governor.policy.steps import ON_BUDGET_EXHAUSTED, Decision, Step

MODEL = "/model/"
_MODEL = re.compile("/model/", re.IGNORECASE)
OPERATIONS = (CONVERSE_STREAM, CONVERSE, INVOKE_STREAM, INVOKE)
STREAMED = frozenset({CONVERSE_STREAM, INVOKE_STREAM})
# Bedrock Runtime operations on a model that spend and that the governor does not govern:
# refused, never forwarded (the endpoint table lists them)
REFUSED_OPERATIONS = ("/invoke-with-bidirectional-stream", "/count-tokens")
# ... and outside /model/: asynchronous invocation, guardrails (priced per text unit)
REFUSED_SUFFIXES = ("/async-invoke", "/apply", "/guardrail-checks/invoke")
_SUFFIXES = OPERATIONS + REFUSED_OPERATIONS

# The InvokeModel body families, by the model id's prefix (after an ARN's path and one
# cross-region prefix): the longest first
FAMILIES = (("amazon.titan-text", TITAN), ("anthropic.", ANTHROPIC), ("meta.", LLAMA))

# Bedrock's error codes by the governor's status; (code, HTTP status sent)
ERRORS = {
    400: ("ValidationException", 400),
    403: ("AccessDeniedException", 403),
    404: ("ResourceNotFoundException", 404),
    405: ("ValidationException", 400),
    413: ("ValidationException", 400),
    415: ("ValidationException", 400),
    429: ("ServiceQuotaExceededException", 400),  # not 429: boto3 retries every 429 (module docstring)
    502: ("ServiceUnavailableException", 503),
    503: ("ServiceUnavailableException", 503),
    504: ("ModelTimeoutException", 408),
}
ERROR_TYPE_HEADER = "x-amzn-ErrorType"
_FIELDS = "inferenceConfig.maxTokens, max_tokens, max_gen_len or textGenerationConfig.maxTokenCount"
SIGNED = ("Bedrock requests are signed (SigV4, over the body), so the governor cannot lower the output limit "
          f"as it does for other providers: lower it ({_FIELDS}) to fit what the budget leaves")
UNSIGNED = ("Bedrock requests are signed (SigV4, over the body), so the governor cannot set a smaller one as it "
            f"does for other providers: name one ({_FIELDS}) that fits what the budget leaves")


def model_id_of(route: str) -> tuple[str, str]:
    """(model id, operation) of a normalized route (letter case kept) ending in a Bedrock model
    operation, whatever the case it is spelled in; the id percent-decoded once (the route
    decoded only unreserved characters and '/')."""
    found = _MODEL.search(route)
    tail = route[-40:].lower()
    for operation in _SUFFIXES:
        if found is not None and tail.endswith(operation):
            return unquote(route[found.end():len(route) - len(operation)]), operation
    return "", ""


def family_of(model_id: str) -> str | None:
    """The InvokeModel body family of a model id, or None when the governor does not know it."""
    name = model_id.rsplit("/", 1)[-1].lower()
    for candidate in (name, name.partition(".")[2]):  # as given, then without a cross-region prefix
        for prefix, family in FAMILIES:
            if candidate.startswith(prefix):
                return family
    return None


def converse_tool(entry: Any) -> withhold.Names | None:
    """A Converse toolConfig.tools entry: toolSpec.name or systemTool.name; a cachePoint
    names no tool; anything else cannot be named (refused)."""
    if type(entry) is not dict or len(entry) != 1:
        return None
    (kind, inner), = entry.items()
    if kind == "cachePoint":
        return ()
    if kind in ("toolSpec", "systemTool") and type(inner) is dict:
        name = inner.get("name")
        if type(name) is str and name:
            return (name,)
    return None


def _object(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"'{key}' must be an object")
    return value


class BedrockAdapter(Adapter):
    name = "bedrock"
    provider = "bedrock"

    def claims(self, route: str) -> bool:
        return (MODEL in route and route.endswith(_SUFFIXES)) or route.endswith(REFUSED_SUFFIXES) and (
            "async-invoke" in route or "/guardrail" in route)

    def match(self, request: RequestView) -> bool:
        return request.method == "POST" and self.claims(request.match_route)

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        route = request.normal_route
        model_id, operation = model_id_of(route)
        if operation not in OPERATIONS:
            raise BadRequest(f"the governor does not govern Bedrock's {operation or route} (it spends, and the "
                             "governor cannot count it): refused; use Converse or InvokeModel", status=403)
        if not model_id:
            raise BadRequest("the path names no model id (/model/{modelId}/...)")
        body = request.json_object()
        family = CONVERSE_BODY if operation in (CONVERSE, CONVERSE_STREAM) else family_of(model_id)
        if family is None:
            raise BadRequest(
                f"InvokeModel for {model_id!r}: the governor reads the request and answer bodies of Anthropic "
                "(anthropic.), Meta Llama (meta.) and Amazon Titan Text (amazon.titan-text) models only; for any "
                "other model it cannot know the output limit or the usage, so it refuses the call rather than "
                "pass it uncounted. Use Converse (every model), which the governor reads whatever the model")
        limit, tools = self._read_body(family, body)
        offered = withhold.flat(tools) if tools else ()
        self._refuse_withheld(offered, session, persona)
        state: dict[str, Any] = {
            "operation": operation,
            "family": family,
            "model_id": model_id,
            "expected_input": estimate_tokens(len(request.content), self.config.bytes_per_token),
            "expected_output": limit or self.config.default_output_tokens,
            "declared_output": limit,
            "tools": offered,
        }
        return Exchange(adapter=self, method=request.method, host=request.host, path=request.path, body=body,
                        session=session, persona=persona, stream=operation in STREAMED,
                        model=model_id.rsplit("/", 1)[-1], state=state)

    @staticmethod
    def _read_body(family: str, body: dict[str, Any]) -> tuple[int, tuple[withhold.Names, ...]]:
        """(the declared output limit or 0, the offered tools' names) of a body of `family`;
        BadRequest when the body is not that family's shape."""
        if family == CONVERSE_BODY:
            if not isinstance(body.get("messages"), list):
                raise BadRequest("'messages' must be an array (Converse)")
            limit = requested_limit(_object(body, "inferenceConfig"), "maxTokens")
            tools = _object(body, "toolConfig").get("tools")
            return limit, (withhold.read_tools(tools, "toolConfig.tools", converse_tool) if tools is not None else ())
        if family == ANTHROPIC:
            if not isinstance(body.get("messages"), list):
                raise BadRequest("'messages' must be an array (Anthropic on Bedrock)")
            limit = requested_limit(body, "max_tokens")
            tools = body.get("tools")
            return limit, (withhold.read_tools(tools, "tools", withhold.named_only) if tools is not None else ())
        if family == LLAMA:
            if not isinstance(body.get("prompt"), str):
                raise BadRequest("'prompt' must be a string (Meta Llama on Bedrock)")
            return requested_limit(body, "max_gen_len"), ()
        if not isinstance(body.get("inputText"), str):
            raise BadRequest("'inputText' must be a string (Amazon Titan Text)")
        return requested_limit(_object(body, "textGenerationConfig"), "maxTokenCount"), ()

    def _refuse_withheld(self, offered: tuple[str, ...], session: str, persona: str | None) -> None:
        """A tool the session may not use cannot be withheld from a signed body: the call is refused."""
        allowed_tools = self.config.extra.get("allowed_tools")
        if not offered or not callable(allowed_tools):
            return
        allowed = allowed_tools(session, persona)
        if allowed is None:
            return
        withheld = [name for name in offered if name not in allowed]
        if withheld:
            shown = ", ".join(repr(name[:64]) for name in withheld[:8])
            raise BadRequest(f"the request offers tools this session may not use ({shown}); the governor withholds "
                             "such tools from other providers' requests, but a Bedrock request is signed (SigV4, over "
                             "the body) and cannot be changed, so the call is refused: offer only the tools the "
                             "passport declares", status=403)

    async def steps(self, exchange: Exchange) -> list[Step]:
        return [model_call(self, exchange, exchange.state["tools"])]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        """Never a rewrite (signed); an offered tool the decision does not allow was refused at
        open, and should one get here, failing closed is all that is left."""
        allowed = decision.allowed_tools
        if allowed is not None and any(name not in allowed for name in exchange.state["tools"]):
            raise RuntimeError("a Bedrock request offers a tool the decision withholds; it cannot be rewritten")
        return None

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        return observe(exchange, status, headers, body, self.config.bytes_per_token)

    def stream_watcher(self, exchange: Exchange, status: int,
                       headers: Mapping[str, str]) -> StreamWatcher | None:
        return watcher_for(exchange, status, headers, self.config.bytes_per_token)

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        code, sent = ERRORS.get(status, ("ValidationException" if status < 500 else "InternalServerException",
                                         status))
        if (governor is not None and governor.get("cause") == ON_BUDGET_EXHAUSTED and exchange is not None
                and "limit" in governor):
            if exchange.state.get("declared_output"):
                message = f"{message}; {SIGNED}"
            else:
                message = (f"{message}; the call names no output limit, so {exchange.state['expected_output']} "
                           f"tokens were reserved for its answer, and {UNSIGNED}")
        body: dict[str, Any] = {"message": readable(message, governor)}
        if governor is not None:
            body["governor"] = dict(governor)
        return Reply(sent, {"content-type": "application/json", ERROR_TYPE_HEADER: code,
                            "x-amzn-governor-status": str(status)}, orjson.dumps(body))

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        return fallback_reply(exchange, decision, governor)


ADAPTERS = (BedrockAdapter,)

__all__ = ["BedrockAdapter", "FramedWatcher", "ADAPTERS", "model_id_of", "family_of"]

_CONVERSE = b'{"messages":[{"role":"user","content":[{"text":"hi"}]}],"inferenceConfig":{"maxTokens":64}}'
_HAIKU = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0"
ENDPOINTS = (
    Endpoint("Bedrock", "Converse", "POST", "/model/{modelId}/converse", GOVERNED, "bedrock",
             Probe("POST", f"{_HAIKU}/converse", _CONVERSE),
             "usage.inputTokens / outputTokens (+ cache reads and writes); any model id; signed: never rewritten, "
             "a maxTokens that does not fit is refused"),
    Endpoint("Bedrock", "ConverseStream", "POST", "/model/{modelId}/converse-stream", GOVERNED, "bedrock",
             Probe("POST", f"{_HAIKU}/converse-stream", _CONVERSE),
             "event stream: the metadata event's usage", stream=True),
    Endpoint("Bedrock", "InvokeModel", "POST", "/model/{modelId}/invoke", GOVERNED, "bedrock",
             Probe("POST", f"{_HAIKU}/invoke", b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":64,'
                                               b'"messages":[{"role":"user","content":"hi"}]}'),
             "Anthropic, Meta Llama and Titan Text bodies (usage fields, x-amzn-bedrock-*-token-count); other "
             "models refused"),
    Endpoint("Bedrock", "InvokeModelWithResponseStream", "POST", "/model/{modelId}/invoke-with-response-stream",
             GOVERNED, "bedrock",
             Probe("POST", "/model/meta.llama3-1-8b-instruct-v1%3A0/invoke-with-response-stream",
                   b'{"prompt":"hi","max_gen_len":64}'),
             "event stream of chunks: the model's usage fields and amazon-bedrock-invocationMetrics", stream=True),
    Endpoint("Bedrock", "InvokeModelWithBidirectionalStream", "POST",
             "/model/{modelId}/invoke-with-bidirectional-stream", REFUSED, "bedrock",
             Probe("POST", "/model/amazon.nova-sonic-v1%3A0/invoke-with-bidirectional-stream", b"{}"),
             "not governed: refused (403)"),
    Endpoint("Bedrock", "CountTokens", "POST", "/model/{modelId}/count-tokens", REFUSED, "bedrock",
             Probe("POST", f"{_HAIKU}/count-tokens", b'{"input":{"converse":{"messages":[]}}}'),
             "not governed: refused (403)"),
    Endpoint("Bedrock", "StartAsyncInvoke", "POST", "/async-invoke", REFUSED, "bedrock",
             Probe("POST", "/async-invoke", b'{"modelId":"amazon.nova-reel-v1:0","modelInput":{},'
                                           b'"outputDataConfig":{}}'),
             "not governed: refused (403)"),
    Endpoint("Bedrock", "ApplyGuardrail", "POST", "/guardrail/{guardrailIdentifier}/version/{guardrailVersion}/apply",
             REFUSED, "bedrock", Probe("POST", "/guardrail/gr1/version/1/apply", b'{"source":"INPUT","content":[]}'),
             "not governed: refused (403)"),
)
