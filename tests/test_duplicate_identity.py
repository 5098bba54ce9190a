"""Duplicate-identity detection (issue #32 item 7): two live governors on one shared store with
one identifier or one signing key are found and reported (an error logged once, the gauge
`governor_duplicate_identities`, `/readyz`'s `duplicate_identity`); governors with their own id
and key are not; an instance that stopped is forgotten when its entry expires; garbage in the
store's registry is ignored. Over a real redis-server, and two real governors end to end."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis as redis_client
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.runtime.duplicates import DuplicateWatch, watch_duplicates
from governor.runtime.metrics import Metrics
from governor.store import MemoryStore


@pytest.fixture
def redis_url():
    from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    server = RedisServer()
    yield server.url
    server.stop()


def watch(url: str, governor_id: str, key, interval: float = 10.0, log_origin: str | None = None) -> DuplicateWatch:
    from governor.store.redis import RedisStore

    found = watch_duplicates(RedisStore(url), governor_id=governor_id, public_key=key.public_key(),
                             metrics=Metrics(), interval=interval, log_origin=log_origin)
    assert found is not None
    return found


def test_one_id_or_one_key_is_found_on_both_sides_and_distinct_ones_are_not(redis_url, caplog):
    key_a, key_b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    first = watch(redis_url, "did:web:example.com:governor", key_a)
    assert first.check() == []
    same_id = watch(redis_url, "did:web:example.com:governor", key_b)
    same_key = watch(redis_url, "did:web:other.example:governor", key_a)
    stranger = watch(redis_url, "did:web:third.example:governor", Ed25519PrivateKey.generate())
    assert stranger.check() == []
    found = {d["instance"]: d["shares"] for d in same_id.check()}
    assert found == {first.instance: ["governor_id"]}
    found = {d["instance"]: d["shares"] for d in first.check()}
    assert found == {same_id.instance: ["governor_id"]}  # same_key has not announced yet
    assert {d["instance"]: d["shares"] for d in same_key.check()} == {first.instance: ["key"]}
    assert {d["instance"]: d["shares"] for d in first.check()} == {same_id.instance: ["governor_id"],
                                                                     same_key.instance: ["key"]}
    assert stranger.check() == []
    assert first.metrics.duplicate_identities._value.get() == 2
    ready: dict = {}
    first.mark(ready)
    assert len(ready["duplicate_identity"]) == 2
    errors = [r for r in caplog.records if "shares this governor's" in r.getMessage()]
    assert errors and all(r.levelname == "ERROR" for r in errors)
    before = len(errors)
    first.check()  # reported once per instance, not every check
    assert len([r for r in caplog.records if "shares this governor's" in r.getMessage()]) == before


def test_processes_of_one_governor_are_not_duplicates_unless_their_logs_share_an_origin(redis_url, caplog):
    """A gateway's replicas and `governor run --workers N`'s workers are one governor (one id and
    key; docs/reference/shared-sessions.md), whatever the store's session mode, as long as each
    keeps its log under an origin of its own (the chart's pod name, the worker's "/worker-K") or
    none: two logs under one origin and key fork each other's checkpoints, and that is reported,
    as is any instance sharing only the id, only the key, or only the origin."""
    key = Ed25519PrivateKey.generate()
    replica_a = watch(redis_url, "did:web:gateway.example", key, log_origin="gateway.example/log/pod-a")
    replica_b = watch(redis_url, "did:web:gateway.example", key, log_origin="gateway.example/log/pod-b")
    local = watch(redis_url + "?sessions=local", "did:web:gateway.example", key, log_origin="gateway.example/log/w-1")
    unlogged = watch(redis_url + "?sessions=local", "did:web:gateway.example", key)  # --log off
    assert [w.check() for w in (replica_a, replica_b, local, unlogged, replica_a)] == [[]] * 5
    forked = watch(redis_url + "?sessions=local", "did:web:gateway.example", key,
                   log_origin="gateway.example/log/pod-a")
    assert {d["instance"]: d["shares"] for d in forked.check()} == {
        replica_a.instance: ["governor_id", "key", "log_origin"]}
    assert {d["instance"] for d in replica_a.check()} == {forked.instance}
    assert any("fork each other's checkpoints; give each process its own --log-origin" in r.getMessage()
               for r in caplog.records)
    impostor = watch(redis_url, "did:web:gateway.example", Ed25519PrivateKey.generate())
    assert {d["instance"]: d["shares"] for d in impostor.check()} == {
        w.instance: ["governor_id"] for w in (replica_a, replica_b, local, unlogged, forked)}
    squatter = watch(redis_url, "did:web:other.example", Ed25519PrivateKey.generate(),
                     log_origin="gateway.example/log/pod-b")
    assert {d["instance"]: d["shares"] for d in squatter.check()} == {replica_b.instance: ["log_origin"]}
    told = [r.getMessage() for r in caplog.records if "shares this governor's log_origin (" in r.getMessage()]
    assert told and all(m.endswith("under one origin; give each its own --log-origin") for m in told), told


def test_a_governor_of_the_same_agent_in_the_other_session_mode_is_warned_of_once_and_not_counted(redis_url, caplog):
    """The two session modes keep their sessions apart (tests/test_session_modes.py): another
    live governor of this agent in the other mode is no duplicate, but a session name both use
    is two sessions, which the operator is told once per instance; another agent, the same
    mode, or a hostile entry without the members says nothing."""
    from governor.store.redis import RedisStore

    def governor(query: str, agent) -> DuplicateWatch:
        found = watch_duplicates(RedisStore(redis_url + query), governor_id=f"did:web:{agent}.example:{query.strip('?')}",
                                 public_key=Ed25519PrivateKey.generate().public_key(), agent=agent, metrics=Metrics())
        assert found is not None
        return found

    shared = governor("", "agent-a")
    same_mode, other_agent = governor("?prefix=governor:", "agent-a"), governor("?sessions=local", "agent-b")
    client = redis_client.Redis.from_url(redis_url)
    client.set(f"{shared.store.prefix}gi:odd", b'{"instance": ["x"], "agent": "agent-a", "sessions": {"a": 1}}')
    client.sadd(f"{shared.store.prefix}gis", "odd")
    for w in (same_mode, other_agent):
        w.check()
    assert shared.check() == [] and not [r for r in caplog.records if "keeps its sessions" in r.getMessage()]
    local = governor("?sessions=local", "agent-a")
    assert local.check() == [] and shared.check() == []
    assert shared.metrics.duplicate_identities._value.get() == 0
    warned = [r.getMessage() for r in caplog.records if "keeps its sessions" in r.getMessage()]
    # local of the two shared governors of agent-a, shared of local
    assert len(warned) == 3 and {r.levelname for r in caplog.records if "keeps its sessions" in r.getMessage()} == {
        "WARNING"}
    assert any(f"keeps its sessions shared (did:web:agent-a.example:, instance {shared.instance}" in w for w in warned)
    assert any(f"keeps its sessions local (did:web:agent-a.example:sessions=local, instance {local.instance}" in w
               for w in warned)
    shared.check()
    local.check()  # once per instance
    assert len([r for r in caplog.records if "keeps its sessions" in r.getMessage()]) == 3


def test_a_stopped_instance_is_forgotten_and_garbage_is_ignored(redis_url):
    key = Ed25519PrivateKey.generate()
    first = watch(redis_url, "did:web:example.com:governor", key, interval=0.1)
    gone = watch(redis_url, "did:web:example.com:governor", Ed25519PrivateKey.generate(), interval=0.1)
    gone.check()
    assert len(first.check()) == 1
    client = redis_client.Redis.from_url(redis_url)
    prefix = first.store.prefix
    client.set(f"{prefix}gi:hostile", b"\xff not json")
    client.sadd(f"{prefix}gis", "hostile")
    client.set(f"{prefix}gi:list", b"[1, 2]")
    client.sadd(f"{prefix}gis", "list")
    time.sleep(0.5)  # three intervals: `gone` stopped announcing
    assert first.check() == []
    assert first.metrics.duplicate_identities._value.get() == 0


def test_a_store_only_this_process_uses_has_no_watch():
    assert watch_duplicates(MemoryStore(), governor_id="x", public_key=Ed25519PrivateKey.generate().public_key()) is None


async def test_two_governors_with_one_id_on_one_redis_report_each_other(redis_url, tmp_path):
    from governor.proxy.server import Settings, serve

    started = []
    try:
        for name in ("a", "b"):  # their own data dirs: their own keys, one (default) id
            started.append(await serve(Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0),
                                                data_dir=tmp_path / name, store=redis_url, tick_interval=0.1,
                                                control_token="control-token-duplicates-0123456789")))
        async with httpx.AsyncClient(base_url=started[1].control_url, trust_env=False, timeout=10) as control:
            for _ in range(100):
                ready = (await control.get("/readyz")).json()
                if "duplicate_identity" in ready:
                    break
                await asyncio.sleep(0.1)
            [duplicate] = ready["duplicate_identity"]
            # one default id, and so one default origin of their logs (under two keys)
            assert duplicate["shares"] == ["governor_id", "log_origin"]
            assert duplicate["governor_id"] == started[0].runtime.governor_id
            metrics = (await control.get("/metrics", headers={
                "Authorization": "Bearer control-token-duplicates-0123456789"})).text
            assert "governor_duplicate_identities 1.0" in metrics
    finally:
        for running in started:
            await running.stop()


async def test_an_error_the_governor_logs_while_mitmproxy_starts_does_not_stop_the_proxy():
    """A duplicate found by the first sweep is logged as an error, possibly while mitmproxy
    is still starting: only mitmproxy's own errors (a port in use) mean it did not come up."""
    import logging

    from governor.proxy.mitm_master import ProxyStartFailed, StartupErrorCheck

    check = StartupErrorCheck()
    try:
        logging.getLogger("governor.runtime").error("another live governor on this store shares this governor's key")
        await check.shutdown_if_errored()  # no exception: the governor's own report
        logging.getLogger("mitmproxy.proxy.server").error("HTTP(S) proxy failed to listen on 127.0.0.1:1")
        with pytest.raises(ProxyStartFailed, match="failed to listen") as failed:
            await check.shutdown_if_errored()
        assert "shares" not in str(failed.value)
    finally:
        check.finish()
