"""The Redis store over TLS, against real TLS-only redis-servers (issue #30): `rediss://`,
`rediss+cluster://` (three primaries with a replica each, `--tls-cluster yes`) and
`rediss+sentinel://` (the Sentinel and the servers TLS-only), each with a throwaway CA pinned
(`ssl_ca_certs=`) and a client certificate presented (the servers require one). A governed
call goes through the real proxy on each, and its charge is read back from Redis; the hostile
cases (a certificate of another CA, an address the certificate does not name, no client
certificate, plain redis:// at a TLS port, rediss:// at a plain port, a bad TLS option) are
refused at start with a message that says what to change, never a hang or a traceback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest

from governor.proxy.server import Settings, StartupError, serve
from governor.store import open_store
from governor.store.redis_async import AsyncCounters
from governor.store.redis_client import parse_options
from tests.capped_passport_harness import write_passport
from tests.proxy_harness import AGENT_NAMED
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER
from tests.redis_tls import TlsFiles, make_tls_files
from tests.redis_topology import RedisProcess, cluster, sentinel_set
from tests.upstreams import Behaviour, MockLLM

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

CALL = 25  # tokens a call uses: 5 in, 20 out


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(tls, tmp_path_factory):
    """One TLS-only server, on 127.0.0.1 (which its certificate names) and 127.0.0.2 (which it does not)."""
    server = RedisProcess(tmp_path_factory.mktemp("tls-one"), tls=tls, bind="127.0.0.1 127.0.0.2")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    server = RedisProcess(tmp_path_factory.mktemp("plain"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_cluster(tls, tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("tls-cluster"), replicas=1, tls=tls) as c:
        yield c


@pytest.fixture(scope="module")
def tls_sentinels(tls, tmp_path_factory):
    with sentinel_set(tmp_path_factory.mktemp("tls-sentinel"), tls=tls) as s:
        yield s


async def governed_call(tmp_path, store: str, *, session: str = "tls-agent") -> httpx.Response:
    """One model call through the real proxy on `store`; its answer."""
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=5, output_tokens=20)
    try:
        running = await asyncio.wait_for(serve(Settings(
            **AGENT_NAMED, passport=write_passport(tmp_path / "passport.json"), listen=("127.0.0.1", 0),
            control=None, data_dir=tmp_path / "data", store=store, tick_interval=0)), 30)
        try:
            async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as agent:
                return await agent.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": session},
                                        json={"model": "gpt-4o-mini", "max_tokens": 20,
                                              "messages": [{"role": "user", "content": "hi"}]})
        finally:
            await running.stop()
    finally:
        await mock.stop()


async def refused_at_start(tmp_path, store: str) -> str:
    """What serve() says when the store cannot be opened (within a bound: never a hang)."""
    with pytest.raises(StartupError) as refused:
        await asyncio.wait_for(serve(Settings(
            **AGENT_NAMED, passport=write_passport(tmp_path / "passport.json"), listen=("127.0.0.1", 0),
            control=None, data_dir=tmp_path / "data", store=store, tick_interval=0)), 20)
    return str(refused.value)


def day_tokens(client, prefix: str) -> float:
    """The per-day token total the store keeps in Redis, over every counter of `prefix`."""
    total = 0.0
    for key in client.scan_iter(match=f"{prefix}d:*tokens*", count=1000):
        if client.type(key) == "hash":
            total += float(client.hget(key, "t") or 0)
    return total


# --- rediss:// --------------------------------------------------------------------------------


@pytest.fixture
def asyncio_steps(monkeypatch) -> list[int]:
    """One entry per model call admitted on the asyncio client's one-round-trip path."""
    steps: list[int] = []
    original = AsyncCounters.reserve_within

    async def counted(self, *args, **kwargs):
        steps.append(1)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(AsyncCounters, "reserve_within", counted)
    return steps


@pytest.mark.parametrize("sessions", ["shared", "local"])
async def test_a_governed_call_on_rediss_is_charged_in_redis(tls, tls_server, tmp_path, sessions, asyncio_steps):
    """Shared sessions (the blocking client, in a thread) and local ones (the asyncio client)."""
    url = f"rediss://127.0.0.1:{tls_server.port}/0?prefix=one-{sessions}:&sessions={sessions}&{tls.query()}"
    answer = await governed_call(tmp_path, url)
    assert answer.status_code == 200, answer.text
    assert bool(asyncio_steps) == (sessions == "local")
    with tls_server.client() as client:  # the server is TLS-only: this reads what the store wrote over TLS
        assert day_tokens(client, f"one-{sessions}:") == CALL


def test_the_localhost_name_and_an_unchecked_hostname_are_accepted(tls, tls_server):
    for url in (f"rediss://localhost:{tls_server.port}/0?{tls.query()}",  # a DNS name the certificate has
                # an address it does not name, with the check turned off (the CA is still checked)
                f"rediss://127.0.0.2:{tls_server.port}/0?{tls.query()}&ssl_check_hostname=false"):
        open_store(url).close()


@pytest.mark.parametrize(("case", "complaint"), [
    ("another CA", "not signed by a trusted CA: pin its CA with ssl_ca_certs"),
    ("system CAs", "not signed by a trusted CA: pin its CA with ssl_ca_certs"),
    ("wrong address", "certificate is not valid for '127.0.0.2'"),
    ("no client certificate", "does it require a client certificate (ssl_certfile=PATH, ssl_keyfile=PATH)"),
    ("plain at the TLS port", "is this a TLS port? then use rediss://"),
])
async def test_a_tls_server_that_cannot_be_trusted_or_reached_is_refused_at_start(tls, tls_server, tmp_path, case,
                                                                                   complaint):
    port = tls_server.port
    client = f"ssl_certfile={tls.client_cert}&ssl_keyfile={tls.client_key}"
    url = {
        "another CA": f"rediss://:s3cret@127.0.0.1:{port}/0?ssl_ca_certs={tls.other_ca}&{client}",
        "system CAs": f"rediss://:s3cret@127.0.0.1:{port}/0?{client}",
        "wrong address": f"rediss://:s3cret@127.0.0.2:{port}/0?{tls.query()}",
        "no client certificate": f"rediss://:s3cret@127.0.0.1:{port}/0?ssl_ca_certs={tls.ca}",
        "plain at the TLS port": f"redis://:s3cret@127.0.0.1:{port}/0",
    }[case]
    message = await refused_at_start(tmp_path, url)
    assert message.startswith("state store rediss://***@" if "rediss" in url else "state store redis://***@"), message
    assert complaint in message, message
    assert "s3cret" not in message  # the password never shows


async def test_rediss_at_a_plain_port_times_out_at_start_and_says_why(tls, plain_server, tmp_path):
    message = await refused_at_start(tmp_path, f"rediss://127.0.0.1:{plain_server.port}/0?timeout=0.5&{tls.query()}")
    assert "TimeoutError" in message and "is this a plain (non-TLS) port? then use redis://" in message, message


def test_governor_run_refuses_an_untrusted_certificate_in_one_line(tls, tls_server, tmp_path):
    """The CLI: exit 1 with one clear line, no traceback, no hang."""
    env = {**os.environ, "GOVERNOR_DATA_DIR": str(tmp_path / "data")}
    run = subprocess.run([sys.executable, "-m", "governor", "run", "--listen", "127.0.0.1:0",
                          "--control", "off", "--passport", str(write_passport(tmp_path / "passport.json")),
                          "--store", f"rediss://127.0.0.1:{tls_server.port}/0?ssl_ca_certs={tls.other_ca}"],
                         capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert "governor run: state store rediss://" in run.stderr and "CERTIFICATE_VERIFY_FAILED" in run.stderr
    assert "pin its CA with ssl_ca_certs" in run.stderr


# --- the TLS options ------------------------------------------------------------------------------


def test_the_tls_options_reach_every_scheme(tls):
    for url in (f"rediss://h:1/0?{tls.query()}", f"rediss+sentinel://h:1/svc?{tls.query()}",
                f"rediss+cluster://h:1,h:2?{tls.query()}&ssl_check_hostname=false"):
        rest, options, _ = parse_options(url)
        assert "ssl_" not in rest  # the governor's, not passed to redis-py's URL parser
        assert dict(options.tls)["ssl_ca_certs"] == str(tls.ca)
        assert dict(options.tls)["ssl_certfile"] == str(tls.client_cert)
    assert dict(options.tls)["ssl_check_hostname"] is False


@pytest.mark.parametrize(("query", "complaint"), [
    ("ssl_ca_certs={missing}", "ssl_ca_certs: no such file"),
    ("ssl_ca_path={missing}", "ssl_ca_path: no such directory"),
    ("ssl_ca_certs={key}", "no CA certificate (PEM) could be read"),
    ("ssl_ca_certs={ca}&ssl_certfile={cert}&ssl_keyfile={wrong_key}", "not a PEM certificate and its unencrypted"),
    ("ssl_ca_certs={ca}&ssl_keyfile={key}", "ssl_keyfile needs ssl_certfile"),
    ("ssl_check_hostname=maybe", "ssl_check_hostname must be true or false"),
])
@pytest.mark.parametrize("scheme", ["rediss://h:1/0", "rediss+sentinel://:pw@h:1/svc", "rediss+cluster://h:1"])
def test_a_bad_tls_option_is_refused_by_name(tls, tmp_path, scheme, query, complaint):
    url = f"{scheme}?" + query.format(missing=tmp_path / "missing.pem", key=tls.client_key, ca=tls.ca,
                                      cert=tls.client_cert, wrong_key=tls.server_key)
    with pytest.raises(ValueError) as refused:
        parse_options(url)
    assert complaint in str(refused.value)
    assert ":pw@" not in str(refused.value)


@pytest.mark.parametrize("scheme", ["redis://h:1/0", "redis+sentinel://h:1/svc", "redis+cluster://h:1"])
def test_tls_options_without_tls_are_refused(tls, scheme):
    with pytest.raises(ValueError, match="need.* TLS: use rediss://"):
        parse_options(f"{scheme}?ssl_ca_certs={tls.ca}")


# --- rediss+cluster:// --------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["prefix=tls-shared", "prefix=tls-local&sessions=local", "prefix=tls-wait&wait=1"])
async def test_a_governed_call_on_a_tls_cluster_is_charged_on_the_slot_owner(tls, tls_cluster, tmp_path, query,
                                                                              asyncio_steps):
    """Shared sessions (the blocking client, in a thread), local ones (the model call's
    one-round-trip path on the asyncio client) and wait=1 (WAIT on the owner's TLS connection)."""
    answer = await governed_call(tmp_path, tls_cluster.url(f"{query}&{tls.query()}"))
    assert answer.status_code == 200, answer.text
    assert bool(asyncio_steps) == ("sessions=local" in query)
    prefix = "{" + query.split("&")[0].removeprefix("prefix=") + "}:"
    owner = tls_cluster.node(tls_cluster.owner(f"{prefix}fence"))
    with owner.client() as client:
        assert day_tokens(client, prefix) == CALL
        if "wait=1" in query:  # acknowledged by the owner's replica, over TLS replication
            assert client.info("replication")["connected_slaves"] == 1


async def test_a_tls_cluster_with_a_certificate_of_another_ca_is_refused_at_start(tls, tls_cluster, tmp_path):
    client = f"ssl_certfile={tls.client_cert}&ssl_keyfile={tls.client_key}"
    message = await refused_at_start(tmp_path, tls_cluster.url(f"timeout=1&ssl_ca_certs={tls.other_ca}&{client}"))
    assert "no node names the owner of slot" in message and "CERTIFICATE_VERIFY_FAILED" in message, message
    assert "pin its CA with ssl_ca_certs" in message


# --- rediss+sentinel:// --------------------------------------------------------------------------------


@pytest.mark.parametrize("sessions", ["shared", "local"])
async def test_a_governed_call_through_sentinel_over_tls_is_charged_on_the_primary(tls, tls_sentinels, tmp_path,
                                                                                  sessions, asyncio_steps):
    answer = await governed_call(tmp_path, tls_sentinels.url(f"prefix=sentinel-{sessions}:&sessions={sessions}&"
                                                              f"{tls.query()}"))
    assert answer.status_code == 200, answer.text
    assert bool(asyncio_steps) == (sessions == "local")  # the asyncio Sentinel client over TLS too
    with tls_sentinels.primary.client() as client:
        assert day_tokens(client, f"sentinel-{sessions}:") == CALL


async def test_sentinel_over_tls_with_a_certificate_of_another_ca_is_refused_at_start(tls, tls_sentinels, tmp_path):
    client = f"ssl_certfile={tls.client_cert}&ssl_keyfile={tls.client_key}"
    message = await refused_at_start(tmp_path, tls_sentinels.url(f"timeout=1&ssl_ca_certs={tls.other_ca}&{client}"))
    assert "No master found" in message and "CERTIFICATE_VERIFY_FAILED" in message, message
    assert "pin its CA with ssl_ca_certs" in message


def test_a_store_location_is_redacted_for_messages():
    from governor.store import redacted

    assert redacted("rediss://user:s3cret@h:1/0?ssl_ca_certs=/ca.pem") == "rediss://***@h:1/0?ssl_ca_certs=/ca.pem"
    assert redacted("rediss+cluster://:s3cret@h:1,h:2") == "rediss+cluster://***@h:1,h:2"
    for untouched in ("rediss://h:1/0", "sqlite:///data/a@b/state.db", "/data/a@b/state.db", "memory:"):
        assert redacted(untouched) == untouched
