"""The official boto3 `bedrock-runtime` client through the real proxy (regular mode, real TLS)
on the real runtime (the bundled example passport: 20,000 tokens and $0.50 per session), in
front of a loopback Bedrock mock that checks every request's SigV4 signature
(tests/bedrock_upstream.py).

boto3 runs in a subprocess configured only through its environment (HTTPS_PROXY,
AWS_CA_BUNDLE for the governor's CA, fake credentials) with `endpoint_url` naming the mock,
as an agent would name a regional endpoint. It sends `ADL-Session` from a `before-send`
hook: after signing, so the header the governor strips was never signed (docs/wire-protocols.md).
"""

from __future__ import annotations

import json

import pytest
import pytest_asyncio

from governor.adapters.counting import count_text
from governor.cli import main as governor_cli
from governor.passport import example_passport_path
from governor.proxy.server import Settings, serve
from tests.bedrock_upstream import ACCESS_KEY, REGION, SECRET_KEY, Answer, MockBedrock, verify_sigv4
from tests.proxy_harness import AGENT_NAMED, run_python
from tests.upstreams import make_tls

pytestmark = pytest.mark.asyncio(loop_scope="module")

HAIKU = "anthropic.claude-3-5-haiku-20241022-v1:0"
HAIKU_PROFILE = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
HAIKU_ARN = f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{HAIKU_PROFILE}"
LLAMA = "meta.llama3-1-8b-instruct-v1:0"
TITAN = "amazon.titan-text-express-v1"
TOOLS = {"tools": [{"toolSpec": {"name": "search_papers", "inputSchema": {"json": {
    "type": "object", "properties": {"query": {"type": "string"}}}}}}]}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sdk-bedrock")
    tls = make_tls(tmp / "tls")
    mock = MockBedrock(tls)
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data",
                                   upstream_ca=tls.ca_file, tick_interval=0))
    sdk_env = {"HTTPS_PROXY": running.proxy_url, "AWS_CA_BUNDLE": str(running.ca_file),
               "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION,
               "AWS_CONFIG_FILE": str(tmp / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "none"),
               "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        yield running, mock, sdk_env
    finally:
        await running.stop()
        await mock.stop()


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()
    yield
    assert all(seen.signature_ok for seen in env[1].requests), "every request reached Bedrock signed as boto3 signed it"
    assert not any(h.lower().startswith("adl-") for seen in env[1].requests for h in seen.headers)


def prelude(endpoint: str, session: str) -> str:
    return f"""
import base64, json, boto3, botocore.exceptions
client = boto3.client("bedrock-runtime", endpoint_url={endpoint!r})
def tag(request, **kwargs):
    request.headers["ADL-Session"] = {session!r}
client.meta.events.register("before-send.bedrock-runtime.*", tag)
out = {{}}
def record(name, fn):
    try:
        out[name] = fn()
    except botocore.exceptions.ClientError as e:
        out[name] = {{"raised": type(e).__name__, "code": e.response["Error"]["Code"],
                     "message": e.response["Error"]["Message"],
                     "status": e.response.get("ResponseMetadata", {{}}).get("HTTPStatusCode"),
                     "retries": e.response.get("ResponseMetadata", {{}}).get("RetryAttempts")}}
def msgs(text="hi"):
    return [{{"role": "user", "content": [{{"text": text}}]}}]
def drain(stream):
    events = []
    for event in stream:
        events.append(event)
    return events
"""


async def tokens_used(running, session: str) -> int:
    view = await running.runtime.session_view(session)
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == "tokens" and b["scope"] == "per_session" and b["persona"] is None)


async def verified(running, session: str, tmp_path, capsys) -> dict:
    record = await running.runtime.end_session(session)
    path = tmp_path / f"{session}.json"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(running.settings.data_dir / "keys" / "governor-pub.pem"),
                         "--passport", str(example_passport_path()), "--no-nonce"])
    text = capsys.readouterr().out
    # every step but the key's resolution (a loopback governor publishes no did:web)
    assert code == 3 and "INCOMPLETE: not every step ran in full: 2 (governor key) partial\n" in text, text
    return record


async def test_converse_plain_and_streamed_are_charged_what_bedrock_reported(env, tmp_path, capsys):
    running, mock, sdk_env = env
    mock.script(Answer(text="Let me search.", input_tokens=31, output_tokens=17, tool=("search_papers", {"query": "x"})),
                Answer(text="streamed answer from the mock", chunks=4, input_tokens=23, output_tokens=12,
                       tool=("search_papers", {"query": "y"})))
    code = prelude(mock.endpoint, "conv") + f"""
def plain():
    r = client.converse(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 64}},
                        toolConfig={TOOLS!r})
    use = [b["toolUse"] for b in r["output"]["message"]["content"] if "toolUse" in b][0]
    return {{"tool": use["name"], "input": use["input"], "usage": r["usage"]}}
def streamed():
    r = client.converse_stream(modelId={HAIKU_ARN!r}, messages=msgs(), inferenceConfig={{"maxTokens": 64}},
                               toolConfig={TOOLS!r})
    events = drain(r["stream"])
    text = "".join(e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e)
    meta = [e["metadata"]["usage"] for e in events if "metadata" in e]
    return {{"text": text, "usage": meta, "kinds": [list(e)[0] for e in events]}}
record("plain", plain)
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["plain"] == {"tool": "search_papers", "input": {"query": "x"},
                            "usage": {"inputTokens": 31, "outputTokens": 17, "totalTokens": 48}}
    assert out["streamed"]["text"] == "streamed answer from the mock"
    assert out["streamed"]["usage"] == [{"inputTokens": 23, "outputTokens": 12, "totalTokens": 35}]
    assert out["streamed"]["kinds"][0] == "messageStart" and out["streamed"]["kinds"][-1] == "metadata"
    # the model id arrived as boto3 encoded it (an ARN with %3A and %2F), and was read as one id
    assert [seen.model_id for seen in mock.requests] == [HAIKU, HAIKU_ARN]
    assert mock.requests[1].path.count("%2F") == 1 and mock.requests[0].path.count("%3A") == 1
    # honest figures (at or above the governor's bytes/4 count of what it relayed) are charged exactly
    assert await tokens_used(running, "conv") == 48 + 35
    record = await verified(running, "conv", tmp_path, capsys)
    assert record["outcome"] == "completed"


@pytest.mark.parametrize("model", [HAIKU_PROFILE, LLAMA, TITAN])
async def test_invoke_model_plain_and_streamed_per_family(env, model):
    running, mock, sdk_env = env
    session = "inv-" + model.split(".")[1][:6]
    mock.script(Answer(text="plain answer", input_tokens=40, output_tokens=6),
                Answer(text="a streamed answer in pieces", chunks=5, input_tokens=41, output_tokens=8))
    bodies = {
        HAIKU_PROFILE: {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64,
                        "messages": [{"role": "user", "content": "hi"}]},
        LLAMA: {"prompt": "<|begin_of_text|>hi", "max_gen_len": 64},
        TITAN: {"inputText": "hi", "textGenerationConfig": {"maxTokenCount": 64}},
    }
    code = prelude(mock.endpoint, session) + f"""
body = json.dumps({bodies[model]!r})
def plain():
    r = client.invoke_model(modelId={model!r}, body=body, contentType="application/json", accept="application/json")
    h = r["ResponseMetadata"]["HTTPHeaders"]
    return {{"body": json.loads(r["body"].read()), "in": h.get("x-amzn-bedrock-input-token-count")}}
def streamed():
    r = client.invoke_model_with_response_stream(modelId={model!r}, body=body, contentType="application/json")
    chunks = [json.loads(e["chunk"]["bytes"]) for e in drain(r["body"])]
    return {{"chunks": len(chunks), "metrics": chunks[-1].get("amazon-bedrock-invocationMetrics")}}
record("plain", plain)
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["plain"]["in"] == "40", out
    assert out["streamed"]["metrics"]["outputTokenCount"] == 8, out
    assert [seen.body for seen in mock.requests] == [bodies[model]] * 2  # byte for byte: the signature held
    assert await tokens_used(running, session) == 46 + 49


async def test_output_limit_that_does_not_fit_is_refused_not_rewritten_and_the_record_verifies(env, tmp_path, capsys):
    running, mock, sdk_env = env
    code = prelude(mock.endpoint, "cap") + f"""
def big():
    return client.converse(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 30000}})
record("first", big)
record("after_halt", lambda: client.converse(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 10}}))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    first = out["first"]
    assert first["code"] == "ServiceQuotaExceededException", out
    assert first["status"] == 400 and first["retries"] == 0  # boto3 retries 429s: the governor sends none
    assert "on_budget_exhausted" in first["message"] and "limit 20000" in first["message"]
    assert "signed" in first["message"] and "inferenceConfig.maxTokens" in first["message"]
    assert out["after_halt"]["code"] == "ServiceQuotaExceededException"
    assert mock.requests == []  # nothing reached Bedrock
    record = await verified(running, "cap", tmp_path, capsys)
    assert [e["cause"] for e in record["events"]].count("on_budget_exhausted") >= 1
    assert record["outcome"] == "halted"


async def test_a_stream_past_the_cap_ends_with_an_exception_event_boto3_raises(env):
    running, mock, sdk_env = env
    mock.script(Answer(text="y" * 120_000, chunks=60, chunk_delay=0.01, input_tokens=10, output_tokens=30_000))
    code = prelude(mock.endpoint, "cut") + f"""
def streamed():
    r = client.converse_stream(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 19000}})
    seen = 0
    try:
        for event in r["stream"]:
            seen += 1
    except botocore.exceptions.ClientError as e:
        return {{"raised": type(e).__name__, "code": e.response["Error"]["Code"],
                "message": e.response["Error"]["Message"], "seen": seen}}
    return {{"completed": True, "seen": seen}}
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    streamed = out["streamed"]
    assert streamed.get("raised") == "EventStreamError" and streamed["code"] == "throttlingException", out
    assert "on_budget_exhausted" in streamed["message"]
    assert 1 < streamed["seen"] < 60
    assert mock.streams[0].disconnected and not mock.streams[0].completed
    assert await tokens_used(running, "cut") > 19000


async def test_a_tool_the_session_may_not_use_refuses_the_signed_call(env):
    running, mock, sdk_env = env
    tools = {"tools": TOOLS["tools"] + [{"toolSpec": {"name": "run_shell", "inputSchema": {"json": {"type": "object"}}}}]}
    code = prelude(mock.endpoint, "tools") + f"""
record("call", lambda: client.converse(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 64}},
                                      toolConfig={tools!r}))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["call"]["code"] == "AccessDeniedException" and out["call"]["status"] == 403, out
    assert "'run_shell'" in out["call"]["message"] and "signed" in out["call"]["message"]
    assert mock.requests == []


async def test_models_the_governor_cannot_read_or_price_are_refused_with_a_reason(env):
    running, mock, sdk_env = env
    code = prelude(mock.endpoint, "unknown") + """
model = "mistral.governor-test-unpriced-v1:0"  # a vendor whose invoke body the adapter does not read, priced nowhere
record("invoke", lambda: client.invoke_model(modelId=model, body=json.dumps({"prompt": "hi", "max_tokens": 64})))
record("converse", lambda: client.converse(modelId=model, messages=msgs(), inferenceConfig={"maxTokens": 64}))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["invoke"]["code"] == "ValidationException" and "Converse" in out["invoke"]["message"], out
    # Converse reads any model; this one has no price and the passport caps cost: refused, saying how to price it
    assert out["converse"]["code"] == "ServiceQuotaExceededException", out
    assert "has no price" in out["converse"]["message"]
    assert mock.requests == []


@pytest.mark.parametrize("corrupt", ["crc", "oversize", "garbage"])
async def test_a_corrupt_event_stream_is_cut_with_an_exception_event(env, corrupt):
    running, mock, sdk_env = env
    # a live upstream (it goes on sending after the bad frame): see the report on an upstream that
    # has sent everything before the cut lands
    mock.script(Answer(text="z" * 400, chunks=8, corrupt=corrupt, chunk_delay=0.02))
    code = prelude(mock.endpoint, f"bad-{corrupt}") + f"""
def streamed():
    r = client.converse_stream(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 64}})
    try:
        drain(r["stream"])
    except botocore.exceptions.ClientError as e:
        return {{"raised": type(e).__name__, "code": e.response["Error"]["Code"], "message": e.response["Error"]["Message"]}}
    return {{"completed": True}}
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["streamed"].get("raised") == "EventStreamError", out
    assert out["streamed"]["code"] == "modelStreamErrorException"
    assert "event-stream" in out["streamed"]["message"] or "event stream" in out["streamed"]["message"]
    if corrupt != "garbage":  # the garbage is the upstream's last write
        assert mock.streams[0].disconnected and not mock.streams[0].completed
    record = running.runtime.record(f"bad-{corrupt}")
    assert any(e["cause"] == "on_governor_request_refused" and e["detail"]["reason"] == "event_too_large"
               for e in record["events"]), record["events"]


async def test_missing_and_lying_usage_are_charged_at_least_what_was_delivered(env):
    running, mock, sdk_env = env
    text = "w" * 4000  # 32 tokens by the governor's count (one word, at most 128 bytes a token)
    mock.script(Answer(text=text, usage=False), Answer(text=text, input_tokens=1, output_tokens=1),
                Answer(text=text, chunks=10, usage=False), Answer(text=text, chunks=10, input_tokens=1, output_tokens=1))
    code = prelude(mock.endpoint, "lies") + f"""
record("a", lambda: client.converse(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 2000}})["stopReason"])
record("b", lambda: client.invoke_model(modelId={LLAMA!r}, body=json.dumps({{"prompt": "hi", "max_gen_len": 2000}}))["ResponseMetadata"]["HTTPStatusCode"])
record("c", lambda: len(drain(client.converse_stream(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 2000}})["stream"])))
record("d", lambda: len(drain(client.invoke_model_with_response_stream(modelId={TITAN!r}, body=json.dumps({{"inputText": "hi", "textGenerationConfig": {{"maxTokenCount": 2000}}}}))["body"])))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["a"] == "end_turn" and out["b"] == 200 and out["c"] > 10 and out["d"] > 10, out
    used = await tokens_used(running, "lies")
    assert used >= 4 * count_text(text)  # each answer charged at least its count, never 0 or 1
    kinds = {d["kind"] for e in running.runtime.record("lies")["events"]
             for d in (e.get("detail") or {}).get("deviations", ()) if d.get("kind", "").startswith("usage_")}
    assert kinds == {"usage_missing", "usage_below_count"}


async def test_a_stream_that_ends_inside_a_frame_is_charged_what_it_delivered(env):
    running, mock, sdk_env = env
    mock.script(Answer(text="t" * 4000, chunks=8, corrupt="truncate", input_tokens=5, output_tokens=1000))
    code = prelude(mock.endpoint, "truncated") + f"""
def streamed():
    r = client.converse_stream(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 2000}})
    try:
        events = drain(r["stream"])
    except Exception as e:  # what boto3 makes of the cut-off frame: either way the call ends
        return {{"raised": type(e).__name__}}
    return {{"kinds": [list(e)[0] for e in events]}}
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert "metadata" not in out["streamed"].get("kinds", []), out  # the usage frame was the one cut off
    assert await tokens_used(running, "truncated") >= 1000  # the text it relayed, counted by the governor


async def test_the_mock_refuses_a_request_changed_after_signing():
    """The check every test above relies on can fail: one byte of the body, or of a signed
    header, changed after boto3's signer signed it."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from multidict import CIMultiDict

    body = b'{"messages":[],"inferenceConfig":{"maxTokens":64}}'
    path = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"
    request = AWSRequest(method="POST", url=f"https://127.0.0.1:9{path}", data=body,
                         headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "bedrock", REGION).add_auth(request)
    headers = CIMultiDict({**dict(request.headers.items()), "Host": "127.0.0.1:9"})
    assert verify_sigv4("POST", "127.0.0.1:9", path, headers, body)
    assert not verify_sigv4("POST", "127.0.0.1:9", path, headers, body.replace(b"64", b"32"))
    assert not verify_sigv4("POST", "127.0.0.1:9", path.replace("%3A", ":"), headers, body)
    changed = CIMultiDict(headers)
    changed["Content-Type"] = "application/json; charset=utf-8"
    assert not verify_sigv4("POST", "127.0.0.1:9", path, changed, body)
    unsigned = CIMultiDict(headers)
    del unsigned["Authorization"]
    assert not verify_sigv4("POST", "127.0.0.1:9", path, unsigned, body)


async def test_a_tool_call_the_model_makes_outside_the_passport_is_refused_plain_and_streamed(env):
    running, mock, sdk_env = env
    mock.script(Answer(text="running it", tool=("run_shell", {"cmd": "rm -rf /"})),
                Answer(text="running it streamed", chunks=3, tool=("run_shell", {"cmd": "ls"}), chunk_delay=0.01))
    code = prelude(mock.endpoint, "denied-plain") + f"""
record("plain", lambda: client.converse(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 64}}))
def tag2(request, **kwargs):
    request.headers["ADL-Session"] = "denied-stream"
client.meta.events.unregister("before-send.bedrock-runtime.*", tag)
client.meta.events.register("before-send.bedrock-runtime.*", tag2)
def streamed():
    r = client.converse_stream(modelId={HAIKU!r}, messages=msgs(), inferenceConfig={{"maxTokens": 64}})
    kinds = []
    try:
        for event in r["stream"]:
            kinds.append(list(event)[0])
    except botocore.exceptions.ClientError as e:
        return {{"raised": type(e).__name__, "code": e.response["Error"]["Code"],
                "message": e.response["Error"]["Message"], "kinds": kinds}}
    return {{"completed": True, "kinds": kinds}}
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["plain"]["code"] == "AccessDeniedException" and "run_shell" in out["plain"]["message"], out
    streamed = out["streamed"]
    assert streamed.get("raised") == "EventStreamError" and streamed["code"] == "modelStreamErrorException", out
    assert "run_shell" in streamed["message"]
    assert "messageStop" not in streamed["kinds"]  # the call's output was held, then cut, never delivered whole
