"""Nothing that is a model call goes ungoverned (issue 20, finding 3), through the real proxy.

Every shape a model call can take past a path-and-content-type check: another content type,
a path spelled with a trailing slash, upper case, %2F, duplicate slashes or dot segments,
another method, the legacy completions and embeddings endpoints, a chat body on a path no
adapter claims, a compressed body. The mock upstream serves every spelling of its model
paths (as lenient servers do), so each test asserts at the upstream what reached it:
a governed call (a ModelCall admitted, its usage charged) or nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import zlib

import brotli
import orjson
import pytest

from governor.adapters import AllowEntry, Route
from governor.policy.steps import ModelCall, ToolCall
from tests.proxy_harness import RawClient, fresh_scripted, scripted_env
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = orjson.dumps({"model": "gpt-test", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]})


env = scripted_env("shapes")


@pytest.fixture(autouse=True)
def fresh(env):
    with fresh_scripted(*env):
        yield


async def send(running, mock, method: str, path: str, body: bytes, headers: dict | None = None,
               content_type: str | None = "application/json"):
    client = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        await asyncio.to_thread(lambda: client.send(method, path, body, headers, content_type=content_type))
        return await asyncio.to_thread(client.read_response)
    finally:
        client.close()


def charged(runtime, session: str) -> list[tuple[int, int]]:
    """(input, output) of each final usage report of the session: what it was charged."""
    return [(r.input_tokens, r.output_tokens) for r in runtime.final_usage(session)]


# --- content type ------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
async def test_a_chat_body_is_governed_whatever_its_content_type(env, content_type):
    running, mock, runtime = env
    session = f"ct-{content_type}"
    status, _, body = await send(running, mock, "POST", "/v1/chat/completions", CHAT, {"ADL-Session": session},
                                 content_type=content_type)
    assert status == 200, body
    [call] = runtime.steps_of(session, ModelCall)
    assert call.model == "gpt-test" and call.expected_output_tokens == 40
    assert charged(runtime, session) == [(11, 7)]
    assert len(mock.requests) == 1


async def test_a_json_rpc_tool_call_is_governed_whatever_its_content_type(env):
    """MCP matched by body: a tools/call sent as text/plain was forwarded unread."""
    running, mock, runtime = env
    call = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "delete_file", "arguments": {"path": "/etc/passwd"}}})
    status, _, _ = await send(running, mock, "POST", "/mcp", call, {"ADL-Session": "mcp-plain"},
                              content_type="text/plain")
    assert status == 200
    [step] = runtime.steps_of("mcp-plain", ToolCall)
    assert step.tool == "delete_file" and step.target_path == "/etc/passwd"


# --- path spellings ----------------------------------------------------------------------


@pytest.mark.parametrize("path", [
    "/v1/chat/completions/",
    "/V1/CHAT/COMPLETIONS",
    "/v1/Chat/Completions/",
    "/v1/chat%2Fcompletions",
    "/v1/chat%2fcompletions?x=1",
    "/v1//chat///completions",
    "/v1/models/../chat/./completions",
    "/%761/chat/completions",  # an unreserved letter escaped
])
async def test_every_spelling_of_a_model_path_is_governed(env, path):
    running, mock, runtime = env
    session = f"path-{path}"
    status, _, body = await send(running, mock, "POST", path, CHAT, {"ADL-Session": session})
    assert status == 200, body
    assert orjson.loads(body)["object"] == "chat.completion"  # the upstream served it as a chat call
    [call] = runtime.steps_of(session, ModelCall)
    assert call.model == "gpt-test"
    assert charged(runtime, session) == [(11, 7)]
    assert [r.path for r in mock.requests] == [path]  # forwarded as the agent spelled it


async def test_an_anthropic_path_spelled_otherwise_is_governed(env):
    running, mock, runtime = env
    body = orjson.dumps({"model": "claude-test", "max_tokens": 30, "messages": [{"role": "user", "content": "hi"}]})
    status, _, answer = await send(running, mock, "POST", "/V1/Messages/", body, {"ADL-Session": "anth-path"})
    assert status == 200, answer
    [call] = runtime.steps_of("anth-path", ModelCall)
    assert call.provider == "anthropic" and call.expected_output_tokens == 30
    assert len(charged(runtime, "anth-path")) == 1


# --- methods -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["PUT", "PATCH", "GET", "DELETE"])
async def test_another_method_with_a_body_to_a_model_endpoint_is_refused(env, method):
    running, mock, runtime = env
    status, headers, body = await send(running, mock, method, "/v1/chat/completions/", CHAT, {"ADL-Session": "m"})
    error = orjson.loads(body)["error"]
    assert status == 405 and headers["adl-governor-action"] == "deny"
    assert f"{method} /v1/chat/completions is a model endpoint" in error["message"]
    assert error["type"] == "governor_error" and error["governor"]["action"] == "deny"  # OpenAI's shape
    assert mock.requests == [] and runtime.steps == []


async def test_a_bodiless_read_of_a_model_endpoint_is_not_a_model_call(env):
    """GET /v1/chat/completions lists stored completions: unknown traffic, refused by default,
    forwarded when the allow-list names it (and not a model call either way)."""
    running, mock, runtime = env
    status, _, body = await send(running, mock, "GET", "/v1/chat/completions", b"", {"ADL-Session": "read"})
    assert status == 403 and orjson.loads(body)["error"]["governor"]["refusal"] == "unknown_traffic"
    assert mock.requests == []
    running.chain.registry.allow = [AllowEntry.parse("GET 127.0.0.1/v1/chat/completions")]
    status, _, _ = await send(running, mock, "GET", "/v1/chat/completions", b"", {"ADL-Session": "read"})
    assert status == 200 and [r.method for r in mock.requests] == ["GET"]
    status, _, _ = await send(running, mock, "DELETE", "/v1/chat/completions", b"", {"ADL-Session": "read"})
    assert status == 403 and len(mock.requests) == 1  # the entry names GET only
    assert runtime.steps == []


# --- legacy completions and embeddings ---------------------------------------------------


async def test_legacy_completions_are_governed_and_charged(env):
    running, mock, runtime = env
    body = orjson.dumps({"model": "gpt-3.5-turbo-instruct", "prompt": "Say hi", "max_tokens": 25, "n": 2})
    status, _, answer = await send(running, mock, "POST", "/v1/completions", body, {"ADL-Session": "legacy"})
    assert status == 200 and orjson.loads(answer)["object"] == "text_completion"
    [call] = runtime.steps_of("legacy", ModelCall)
    assert call.model == "gpt-3.5-turbo-instruct" and call.expected_output_tokens == 50  # n answers of 25
    assert charged(runtime, "legacy") == [(11, 7)]


async def test_a_streamed_legacy_completion_is_watched_and_charged(env):
    running, mock, runtime = env
    mock.script(Behaviour(text="one two three four", chunks=4, input_tokens=5, output_tokens=9))
    body = orjson.dumps({"model": "gpt-3.5-turbo-instruct", "prompt": "count", "max_tokens": 20, "stream": True})
    status, _, answer = await send(running, mock, "POST", "/v1/completions", body, {"ADL-Session": "legacy-s"})
    assert status == 200 and answer.endswith(b"data: [DONE]\n\n")
    assert mock.requests[0].body["stream_options"] == {"include_usage": True}  # asked for, to be charged
    assert charged(runtime, "legacy-s") == [(5, 9)]


async def test_a_legacy_completion_past_the_cap_is_refused(env):
    running, mock, runtime = env
    runtime.token_cap = 100
    body = orjson.dumps({"model": "gpt-3.5-turbo-instruct", "prompt": "x", "max_tokens": 60, "best_of": 3})
    status, _, _ = await send(running, mock, "POST", "/v1/completions", body, {"ADL-Session": "legacy-cap"})
    assert status == 429 and mock.requests == []  # 3 candidates of 60 tokens: 180 > 100


async def test_embeddings_are_governed_and_their_input_tokens_charged(env):
    running, mock, runtime = env
    mock.script(Behaviour(input_tokens=42))
    body = orjson.dumps({"model": "text-embedding-3-small", "input": ["a", "b"]})
    status, _, answer = await send(running, mock, "POST", "/v1/embeddings", body, {"ADL-Session": "emb"})
    assert status == 200 and orjson.loads(answer)["object"] == "list"
    [call] = runtime.steps_of("emb", ModelCall)
    assert call.model == "text-embedding-3-small" and call.expected_output_tokens == 0
    assert charged(runtime, "emb") == [(42, 0)]


async def test_embeddings_of_token_ids_reserve_every_token(env):
    running, mock, runtime = env
    body = orjson.dumps({"model": "text-embedding-3-small", "input": [[1] * 3000]})
    await send(running, mock, "POST", "/v1/embeddings", body, {"ADL-Session": "emb-ids"})
    [call] = runtime.steps_of("emb-ids", ModelCall)
    assert call.expected_input_tokens >= 3000  # not len(body) / 4 = 1,500


# --- model calls on paths no adapter claims ----------------------------------------------


@pytest.mark.parametrize("body, content_type", [
    (CHAT, "application/json"),
    (CHAT, "text/plain"),
    (orjson.dumps({"model": "llama3", "prompt": "hi"}), None),  # Ollama's /api/generate shape
    (orjson.dumps({"model": "text-embedding-3-small", "input": "x"}), "application/json"),
    (orjson.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5, "messages": []}), "application/json"),
    ('{"model": "gpt-test", "messages": []}'.encode("utf-16"), "application/json"),  # as Python servers read it
    (b'{"mod\\u0065l": "gpt-test", "messages": []}', "application/json"),  # a key behind an escape
    (b'{"model": "gpt-test", "messages": [], "temperature": NaN}', "application/json"),  # Python's json reads NaN
    (orjson.dumps({"requests": [{"custom_id": "1", "params": {"model": "claude-test", "messages": []}}]}), None),
])
async def test_a_model_call_on_a_path_no_adapter_claims_is_refused(env, body, content_type):
    running, mock, runtime = env
    status, headers, answer = await send(running, mock, "POST", "/gateway/llm", body, {"ADL-Session": "shape"},
                                         content_type=content_type)
    error = orjson.loads(answer)["error"]
    assert status == 403 and headers["adl-governor-action"] == "deny"
    assert "carries a model call" in error["message"] and "routes" in error["message"]
    assert mock.requests == [] and runtime.steps == []


async def test_a_route_entry_decides_for_a_model_call_on_its_path(env):
    running, mock, runtime = env
    running.chain.registry.routes = [Route("127.0.0.1", "/gateway/**", "openai")]
    # the openai adapter opens it (a chat body); the mock serves it as a chat call only on
    # a chat path, so the call is governed and forwarded, and answers without usage
    status, _, _ = await send(running, mock, "POST", "/gateway/llm", CHAT, {"ADL-Session": "routed"})
    assert status == 200 and len(runtime.steps_of("routed", ModelCall)) == 1 and len(mock.requests) == 1
    # an ignore route is an allow-list entry: it never lets a model call through ungoverned
    running.chain.registry.routes = [Route("127.0.0.1", "/Gateway/**", "ignore")]  # any case: paths fold
    status, _, _ = await send(running, mock, "POST", "/gateway/llm", CHAT, {"ADL-Session": "ignored"})
    assert status == 403 and runtime.steps_of("ignored", ModelCall) == [] and len(mock.requests) == 1
    status, _, _ = await send(running, mock, "POST", "/gateway/status", b'{"ok": 1}', {"ADL-Session": "ignored"})
    assert status == 200 and runtime.steps_of("ignored", ModelCall) == [] and len(mock.requests) == 2


async def test_an_ignore_route_cannot_be_reached_by_dot_segments(env):
    running, mock, runtime = env
    running.chain.registry.routes = [Route("127.0.0.1", "/health/**", "ignore")]
    status, _, _ = await send(running, mock, "POST", "/health/../v1/chat/completions", CHAT, {"ADL-Session": "dots"})
    assert status == 200 and len(runtime.steps_of("dots", ModelCall)) == 1  # governed, not ignored


async def test_free_endpoints_are_governed_steps_and_other_bodies_forwarded(env):
    """Moderation and token counting cost nothing but are each a model call of the session
    (counted, refused after a halt: governor.adapters.free_calls); the rest goes on where the
    allow-list (here, the whole mock) lets it through."""
    running, mock, runtime = env
    running.chain.registry.allow = [AllowEntry.parse("127.0.0.1")]
    for path, body in (("/v1/messages/count_tokens", orjson.dumps({"model": "claude-test", "messages": []})),
                       ("/v1/moderations", orjson.dumps({"model": "omni-moderation-latest", "input": "x"})),
                       ("/v1/widgets", orjson.dumps({"name": "docs", "description": "model input"}))):
        status, _, _ = await send(running, mock, "POST", path, body, {"ADL-Session": "free"})
        assert status == 200, path
    assert [r.path for r in mock.requests] == ["/v1/messages/count_tokens", "/v1/moderations", "/v1/widgets"]
    calls = runtime.steps_of("free", ModelCall)
    assert [(c.model, c.expected_input_tokens, c.expected_output_tokens) for c in calls] == [
        ("claude-test", 0, 0), ("omni-moderation-latest", 0, 0)]


# --- compressed request bodies -----------------------------------------------------------


def gzip_bomb(mib: int) -> bytes:
    """A gzip body that decodes to `mib` MiB of zeros (~1 KiB per MiB), built without
    compressing them: full-flushed deflate segments of one MiB each are identical."""
    import struct

    zeros = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + segment * mib + deflate.flush()
            + struct.pack("<II", crc, (mib << 20) & 0xFFFFFFFF))


@pytest.mark.parametrize("coding, encode", [
    ("gzip", gzip.compress), ("deflate", zlib.compress), ("br", brotli.compress), ("GZIP", gzip.compress),
])
async def test_a_compressed_chat_body_is_read_and_governed(env, coding, encode):
    running, mock, runtime = env
    body = orjson.dumps({"model": "gpt-test", "max_tokens": 40, "messages": [{"role": "user", "content": "x" * 4000}]})
    status, _, _ = await send(running, mock, "POST", "/v1/chat/completions", encode(body),
                              {"ADL-Session": "gz", "Content-Encoding": coding})
    assert status == 200
    [call] = runtime.steps_of("gz", ModelCall)
    assert call.expected_input_tokens >= 1000  # estimated from the decoded body, not the compressed one


async def test_a_compressed_model_call_on_an_unclaimed_path_is_refused(env):
    running, mock, runtime = env
    status, _, answer = await send(running, mock, "POST", "/gateway/llm", gzip.compress(brotli.compress(CHAT)),
                                   {"ADL-Session": "gz2", "Content-Encoding": "br, gzip"})
    assert status == 403 and "carries a model call" in orjson.loads(answer)["error"]["message"]
    call = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "rm", "arguments": {}}})
    status, _, _ = await send(running, mock, "POST", "/mcp", gzip.compress(call),
                              {"ADL-Session": "gz2", "Content-Encoding": "gzip"})
    assert status == 200 and [s.tool for s in runtime.steps_of("gz2", ToolCall)] == ["rm"]
    assert [r.path for r in mock.requests] == ["/mcp"]


async def test_a_gzip_bomb_is_refused_before_it_is_inflated(env):
    running, mock, runtime = env
    bomb = gzip_bomb(500)  # 509 KiB that would become 500 MiB
    assert len(bomb) < 520 * 1024
    status, _, answer = await send(running, mock, "POST", "/v1/chat/completions", bomb,
                                   {"ADL-Session": "bomb", "Content-Encoding": "gzip"})
    error = orjson.loads(answer)["error"]
    assert status == 413 and "times its compressed size" in error["message"]
    assert mock.requests == [] and runtime.steps == []
    # the same bomb to a path nobody claims is not forwarded unread either
    status, _, _ = await send(running, mock, "POST", "/upload", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and mock.requests == []


async def test_a_body_past_the_size_limit_once_decoded_is_refused(env):
    running, mock, runtime = env
    running.chain.policy = dataclasses.replace(running.chain.policy, max_body_bytes=64 * 1024)
    body = orjson.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "ab" * 40_000}]})
    status, _, answer = await send(running, mock, "POST", "/v1/chat/completions", gzip.compress(body),
                                   {"Content-Encoding": "gzip"})
    assert status == 413 and "more than the governor's limit of 65536 bytes" in orjson.loads(answer)["error"]["message"]
    assert mock.requests == []


@pytest.mark.parametrize("coding, body, status, says", [
    ("compress", b"\x1f\x9d\x90", 415, "cannot be decoded by the governor"),
    ("base64", b"e30=", 415, "cannot be decoded by the governor"),  # mitmproxy would have decoded it
    ("gzip", b"not gzip", 400, "cannot be decoded (gzip)"),
    ("gzip", gzip.compress(CHAT, mtime=0)[:-12], 400, "truncated"),
])
async def test_a_body_the_governor_cannot_decode_is_refused(env, coding, body, status, says):
    running, mock, runtime = env
    got, _, answer = await send(running, mock, "POST", "/v1/chat/completions", body, {"Content-Encoding": coding})
    assert got == status and says in orjson.loads(answer)["error"]["message"]
    assert mock.requests == []


# --- compressed answers ------------------------------------------------------------------


async def test_an_answer_that_is_a_bomb_is_refused_and_charged_its_reservation(env):
    """An upstream is an adversary too: an answer the governor cannot read within its bounds
    is not delivered (502), and the call is charged what it reserved (fail closed)."""
    running, mock, runtime = env
    mock.script(Behaviour(encoded_answer=("gzip", gzip_bomb(64))))
    status, headers, answer = await send(running, mock, "POST", "/v1/chat/completions", CHAT, {"ADL-Session": "rb"})
    error = orjson.loads(answer)["error"]
    assert status == 502 and "the upstream's answer was refused" in error["message"]
    [call] = runtime.steps_of("rb", ModelCall)
    assert charged(runtime, "rb") == [(call.expected_input_tokens, call.expected_output_tokens)]


async def test_an_answer_in_an_unknown_encoding_is_refused_and_charged(env):
    running, mock, runtime = env
    usage = orjson.dumps({"usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    mock.script(Behaviour(encoded_answer=("x-custom", usage)))
    status, _, _ = await send(running, mock, "POST", "/v1/chat/completions", CHAT, {"ADL-Session": "ru"})
    assert status == 502 and charged(runtime, "ru") == [(runtime.steps_of("ru", ModelCall)[0].expected_input_tokens, 40)]


# --- streams that never end an event -----------------------------------------------------


@pytest.mark.parametrize("line", [b"data: " + b"x" * 8000 + b"\n", b": keep-alive " + b"y" * 8000 + b"\n"])
async def test_a_stream_without_event_boundaries_is_cut_not_held(env, monkeypatch, line):
    """An upstream that never ends an event (data lines, or comment lines, without a blank
    line) would have the governor hold its stream forever: past the limit it is cut with a
    clear error, the upstream is let go, and the call is charged."""
    from governor.adapters import sse

    monkeypatch.setattr(sse, "MAX_EVENT_BYTES", 64 * 1024)
    running, mock, runtime = env
    mock.script(Behaviour(boundless=(line, 400), chunk_delay=0.01))  # 3.2 MB without a boundary, over 4 s
    body = orjson.dumps({"model": "gpt-test", "max_tokens": 40, "stream": True, "messages": []})
    status, _, answer = await send(running, mock, "POST", "/v1/chat/completions", body, {"ADL-Session": "endless"})
    assert status == 200
    assert b"without an event boundary" in answer and answer.endswith(b"data: [DONE]\n\n")
    assert line not in answer  # nothing of the unbounded event was forwarded
    await asyncio.wait_for(mock.streams[0].done.wait(), 10)
    assert mock.streams[0].disconnected and mock.streams[0].events_sent < 400
    assert len(charged(runtime, "endless")) == 1


async def test_a_stream_the_upstream_compresses_anyway_is_read_whole_and_charged(env):
    """The governor asks for an uncompressed stream; an upstream that compresses it anyway
    cannot be read event by event: it is buffered, decoded within the bounds and read whole,
    so its usage still counts (before, the watcher saw gzip and charged no output)."""
    running, mock, runtime = env
    events = (b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"hello"},"finish_reason":null}]}\n\n'
              b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":13,"completion_tokens":29}}\n\n'
              b"data: [DONE]\n\n")
    mock.script(Behaviour(encoded_answer=("gzip", gzip.compress(events))))
    body = orjson.dumps({"model": "gpt-test", "max_tokens": 40, "stream": True, "messages": []})
    status, headers, answer = await send(running, mock, "POST", "/v1/chat/completions", body, {"ADL-Session": "gzs"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert gzip.decompress(answer) == events  # delivered as the upstream sent it
    assert mock.requests[0].headers["Accept-Encoding"] == "identity"  # which the upstream ignored
    assert charged(runtime, "gzs") == [(13, 29)]


async def test_an_upload_that_mentions_model_calls_is_not_one(env):
    """A multipart upload of a JSONL file of chat bodies (a batch input file) is a file, not a
    model call: forwarded as a free step (governor.adapters.openai_async). The same lines sent
    raw are a model call."""
    running, mock, runtime = env
    line = orjson.dumps({"custom_id": "1", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}})
    jsonl = line + b"\n" + line + b"\n"
    form = (b"--b0undary\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            b"Content-Type: application/jsonl\r\n\r\n" + jsonl + b"\r\n--b0undary--\r\n")
    status, _, _ = await send(running, mock, "POST", "/v1/files", form, {"ADL-Session": "files"},
                              content_type="multipart/form-data; boundary=b0undary")
    assert status == 200 and [r.path for r in mock.requests] == ["/v1/files"]
    raw = CHAT + b"\n" + CHAT + b"\n"  # chat bodies as JSON lines: no parser reads them, the keys decide
    status, _, _ = await send(running, mock, "POST", "/gateway/llm", raw, {"ADL-Session": "files"})
    assert status == 403 and len(mock.requests) == 1


async def test_a_presented_passport_is_checked_even_when_the_body_is_refused(env):
    """Refusing an undecodable body does not skip the anti-swap check of ADL-Passport."""
    from governor.policy.steps import PassportPresented

    running, mock, runtime = env
    status, _, _ = await send(running, mock, "POST", "/v1/chat/completions", b"not gzip",
                              {"ADL-Session": "pp", "Content-Encoding": "gzip", "ADL-Passport": "sha256=abc"})
    assert status == 400 and mock.requests == []
    [presented] = runtime.steps_of("pp", PassportPresented)
    assert presented.digest == "abc"
