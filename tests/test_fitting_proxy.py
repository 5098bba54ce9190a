"""Output fitting end to end (issue #22 item 1, docs/fitting.md): through the real proxy and
runtime, in front of the loopback mock upstream, with raw HTTP and the official openai and
anthropic SDKs. A call whose output limit (or the 4,096 guess, for one naming none) does not
fit what remains of its caps is sent upstream with the largest limit that fits; the client
learns it from ADL-Fitted-Output-Tokens and the record says so (on_governor_output_fitted).

The mock's text deltas are "abcd", one token each, and it honours whichever output-limit
field the request carries, so the tokens counted at the client are the tokens delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.adapters.base import AdapterConfig
from governor.adapters.fitting import FITTED_HEADER
from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED, run_python
from tests.upstreams import Behaviour, MockLLM, make_tls

PIECE = "abcd"
MINI_IN, MINI_OUT = 0.15, 0.60  # gpt-4o-mini, USD per million tokens (policies/pricing.yaml)


def write_passport(path: Path, budget: dict[str, Any]) -> Path:
    from governor.passport import sign_passport

    document = {
        "adl_spec": "0.4.0", "name": "fitted-agent", "description": "calls without max_tokens", "version": "1.0.0",
        "id": "https://example.com/agents/fitted-agent", "data_classification": {"sensitivity": "internal"},
        "lifecycle": {"status": "active"}, "permissions": {"resource_limits": {"budget": budget}},
    }
    path.write_text(json.dumps(sign_passport(document, Ed25519PrivateKey.generate())))
    return path


class Governed:
    """A governor on a passport with `budget`, in front of a mock upstream (TLS for the SDKs)."""

    def __init__(self, tmp: Path, budget: dict[str, Any], *, tls: bool = False, **adapters: Any) -> None:
        self.tmp, self.budget, self.tls, self.adapters = tmp, budget, tls, adapters

    async def __aenter__(self) -> "Governed":
        tls = make_tls(self.tmp / "tls") if self.tls else None
        self.mock = MockLLM(tls)
        await self.mock.start()
        self.running = await serve(Settings(
            **AGENT_NAMED, passport=write_passport(self.tmp / "passport.json", self.budget),
            listen=("127.0.0.1", 0), control=None, data_dir=self.tmp / "data", tick_interval=0,
            upstream_ca=tls.ca_file if tls else None, adapters=AdapterConfig(**self.adapters)))
        self.sdk_env = {"HTTPS_PROXY": self.running.proxy_url, "SSL_CERT_FILE": str(self.running.ca_file),
                        "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{self.mock.base_url}/v1",
                        "ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": self.mock.base_url}
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.running.stop()
        await self.mock.stop()

    def client(self, connections: int = 8) -> httpx.AsyncClient:
        return httpx.AsyncClient(proxy=self.running.proxy_url, trust_env=False, timeout=60,
                                 limits=httpx.Limits(max_connections=connections, max_keepalive_connections=0))

    async def used(self, session: str, dimension: str) -> float:
        view = await self.running.runtime.session_view(session)
        return next(b["used"] for b in view["budgets"]
                    if b["scope"] == "per_session" and b["persona"] is None and b["dimension"] == dimension)

    def events(self, session: str, cause: str) -> list[dict[str, Any]]:
        return [e for e in self.running.runtime.record(session)["events"] if e["cause"] == cause]


async def stream_once(client: httpx.AsyncClient, url: str, session: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat completion: status, the fitted header, tokens delivered, whether cut."""
    seen: dict[str, Any] = {"status": None, "fitted": None, "tokens": 0, "cut": False, "usage": None}
    chars = 0
    async with client.stream("POST", url, json=body, headers={"ADL-Session": session}) as response:
        seen["status"] = response.status_code
        seen["fitted"] = response.headers.get(FITTED_HEADER)
        if response.status_code != 200:
            seen["error"] = orjson.loads(await response.aread())
            return seen
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = orjson.loads(line[6:])
            if "governor" in data or "error" in data:
                seen["cut"] = True
            if data.get("usage"):
                seen["usage"] = data["usage"]
            for choice in data.get("choices") or ():
                chars += len((choice.get("delta") or {}).get("content") or "")
    seen["tokens"] = -(-chars // len(PIECE))
    return seen


async def parallel_without_max_tokens(gov: Governed, session: str, calls: int = 64) -> list[dict[str, Any]]:
    gov.mock.default = Behaviour(text=PIECE * 6000, chunks=6000, input_tokens=11, output_tokens=6000,
                                 honour_max_tokens=True)
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "write on"}]}
    async with gov.client(calls) as client:
        return await asyncio.wait_for(asyncio.gather(*[
            stream_once(client, f"{gov.mock.base_url}/v1/chat/completions", session, body) for _ in range(calls)]), 120)


def assert_served_within_their_fitted_limits(results: list[dict[str, Any]], gov: Governed) -> list[dict[str, Any]]:
    served = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] != 200]
    assert served and refused and len(served) + len(refused) == 64
    for r in served:  # each stream ran to its end, exactly as long as the limit it was sent with
        assert not r["cut"] and r["fitted"] is not None and r["tokens"] == int(r["fitted"]), r
    for r in refused:
        assert r["status"] == 429 and r["error"]["error"]["governor"]["cause"] == "on_budget_exhausted", r
    limits = sorted(request.body["max_completion_tokens"] for request in gov.mock.requests)
    assert limits == sorted(int(r["fitted"]) for r in served)  # what the upstream was asked for
    return served


async def test_64_parallel_calls_without_max_tokens_stay_within_a_token_cap(tmp_path):
    cap = 10_000
    async with Governed(tmp_path, {"tokens": {"per_session": cap}}) as gov:
        results = await parallel_without_max_tokens(gov, "tokens")
        served = assert_served_within_their_fitted_limits(results, gov)
        delivered = sum(r["tokens"] + r["usage"]["prompt_tokens"] for r in served)
        used = await gov.used("tokens", "tokens")
        fitted = gov.events("tokens", "on_governor_output_fitted")
    print(f"\n64 calls, no max_tokens, {cap}-token cap: {len(served)} served with limits "
          f"{sorted(int(r['fitted']) for r in served)}, {delivered} tokens delivered, counter {used}")
    assert delivered <= cap and used <= cap
    assert any(int(r["fitted"]) < 4096 for r in served)  # the last one admitted was fitted below the guess...
    assert fitted and fitted[0]["detail"]["output_tokens_requested"] == 4096  # ...and recorded
    assert fitted[0]["action"] == "fallback" and fitted[0]["detail"]["decision"] == "permit"


async def test_64_parallel_calls_without_max_tokens_stay_within_a_cost_cap(tmp_path):
    cap = 0.006  # 10,000 output tokens of gpt-4o-mini
    async with Governed(tmp_path, {"cost_usd": {"per_session": cap}}) as gov:
        results = await parallel_without_max_tokens(gov, "cost")
        served = assert_served_within_their_fitted_limits(results, gov)
        spent = sum(r["usage"]["prompt_tokens"] * MINI_IN + r["tokens"] * MINI_OUT for r in served) / 1e6
        used = await gov.used("cost", "cost_usd")
        fitted = gov.events("cost", "on_governor_output_fitted")
    print(f"\n64 calls, no max_tokens, ${cap} cap: {len(served)} served with limits "
          f"{sorted(int(r['fitted']) for r in served)}, ${spent:.6f} delivered, counter ${used:.6f}")
    assert spent <= cap and used <= cap
    assert fitted and fitted[0]["detail"]["dimension"] == "cost_usd"


async def test_with_fitting_off_the_same_load_is_cut_mid_stream(tmp_path):
    # today's behaviour, for contrast: two calls reserve the 4,096 guess, stream past it and are cut
    async with Governed(tmp_path, {"tokens": {"per_session": 10_000}}, fit_output=False) as gov:
        results = await parallel_without_max_tokens(gov, "unfitted")
    served = [r for r in results if r["status"] == 200]
    assert served and all(r["fitted"] is None for r in served)
    assert any(r["cut"] for r in served)
    assert all("max_completion_tokens" not in request.body for request in gov.mock.requests)


SDK = """
import json, openai, anthropic
out = {}
def record(name, fn):
    try:
        out[name] = fn()
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        out[name] = {"raised": type(e).__name__, "status": e.status_code, "message": e.message, "body": e.body}
oa = openai.OpenAI(max_retries=0)
an = anthropic.Anthropic(max_retries=0)
def chat(session, **extra):
    raw = oa.chat.completions.with_raw_response.create(model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hello"}], extra_headers={"ADL-Session": session}, **extra)
    return {"fitted": raw.headers.get("ADL-Fitted-Output-Tokens"), "usage": raw.parse().usage.completion_tokens}
def responses(session):
    raw = oa.responses.with_raw_response.create(model="gpt-4o-mini", input="hello",
        extra_headers={"ADL-Session": session})
    return {"fitted": raw.headers.get("ADL-Fitted-Output-Tokens"), "usage": raw.parse().usage.output_tokens}
def messages(session, max_tokens):
    raw = an.messages.with_raw_response.create(model="claude-haiku-4-5", max_tokens=max_tokens,
        messages=[{"role": "user", "content": "hello"}], extra_headers={"ADL-Session": session})
    return {"fitted": raw.headers.get("ADL-Fitted-Output-Tokens"), "usage": raw.parse().usage.output_tokens}
"""


async def test_the_first_call_of_a_3000_token_budget_is_served_by_each_protocol(tmp_path):
    async with Governed(tmp_path, {"tokens": {"per_session": 3000}}, tls=True) as gov:
        gov.mock.default = Behaviour(text=PIECE * 5000, chunks=5000, output_tokens=5000, honour_max_tokens=True)
        out = await run_python(SDK + """
record("chat", lambda: chat("chat"))
record("responses", lambda: responses("responses"))
record("messages", lambda: messages("messages", 4096))
record("named", lambda: chat("named", max_tokens=8000))
print(json.dumps(out))
""", gov.sdk_env)
        sent = {r.headers.get("adl-session", r.path): r.body for r in gov.mock.requests}
        bodies = [r.body for r in gov.mock.requests]
        record = gov.events("chat", "on_governor_output_fitted")
    for name in ("chat", "responses", "messages", "named"):
        served = out[name]
        assert "raised" not in served, served
        fitted = int(served["fitted"])
        assert 2800 < fitted < 3000 and served["usage"] == fitted, (name, served)  # the input took the rest
    assert bodies[0]["max_completion_tokens"] == int(out["chat"]["fitted"])  # inserted: the request named none
    assert bodies[1]["max_output_tokens"] == int(out["responses"]["fitted"])
    assert bodies[2]["max_tokens"] == int(out["messages"]["fitted"])  # Anthropic's 4,096 lowered
    assert bodies[3]["max_tokens"] == int(out["named"]["fitted"]) and "max_completion_tokens" not in bodies[3]
    assert sent  # every call reached the upstream
    [event] = record
    assert event["detail"]["output_tokens_requested"] == 4096
    assert event["detail"]["output_tokens_fitted"] == int(out["chat"]["fitted"])
    assert (event["detail"]["limit"], event["detail"]["observed"]) == (3000, 0)


async def test_a_call_below_the_floor_is_refused_naming_used_and_limit(tmp_path):
    async with Governed(tmp_path, {"tokens": {"per_session": 3000}}, tls=True) as gov:
        gov.mock.script(Behaviour(input_tokens=11, output_tokens=2900))  # the first answer spends most of it
        out = await run_python(SDK + """
record("first", lambda: chat("floor"))
record("second", lambda: chat("floor"))
print(json.dumps(out))
""", gov.sdk_env)
        requests = len(gov.mock.requests)
    assert "raised" not in out["first"]
    refused = out["second"]
    print("\nbelow the floor:", refused["message"])
    assert refused["status"] == 429 and refused["raised"] == "RateLimitError", refused
    governor = refused["body"]["governor"]
    assert governor["cause"] == "on_budget_exhausted" and governor["fit_floor"] == 256
    assert 0 < governor["fit_room"] < 256
    assert "(used 2911)" in refused["message"] and "limit 3000" in refused["message"]
    assert f"at most {governor['fit_room']} output tokens would fit, under the fitting floor of 256" in refused["message"]
    assert requests == 1  # the refused call never reached the upstream


async def test_with_fitting_off_the_first_call_of_a_3000_token_budget_is_refused_on_the_guess(tmp_path):
    async with Governed(tmp_path, {"tokens": {"per_session": 3000}}, tls=True, fit_output=False) as gov:
        out = await run_python(SDK + """
record("chat", lambda: chat("off"))
print(json.dumps(out))
""", gov.sdk_env)
        requests = len(gov.mock.requests)
    refused = out["chat"]
    print("\nfitting off:", refused["message"])
    assert refused["status"] == 429 and "limit 3000 (used 0)" in refused["message"], refused
    assert "projected 4" in refused["message"] and requests == 0


async def test_a_raised_floor_refuses_what_the_default_floor_fits(tmp_path):
    async with Governed(tmp_path, {"tokens": {"per_session": 3000}}, fit_floor=2990) as gov:
        async with gov.client() as client:
            response = await client.post(f"{gov.mock.base_url}/v1/chat/completions", headers={"ADL-Session": "raised"},
                                         json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 429 and response.json()["error"]["governor"]["fit_floor"] == 2990


HOSTILE_LIMITS = [-5, 0, 1.5, "100", True, [100], {"n": 1}, 2**64, -(2**63)]


async def test_hostile_output_limits_get_a_clear_400_and_never_reach_the_upstream(tmp_path):
    async with Governed(tmp_path, {"tokens": {"per_session": 100_000}}) as gov:
        base = gov.mock.base_url
        async with gov.client() as client:
            answers = []
            for path, field in (("/v1/chat/completions", "max_tokens"), ("/v1/chat/completions", "max_completion_tokens"),
                                ("/v1/responses", "max_output_tokens"), ("/v1/messages", "max_tokens")):
                for value in HOSTILE_LIMITS:
                    body: dict[str, Any] = {"model": "gpt-4o-mini", field: value}
                    body.update({"input": "hi"} if path == "/v1/responses" else
                                {"messages": [{"role": "user", "content": "hi"}]})
                    raw = json.dumps(body).encode()  # 2**64 is valid JSON orjson cannot read: its own 400
                    response = await asyncio.wait_for(client.post(
                        base + path, content=raw, headers={"ADL-Session": "hostile", "content-type": "application/json"}), 10)
                    answers.append((path, field, value, response.status_code, response.text))
            # null is no limit: served, with the reservation's limit inserted
            nulled = await client.post(base + "/v1/chat/completions", headers={"ADL-Session": "hostile"},
                                       json={"model": "gpt-4o-mini", "max_tokens": None,
                                             "messages": [{"role": "user", "content": "hi"}]})
            huge = await client.post(base + "/v1/chat/completions", headers={"ADL-Session": "hostile"},
                                     json={"model": "gpt-4o-mini", "max_tokens": 10**18,
                                           "messages": [{"role": "user", "content": "hi"}]})
        sent = [r.body for r in gov.mock.requests]
        view = await gov.running.runtime.session_view("hostile")
    for path, field, value, status, text in answers:
        assert status == 400, (path, field, value, status, text)
        assert "must be a positive integer" in text or "not valid JSON" in text, (path, field, value, text)
        if not isinstance(value, int) or abs(value) < 2**63:
            assert f"'{field}' must be a positive integer" in text, (path, field, value, text)
    assert nulled.status_code == 200 and nulled.headers[FITTED_HEADER] == "4096"
    assert huge.status_code == 200 and 99_000 < int(huge.headers[FITTED_HEADER]) < 100_000  # fitted to the cap
    assert [b.get("max_tokens") for b in sent] == [None, int(huge.headers[FITTED_HEADER])]
    assert sent[0]["max_completion_tokens"] == 4096
    assert view["state"] == "active"


def test_fitting_options_from_flag_environment_and_config_file(tmp_path):
    from governor.cli import UsageError
    from governor.cli.run import OPTIONS, resolve

    def args(**values: Any) -> argparse.Namespace:
        return argparse.Namespace(**{**{name: None for name in OPTIONS}, **values})

    default = resolve(args(), {}).adapters
    assert (default.fit_output, default.fit_floor) == (True, 256)
    off = resolve(args(fit_output="off", fit_floor="64"), {}).adapters
    assert (off.fit_output, off.fit_floor) == (False, 64)
    env = resolve(args(), {"GOVERNOR_FIT_OUTPUT": "off", "GOVERNOR_FIT_FLOOR": "512"}).adapters
    assert (env.fit_output, env.fit_floor) == (False, 512)
    config = tmp_path / "governor.yaml"
    config.write_text("fit_output: off\nfit_floor: 128\ndefault_output_tokens: 1000\n")  # YAML reads off as false
    from_file = resolve(args(config=str(config)), {}).adapters
    assert (from_file.fit_output, from_file.fit_floor, from_file.default_output_tokens) == (False, 128, 1000)
    for bad in ({"fit_output": "maybe"}, {"fit_floor": "0"}, {"fit_floor": "-3"}, {"fit_floor": "1.5"}):
        with pytest.raises(UsageError, match="--fit-"):
            resolve(args(**bad), {})
