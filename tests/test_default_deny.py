"""Default deny (issue 29): traffic no adapter governs is refused unless the operator's
allow-list names it, the passport's `permissions.network.allowed_hosts` is the agent's egress
allow-list, and a halted session reaches nothing, with or without its token.

Real components: the real proxy on the real runtime (the bundled example passport, or one
written from it), sessions opened by a principal over the control plane (the default
options), an agent's real HTTP client, and the loopback mock upstream (tests/upstreams.py),
which records every request that reaches it whatever its path. Records are fetched from the
control plane and verified with `governor verify`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest

from governor.adapters import AllowEntry
from governor.cli import UsageError
from governor.cli import main as governor_cli
from governor.cli.run import register, resolve
from governor.evidence import KeyFiles
from governor.proxy.egress import EgressHosts
from governor.proxy.server import Settings, serve
from tests.restartable_governor import write_passport
from tests.upstreams import MockLLM

CONTROL = "control-token-for-default-deny-0123456789"
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
# A call the example passport's 20,000-token session budget refuses even fitted (docs/fitting.md)
UNFITTABLE = {**CHAT, "max_tokens": 30_000, "n": 100}
MCP_CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_shell", "arguments": {"c": "id"}}}


class World:
    def __init__(self, running: Any, mock: MockLLM) -> None:
        self.running, self.mock = running, mock
        self.agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
        self.control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30,
                                         headers={"Authorization": f"Bearer {CONTROL}"})

    async def open(self) -> dict[str, Any]:
        answer = await self.control.post("/v1/sessions", json={"label": "deny"})
        assert answer.status_code == 201, answer.text
        return answer.json()

    async def send(self, method: str, path: str, token: str | None, body: Any = None, **headers: str) -> httpx.Response:
        if token is not None:
            headers["ADL-Session"] = token
        content = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        if content is not None:
            headers.setdefault("content-type", "application/json")
        return await self.agent.request(method, f"{self.mock.base_url}{path}", content=content, headers=headers)

    async def record(self, session: str) -> dict[str, Any]:
        answer = await self.control.get(f"/v1/sessions/{session}/record")
        assert answer.status_code == 200, answer.text
        return answer.json()

    async def close(self) -> None:
        await self.agent.aclose()
        await self.control.aclose()


@asynccontextmanager
async def world_of(tmp: Path, **settings: Any) -> AsyncIterator[World]:
    mock = MockLLM()
    await mock.start()
    options = dict(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp / "data", tick_interval=0,
                   control_token=CONTROL)
    running = await serve(Settings(**{**options, **settings}))
    world = World(running, mock)
    try:
        yield world
    finally:
        await world.close()
        await running.stop()
        await mock.stop()


def governor_of(answer: httpx.Response) -> dict[str, Any]:
    """The governor object of a refusal in any protocol's error shape (OpenAI's and the
    generic one, Anthropic's, a JSON-RPC error's data)."""
    body = answer.json()
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    found = error.get("governor") or body.get("governor") or (error.get("data") or {}).get("governor")
    assert found is not None, answer.text
    return found


def refused(answer: httpx.Response, refusal: str, status: int = 403) -> dict[str, Any]:
    assert answer.status_code == status, (answer.status_code, answer.text)
    gov = governor_of(answer)
    assert gov["refusal"] == refusal, gov
    return gov


def refusals_in(record: dict[str, Any]) -> list[str]:
    return [e["detail"]["reason"] for e in record["events"] if e["cause"] == "on_governor_request_refused"]


def verified(running: Any, record: dict, tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(KeyFiles(running.settings.data_dir / "keys").public_key)])
    out = capsys.readouterr().out
    assert code == 3 and "\nINCOMPLETE" in out and "FAIL " not in out, out  # pinned key: not VALID


# --- default deny ----------------------------------------------------------------------------


async def test_unknown_traffic_is_refused_by_default_naming_what_allows_it_and_recorded(tmp_path, capsys):
    async with world_of(tmp_path) as world:
        opened = await world.open()
        for method, path, body in (("GET", "/robots.txt", None), ("POST", "/v1/widgets", {"name": "x"}),
                                   ("POST", "/v1/chat", {"model": "command-r", "message": "hi"}),  # Cohere
                                   ("GET", "/v1/models", None)):
            answer = await world.send(method, path, opened["token"], body)
            gov = refused(answer, "unknown_traffic")
            message = answer.json()["error"]["message"]
            assert "--allow" in message and "allow" in message and "--unknown-traffic forward" in message, message
            assert gov["session"] == opened["session"] and answer.headers["adl-governor-action"] == "deny"
        assert world.mock.requests == []
        record = await world.record(opened["session"])
        verified(world.running, record, tmp_path, capsys)
        assert refusals_in(record) == ["unknown_traffic"] * 4
        routes = [e["detail"]["route"] for e in record["events"] if e["cause"] == "on_governor_request_refused"]
        assert routes == ["/robots.txt", "/v1/widgets", "/v1/chat", "/v1/models"]
        metrics = (await world.control.get("/metrics")).text
        assert 'governor_proxy_refusals_total{reason="unknown_traffic",recorded="true"} 4.0' in metrics
        # the session goes on: a governed call is served
        assert (await world.send("POST", "/v1/chat/completions", opened["token"], CHAT)).status_code == 200


async def test_the_opt_out_forwards_unknown_traffic_ungoverned_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="governor.proxy"):
        async with world_of(tmp_path, unknown_traffic="forward") as world:
            opened = await world.open()
            answer = await world.send("POST", "/v1/widgets", opened["token"], {"name": "x"})
            assert answer.status_code == 200 and [r.path for r in world.mock.requests] == ["/v1/widgets"]
            assert world.running.chain.unknown_seen["127.0.0.1"] == 1
            assert refusals_in(await world.record(opened["session"])) == []
    assert any("--unknown-traffic forward" in r.getMessage() and "ungoverned" in r.getMessage() for r in caplog.records)


# --- the operator's allow-list ----------------------------------------------------------------


ALLOW = (AllowEntry.parse("127.0.0.1/pkgs/**"), AllowEntry.parse("GET,HEAD 127.0.0.1/status"))


async def test_the_allow_list_lets_through_only_what_no_adapter_governs(tmp_path, capsys):
    async with world_of(tmp_path, allow=ALLOW) as world:
        opened = await world.open()
        token = opened["token"]
        assert (await world.send("GET", "/pkgs/simple/orjson/", token)).status_code == 200
        assert (await world.send("POST", "/pkgs/upload", token, b"a wheel", **{"content-type": "application/zip"})
                ).status_code == 200
        assert (await world.send("GET", "/status", token)).status_code == 200
        assert [r.path for r in world.mock.requests] == ["/pkgs/simple/orjson/", "/pkgs/upload", "/status"]
        assert world.running.chain.allowed_seen["127.0.0.1"] == 3
        # not named: another method, another path
        refused(await world.send("POST", "/status", token, {"a": 1}), "unknown_traffic")
        refused(await world.send("GET", "/pkgsx", token), "unknown_traffic")
        # an allowed path never carries a model call, nor an ungoverned MCP call
        answer = await world.send("POST", "/pkgs/llm", token, CHAT)
        assert answer.status_code == 403 and "carries a model call" in answer.json()["error"]["message"]
        # in any letter case (Go's encoding/json folds the case of keys: Ollama reads this one)
        upper = {"Model": "llama3", "MESSAGES": CHAT["messages"]}
        answer = await world.send("POST", "/pkgs/llm", token, upper)
        assert answer.status_code == 403 and "letter case" in answer.json()["error"]["message"]
        answer = await world.send("POST", "/pkgs/api/chat", token, upper)  # Ollama's path: its adapter refuses it
        assert answer.status_code == 400 and "letter case" in answer.json()["error"], answer.text
        # nor does a model endpoint on an allowed path stop being governed
        assert (await world.send("POST", "/pkgs/v1/chat/completions", token, CHAT)).status_code == 200
        answer = await world.send("POST", "/pkgs/mcp", token, MCP_CALL, accept="application/json, text/event-stream")
        error = answer.json()["error"]
        assert error["data"]["governor"]["tool"] == "run_shell", error  # governed: refused by the passport
        assert len(world.mock.requests) == 4
        view = await world.running.runtime.session_view(opened["session"])
        assert view["iterations"] == 1  # the chat call: neither the allowed traffic nor the refused tool call
        record = await world.record(opened["session"])
        verified(world.running, record, tmp_path, capsys)
        assert refusals_in(record) == ["unknown_traffic", "unknown_traffic", "unclaimed_model_call",
                                       "unclaimed_model_call", "bad_request"]


async def test_an_ignore_route_is_an_allow_list_entry(tmp_path):
    from governor.adapters import Route

    async with world_of(tmp_path, routes=(Route("127.0.0.1", "/health/**", "ignore"),)) as world:
        token = (await world.open())["token"]
        assert (await world.send("GET", "/health/live", token)).status_code == 200
        answer = await world.send("POST", "/health/chat", token, CHAT)  # before: passed ungoverned
        assert answer.status_code == 403 and "carries a model call" in answer.json()["error"]["message"]
        assert [r.path for r in world.mock.requests] == ["/health/live"]


# --- halted sessions ---------------------------------------------------------------------------


async def test_after_a_halt_nothing_reaches_the_upstream_with_or_without_the_token(tmp_path, capsys):
    async with world_of(tmp_path, allow=ALLOW) as world:
        opened = await world.open()
        token = opened["token"]
        answer = await world.send("POST", "/v1/chat/completions", token, UNFITTABLE)
        assert answer.status_code == 429 and answer.json()["error"]["governor"]["cause"] == "on_budget_exhausted"
        assert (await world.running.runtime.session_view(opened["session"]))["state"] == "halted"
        served = len(world.mock.requests)
        channels = [("POST", "/v1/chat/completions", CHAT), ("POST", "/v1/messages", {**CHAT, "max_tokens": 5}),
                    ("POST", "/mcp", MCP_CALL), ("GET", "/pkgs/simple/", None), ("GET", "/status", None),
                    ("POST", "/v1/widgets", {"name": "x"}), ("POST", "/v1/chat", {"model": "m", "message": "x"})]
        for method, path, body in channels:
            # with the token: the session is halted (governed steps are refused by the decision point)
            answer = await world.send(method, path, token, body, accept="application/json, text/event-stream")
            assert answer.status_code in (403, 429) or "error" in answer.json(), (path, answer.text)
            # without it: a principal opened a session here, so token-less traffic belongs to none
            answer = await world.send(method, path, None, body, accept="application/json, text/event-stream")
            refused(answer, "session_token_required")
        assert len(world.mock.requests) == served, [r.path for r in world.mock.requests[served:]]
        record = await world.record(opened["session"])
        verified(world.running, record, tmp_path, capsys)
        assert refusals_in(record).count("session_halted") == 4  # allowed (2) and unknown (2) traffic, recorded
        # ended by the principal: its token is refused outright, allowed traffic too
        assert (await world.control.post(f"/v1/sessions/{opened['session']}/end")).status_code == 200
        refused(await world.send("GET", "/pkgs/simple/", token), "session_ended")
        assert len(world.mock.requests) == served


async def test_a_halted_default_session_refuses_allowed_traffic_token_less(tmp_path):
    async with world_of(tmp_path, allow=ALLOW, default_session="on") as world:
        assert (await world.send("GET", "/status", None)).status_code == 200
        assert (await world.send("POST", "/v1/chat/completions", None, UNFITTABLE)).status_code == 429
        served = len(world.mock.requests)
        gov = refused(await world.send("GET", "/status", None), "session_halted")
        assert gov["cause"] == "on_budget_exhausted"
        assert len(world.mock.requests) == served


# --- the passport's allowed_hosts ----------------------------------------------------------------


def test_host_patterns_follow_core_4_4():
    hosts = EgressHosts(["api.openai.com", "*.example.org", "127.0.0.1", "::1"])
    assert hosts.allows("api.openai.com") and hosts.allows("API.OpenAI.com.") and hosts.allows("127.0.0.1")
    assert hosts.allows("a.example.org") and hosts.allows("[::1]")
    assert not hosts.allows("a.b.example.org")  # `*` never crosses a dot
    assert not hosts.allows("example.org") and not hosts.allows("api.openai.com.evil") and not hosts.allows("localhost")
    assert EgressHosts.of_passport({"permissions": {}}) is None  # none declared: no restriction
    assert not EgressHosts.of_passport({"permissions": {"network": {"allowed_hosts": []}}}).allows("x")
    with pytest.raises(ValueError, match="allowed_hosts"):
        EgressHosts.of_passport({"permissions": {"network": {"allowed_hosts": ["**.example.org"]}}})


async def test_a_host_outside_the_passports_allowed_hosts_is_refused_and_recorded(tmp_path, capsys):
    passport = write_passport(tmp_path / "passport.json", mutate=lambda doc: doc["permissions"]["network"].update(
        allowed_hosts=["api.openai.com", "*.example.org"]))
    async with world_of(tmp_path, passport=passport, allow=ALLOW, unknown_traffic="forward") as world:
        opened = await world.open()
        for method, path, body in (("POST", "/v1/chat/completions", CHAT), ("GET", "/pkgs/x", None),
                                   ("GET", "/anything", None)):  # governed, allowed, forwarded by the opt-out
            answer = await world.send(method, path, opened["token"], body)
            gov = refused(answer, "host_not_allowed")
            assert "allowed_hosts" in gov["reason"] and "127.0.0.1" in gov["reason"], gov
        # the OpenAI error shape for an OpenAI endpoint: the SDK raises a readable error
        assert answer.json()["error"]["type"] == "governor_error"
        # token-less traffic the opt-out forwards in no session: refused too, counted
        refused(await world.send("GET", "/anything", None), "host_not_allowed")
        assert world.mock.requests == []
        record = await world.record(opened["session"])
        verified(world.running, record, tmp_path, capsys)
        assert refusals_in(record) == ["host_not_allowed"] * 3
        metrics = (await world.control.get("/metrics")).text
        assert 'governor_proxy_refusals_total{reason="host_not_allowed",recorded="false"} 1.0' in metrics


async def test_a_host_header_naming_an_allowed_host_does_not_open_another(tmp_path):
    """The host checked is the one the governor connects to (the request's target), not
    what the agent's Host header claims."""
    passport = write_passport(tmp_path / "passport.json", mutate=lambda doc: doc["permissions"]["network"].update(
        allowed_hosts=["api.openai.com"]))
    async with world_of(tmp_path, passport=passport) as world:
        host, port = world.running.proxy_url.rsplit("//", 1)[1].rsplit(":", 1)
        body = json.dumps(CHAT).encode()
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(f"POST {world.mock.base_url}/v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        finally:
            writer.close()
        assert head.startswith(b"HTTP/1.1 403"), head
        assert world.mock.requests == []


# --- raw TCP ---------------------------------------------------------------------------------------


async def test_a_tunnel_that_is_not_http_is_closed_by_default(tmp_path):
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with world_of(tmp_path) as world:
            assert await _through_tunnel(world.running.proxy_url, port) == b""  # closed, nothing echoed
        async with world_of(tmp_path / "fwd", unknown_traffic="forward") as world:
            assert await _through_tunnel(world.running.proxy_url, port) == b"SSH-2.0-agent\r\n"
        # the opt-out forwards streams, but not to a host outside the passport's allowed_hosts
        passport = write_passport(tmp_path / "passport.json", mutate=lambda doc: doc["permissions"]["network"].update(
            allowed_hosts=["api.openai.com"]))
        async with world_of(tmp_path / "hosts", passport=passport, unknown_traffic="forward") as world:
            assert await _through_tunnel(world.running.proxy_url, port) == b""
    finally:
        server.close()
        await server.wait_closed()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        writer.write(await reader.readline())
        await writer.drain()
    finally:
        writer.close()


async def _through_tunnel(proxy_url: str, port: int) -> bytes:
    host, proxy_port = proxy_url.rsplit("//", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(proxy_port))
    try:
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert b" 200 " in head.split(b"\r\n", 1)[0], head
        writer.write(b"SSH-2.0-agent\r\n")  # not TLS, not HTTP: a raw TCP stream
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(100), 10)
        except ConnectionError:
            return b""
    finally:
        writer.close()


# --- configuration -------------------------------------------------------------------------------


def _resolve(argv: list[str], environ: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return resolve(parser.parse_args(["run", *argv]), environ or {})


def test_the_allow_list_from_the_command_line_the_environment_and_the_config_file(tmp_path):
    assert _resolve([]).unknown_traffic == "deny" and _resolve([]).allow == ()
    settings = _resolve(["--allow", "pypi.org", "--allow", "GET,HEAD api.internal/status/**"])
    assert [e.describe() for e in settings.allow] == ["pypi.org", "GET,HEAD api.internal/status/**"]
    settings = _resolve([], {"GOVERNOR_ALLOW": "GET,HEAD api.internal/status/*, pypi.org,*.pythonhosted.org"})
    assert [e.describe() for e in settings.allow] == ["GET,HEAD api.internal/status/*", "pypi.org", "*.pythonhosted.org"]
    config = tmp_path / "governor.yaml"
    config.write_text("allow:\n  - pypi.org\n  - {host: api.internal, path: /v2/**, methods: [get]}\n"
                      "unknown_traffic: forward\n")
    settings = _resolve(["--config", str(config)])
    assert [e.describe() for e in settings.allow] == ["pypi.org", "GET api.internal/v2/**"]
    assert settings.unknown_traffic == "forward"
    entry = settings.allow[1]
    assert entry.matches("GET", "api.internal", "/v2/a/b") and not entry.matches("POST", "api.internal", "/v2/a")
    assert not entry.matches("GET", "api.internal", "/v3") and not entry.matches("GET", "x.api.internal", "/v2")


@pytest.mark.parametrize("bad", ["https://pypi.org/simple", "FETCH pypi.org", "pypi.org/a**", "**.org", "a b c"])
def test_a_bad_allow_entry_is_a_clear_usage_error(bad):
    with pytest.raises(UsageError, match="--allow"):
        _resolve(["--allow", bad])


def test_a_bad_allow_entry_in_the_config_file_names_it(tmp_path):
    config = tmp_path / "governor.yaml"
    config.write_text("allow:\n  - {host: pypi.org, paths: /x}\n")
    with pytest.raises(UsageError, match="unknown keys paths"):
        _resolve(["--config", str(config)])
    config.write_text("allow: pypi.org\n")  # a string, not a list: read as one entry
    assert [e.describe() for e in _resolve(["--config", str(config)]).allow] == ["pypi.org"]

