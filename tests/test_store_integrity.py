"""An emptied Redis does not reset budgets (issue #20, finding 7), end to end: a governor on
a real redis-server, a session at 9,995 of its 10,000 tokens, FLUSHALL; the next requests
are refused (503, on_governor_error, recorded) instead of answered against a counter reset
to zero, until an operator acknowledges the loss on the control plane; then traffic flows
again (new sessions; the session halted by the loss stays halted)."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from governor.policy.steps import CounterCharge
from governor.proxy.server import Settings, serve
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer
from tests.stream_budget_harness import write_passport
from tests.upstreams import Behaviour, MockLLM
from tests.proxy_harness import AGENT_NAMED

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

TOKEN = "control-token-for-store-integrity-0123456789"


@pytest.fixture
async def world(tmp_path):
    server = RedisServer()
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=30, output_tokens=20)
    running = await serve(Settings(**AGENT_NAMED, passport=write_passport(tmp_path / "passport.json"), listen=("127.0.0.1", 0),
                                   control=("127.0.0.1", 0), control_token=TOKEN, data_dir=tmp_path / "data",
                                   store=server.url, tick_interval=0))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30)
    try:
        yield running, mock, server, agent, control
    finally:
        await agent.aclose()
        await control.aclose()
        await running.stop()
        await mock.stop()
        server.stop()


async def chat(world, session: str) -> httpx.Response:
    _, mock, _, agent, _ = world
    return await agent.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": session},
                            json={"model": "gpt-4o-mini", "max_tokens": 20,
                                  "messages": [{"role": "user", "content": "hello"}]})


async def tokens_used(running, session: str) -> float:
    view = await running.runtime.session_view(session)
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == "tokens" and b["scope"] == "per_session" and b["persona"] is None)


async def test_an_emptied_redis_refuses_every_step_until_an_operator_acknowledges(world, monkeypatch):
    running, mock, server, agent, control = world
    runtime = running.runtime
    assert (await chat(world, "spender")).status_code == 200  # the session is live
    await integrity_errors_that_are_no_loss(running, control, monkeypatch)
    runtime.store.add(runtime.agent_id, "spender", [CounterCharge("per_session", "tokens", 9_995 - 50, None)],
                      time.time())
    assert await tokens_used(running, "spender") == 9_995
    served = len(mock.requests)

    redis.Redis.from_url(server.url).flushall()  # the data is gone; the governors run on

    for session in ("spender", "newcomer"):  # not answered against counters reset to zero
        refused = await chat(world, session)
        assert refused.status_code == 503, refused.text
        governor = refused.json()["error"]["governor"]
        assert governor["cause"] == "on_governor_error"
    assert len(mock.requests) == served
    answer = await control.get("/v1/sessions/spender/record", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["Governor-Record"] == "local"  # the shared chain is gone: this replica's own copy
    record = answer.json()
    errors = [e for e in record["events"] if e["cause"] == "on_governor_error"]
    assert errors and "lost" in str(errors[0])  # recorded, with why
    proof = await control.get("/v1/sessions/spender/record", params={"proof": "1"},
                              headers={"Authorization": f"Bearer {TOKEN}"})
    assert proof.status_code == 409 and proof.json()["error"]["code"] == "record_not_final", proof.text
    ready = await control.get("/readyz")
    assert ready.status_code == 503 and "lost" in ready.text

    # only the control token acknowledges, with a JSON body
    assert (await control.post("/v1/store/acknowledge", json={})).status_code == 401
    assert (await control.post("/v1/store/acknowledge", headers={"Authorization": "Bearer nope"},
                               json={})).status_code == 401
    assert (await control.post("/v1/store/acknowledge", headers={"Authorization": f"Bearer {TOKEN}"},
                               content=b"ack")).status_code == 415  # the control plane's guard: JSON only
    assert (await chat(world, "third")).status_code == 503  # still refusing
    acked = await control.post("/v1/store/acknowledge", headers={"Authorization": f"Bearer {TOKEN}"},
                               json={"reason": "redis failed over to an empty replica"})
    assert acked.status_code == 200, acked.text
    assert acked.json()["acknowledged"] is True and "lost" in acked.json()["lost"]

    answered = await chat(world, "after")
    assert answered.status_code == 200, answered.text
    assert await tokens_used(running, "after") == 50  # counted from what Redis holds now
    assert (await chat(world, "spender")).status_code != 200  # halted by the loss, it stays halted
    assert (await control.get("/readyz")).status_code == 200
    again = await control.post("/v1/store/acknowledge", headers={"Authorization": f"Bearer {TOKEN}"}, json={})
    assert again.json()["acknowledged"] is False  # nothing was lost since


async def integrity_errors_that_are_no_loss(running, control, monkeypatch) -> None:
    """The record's fallback to this replica's own copy (`local`) is for a store that lost its
    data only: a forged budget counter met by the record's reads is answered as what it is (500
    store_damaged, naming the key), and an integrity error while the store names no loss (one
    acknowledged elsewhere meanwhile) as retryable; neither is served as `local`."""
    from governor.store import CounterDamaged, StoreIntegrityError

    store = running.runtime.store
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for raised, status, code in ((CounterDamaged("governor:c:forged[tokens]", "lots"), 500, "store_damaged"),
                                 (StoreIntegrityError("the loss was acknowledged on another replica"), 503,
                                  "store_unavailable")):
        def failing(session, raised=raised):
            raise raised

        assert store.integrity is None
        monkeypatch.setattr(store, "load_session", failing)  # what the record's read of the state meets
        answer = await control.get("/v1/sessions/spender/record", headers=auth)
        monkeypatch.undo()
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["code"] == code and "Governor-Record" not in answer.headers, answer.text
        if code == "store_damaged":
            assert "governor:c:forged[tokens]" in answer.json()["error"]["message"]
        else:
            assert answer.headers["Retry-After"]
    assert (await control.get("/v1/sessions/spender/record", headers=auth)).headers["Governor-Record"] == "interim"


async def test_without_a_control_token_nobody_can_acknowledge(tmp_path):
    from governor.control import ControlContext, create_app, start_control

    class Runtime:
        async def acknowledge_store(self):  # pragma: no cover - must not be reached
            raise AssertionError("acknowledged without a control token")

    runner = await start_control(create_app(ControlContext.build(Runtime(), reviewer_tokens=["reviewer-token-abcdefghijklmnop"])),
                                 "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", trust_env=False) as control:
            answer = await control.post("/v1/store/acknowledge", json={},
                                        headers={"Authorization": "Bearer reviewer-token-abcdefghijklmnop"})
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "acknowledgement_disabled"
    finally:
        await runner.cleanup()


# --- a budget counter forged in Redis (#30, #32): refused, recorded, never read as zero ------

BUDGETS = {"tokens": {"per_session": 10_000, "per_day": 100_000}, "cost_usd": {"per_session": 10, "per_day": 100}}


@pytest.mark.parametrize("query,session_forged,day_forged", [
    ("", ("tokens", "-1000000"), ("cost_usd", "lots")),  # shared sessions: the shared one-round-trip path first
    ("?sessions=local", ("cost_usd", "nan"), ("tokens", "inf")),  # the asyncio one-round-trip path first
])
async def test_a_forged_budget_counter_refuses_the_steps_that_read_it_until_an_operator_deletes_it(
        tmp_path, query, session_forged, day_forged):
    """Through the real proxy on a real redis-server: a session's per_session counter and then
    the agent's per_day counter forged in Redis (on main: a negative or text counter was read
    as credit or zero and the call answered). Each step that reads it is refused (503, not
    retryable, on_governor_error, fail closed) and recorded naming the key, the upstream is not
    called, the key is left as found; other sessions go on while only a session's counter is
    damaged, and deleting the key mends it: the sessions it refused go on too (not halted, no
    acknowledgement; until session 21 the damage halted them)."""
    from governor.passport import sign_passport
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    import json

    from tests.stream_budget_harness import PASSPORT

    passport = {**PASSPORT, "permissions": {"resource_limits": {"budget": BUDGETS}}}
    (tmp_path / "passport.json").write_text(json.dumps(sign_passport(passport, Ed25519PrivateKey.generate())))
    server = RedisServer()
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=30, output_tokens=20)
    running = await serve(Settings(**AGENT_NAMED, passport=tmp_path / "passport.json", listen=("127.0.0.1", 0),
                                   control=("127.0.0.1", 0), control_token=TOKEN, data_dir=tmp_path / "data",
                                   store=server.url + query, tick_interval=0))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30)
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    world = (running, mock, server, agent, control)
    try:
        for session in ("victim", "bystander"):
            assert (await chat(world, session)).status_code == 200
        store = running.runtime.store
        assert (store.shared_sessions() is None) == bool(query)
        dimension, forged = session_forged
        victim = f"{store.prefix}sc:{store.session_key('victim')}"  # a local session's keys: a space of their own
        raw.hset(victim, f"{dimension}|", forged)
        served = len(mock.requests)

        refused = await chat(world, "victim")
        assert refused.status_code == 503, refused.text
        assert "Retry-After" not in refused.headers  # waiting does not mend it
        governor = refused.json()["error"]["governor"]
        assert governor["cause"] == "on_governor_error" and governor["fail_closed"] is True
        assert len(mock.requests) == served  # the upstream was not called
        assert raw.hget(victim, f"{dimension}|") == forged  # left as found
        assert (await chat(world, "bystander")).status_code == 200  # one session's counter: others go on
        record = (await control.get("/v1/sessions/victim/record", headers={"Authorization": f"Bearer {TOKEN}"})).json()
        errors = [e for e in record["events"] if e["cause"] == "on_governor_error"]
        named = victim.replace("\x1f", "\\x1f")  # named as redis-cli reads it between double quotes
        assert errors and "CounterDamaged" in str(errors[-1]) and f"{named}[{dimension}|]" in errors[-1]["detail"]["error"]
        assert errors[-1]["action"] == "fallback" and errors[-1]["detail"]["retryable"] is False, errors[-1]
        assert errors[-1]["detail"]["counter"] == f"{named}[{dimension}|]", errors[-1]
        raw.hset(victim, f"{dimension}|", "0")  # the operator corrects it
        assert (await chat(world, "victim")).status_code == 200  # the same session goes on

        dimension, forged = day_forged
        agent_id = running.runtime.agent_id
        day_key = f"{store.prefix}d:{len(agent_id.encode())}:{agent_id}:{dimension}|"
        assert raw.exists(day_key)
        raw.hset(day_key, "t", forged)
        served = len(mock.requests)
        for session in ("bystander", "newcomer"):  # the agent's counter: every session reads it
            refused = await chat(world, session)
            assert refused.status_code == 503 and refused.json()["error"]["governor"]["cause"] == "on_governor_error"
        assert len(mock.requests) == served and raw.hget(day_key, "t") == forged
        record = (await control.get("/v1/sessions/newcomer/record", headers={"Authorization": f"Bearer {TOKEN}"})).json()
        assert any(f"{dimension}|[t]" in str(e) for e in record["events"] if e["cause"] == "on_governor_error")

        raw.delete(day_key)  # the operator deletes the damaged counter: the agent's steps go on
        answered = await chat(world, "later")
        assert answered.status_code == 200, answered.text
        assert (await chat(world, "bystander")).status_code == 200  # refused by the damage, not halted: it goes on
        assert (await chat(world, "newcomer")).status_code == 200
        assert (await control.get("/readyz")).status_code == 200  # one key's damage: the store stays ready
    finally:
        raw.close()
        await agent.aclose()
        await control.aclose()
        await running.stop()
        await mock.stop()
        server.stop()
