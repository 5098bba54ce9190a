"""The OpenAI Realtime WebSocket through the real proxy on the real runtime (the bundled
example passport: 20,000 tokens per session, on_budget_exhausted halt), driven by the
official `openai` SDK's realtime client (`client.realtime.connect`, over the `websockets`
package) configured only through its environment (HTTPS_PROXY, SSL_CERT_FILE), against a
loopback mock that speaks the Realtime event protocol (tests/realtime_upstream.py).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.proxy_harness import run_python
from tests.realtime_harness import PRELUDE, events_of, iterations, realtime_env, realtime_governor, tokens_used, \
    verified
from tests.realtime_upstream import Turn

pytestmark = pytest.mark.asyncio(loop_scope="module")

env = realtime_env("realtime-sdk")


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def test_a_response_is_admitted_and_charged_from_response_done(env):
    running, mock, sdk_env = env
    mock.script(Turn(text="It is sunny in Oslo.", deltas=4, input_tokens=120, output_tokens=30, audio_in=80,
                     audio_out=10, cached=20))
    code = PRELUDE + """
async def steps(conn):
    await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
    await conn.conversation.item.create(item={"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "weather in Oslo?"}]})
    await conn.response.create(response={"max_output_tokens": 200})
    done = await until(conn, ("response.done",))
    out["usage"] = done.response.usage.total_tokens
    out["text"] = "".join(e["delta"] for e in out["events"] if e["type"] == "response.output_text.delta")
asyncio.run(talk("rt-happy", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert "raised" not in out, out
    assert out["usage"] == 150 and out["text"] == "It is sunny in Oslo."
    assert await tokens_used(running, "rt-happy") == 150
    assert await iterations(running, "rt-happy") == 2  # the upgrade and the response
    # the ADL-Session header did not reach the provider; the response.create got an event_id
    assert all(not k.lower().startswith("adl-") for k in mock.upgrades[0])
    created = [e for e in mock.events if e["type"] == "response.create"]
    assert len(created) == 1 and created[0]["event_id"].startswith("event_governor_")
    record = await running.runtime.end_session("rt-happy")
    assert verified(running, record)


async def test_at_the_cap_the_socket_is_cut_with_an_error_event_and_a_halted_session_cannot_reopen(env):
    running, mock, sdk_env = env
    # the provider's usage says 30,000 tokens: past the session's 20,000
    mock.script(Turn(input_tokens=100, output_tokens=30_000))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 300})
    await until(conn, ("response.done", "error"))
    await until(conn, ("response.done",))  # the close frame ends it
asyncio.run(talk("rt-cap", steps))
out["first"], out["events"] = out.pop("raised", None), []
async def again(conn):
    await conn.response.create(response={"max_output_tokens": 300})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-cap", again))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    # the SDK surfaced the governor's error event, then the close (1008: policy violation)
    first = out["first"]
    assert first["type"] == "ConnectionClosedError" and first["code"] == 1008, out
    assert "on_budget_exhausted" in first["reason"]
    # the halted session: the upgrade itself is refused, readable
    refused = out["raised"]
    assert refused["type"] == "InvalidStatus" and refused["status"] == 429, refused
    assert refused["body"]["error"]["governor"]["cause"] == "on_budget_exhausted"
    assert (await running.runtime.session_view("rt-cap"))["state"] == "halted"
    assert len(mock.upgrades) == 1 and mock.closes  # the upstream's socket was closed too
    record = await running.runtime.end_session("rt-cap")
    assert verified(running, record)


async def test_the_error_event_reaches_the_sdk_before_the_close(env):
    running, mock, sdk_env = env
    mock.script(Turn(input_tokens=100, output_tokens=30_000))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 300})
    while True:
        event = await conn.recv()
        out["events"].append(plain(event))
        if event.type == "error":
            out["error"] = {"message": event.error.message, "code": event.error.code,
                            "governor": event.error.to_dict().get("governor")}
asyncio.run(talk("rt-error-event", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    error = out["error"]
    assert error["code"] == "on_budget_exhausted" and error["governor"]["cause"] == "on_budget_exhausted"
    assert "Budget exhausted" in error["message"]
    assert [e["type"] for e in out["events"]][-1] == "error"  # nothing after it
    assert "response.done" not in [e["type"] for e in out["events"]]  # the over-cap answer is not delivered


async def test_a_response_crossing_the_cap_mid_way_is_cut_and_the_upstream_stops(env):
    running, mock, sdk_env = env
    # 60 deltas of 2,000 characters: past 20,000 tokens (at 4 bytes a token) after about 40
    mock.script(Turn(text="w" * 120_000, deltas=60, delay=0.02, output_tokens=30_000))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 1000})
    await until(conn, ("response.done", "error"))
    await until(conn, ("response.done",))
asyncio.run(talk("rt-mid", steps))
print(json.dumps({"raised": out.get("raised"), "deltas": sum(1 for e in out["events"] if e["type"] == "response.output_text.delta"),
                  "last": out["events"][-1]["type"]}))
"""
    out = await run_python(code, sdk_env)
    assert out["raised"]["code"] == 1008 and out["last"] == "error", out
    log = mock.responses[0]
    await asyncio.wait_for(log.finished.wait(), 5)
    assert log.cut and not log.done and log.sent_deltas < 60
    assert out["deltas"] < 45


async def test_a_halted_session_cannot_continue_an_open_socket(env):
    running, mock, sdk_env = env
    mock.script(Turn(output_tokens=10), Turn(input_tokens=100, output_tokens=30_000))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 100})
    await until(conn, ("response.done",))
    # meanwhile another socket of the session crosses the cap
    async with client.realtime.connect(model="gpt-realtime", extra_headers={"ADL-Session": "rt-open"}) as other:
        await other.response.create(response={"max_output_tokens": 100})
        try:
            await until(other, ("response.done",))
        except Exception as e:
            out["other"] = type(e).__name__
    await conn.conversation.item.create(item={"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "more"}]})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-open", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["other"] == "ConnectionClosedError"
    assert out["raised"]["code"] == 1008 and "halt" in out["raised"]["reason"], out
    assert out["events"][-1]["type"] == "error"
    # the item the halted session sent never reached the provider
    assert [e["type"] for e in mock.events].count("conversation.item.create") == 0


async def test_a_response_the_server_starts_itself_and_the_input_transcription_are_admitted_and_charged(env):
    running, mock, sdk_env = env
    mock.script(Turn(input_tokens=300, output_tokens=50, audio_in=250, audio_out=40,
                     transcription=("what is the weather", 25, 6)))
    code = PRELUDE + """
async def steps(conn):
    await conn.session.update(session={"type": "realtime", "max_output_tokens": 500,
        "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}})
    await conn.input_audio_buffer.append(audio="AAAA")
    await conn.input_audio_buffer.commit()  # server VAD: the server answers on its own
    done = await until(conn, ("response.done",))
    out["usage"] = done.response.usage.total_tokens
asyncio.run(talk("rt-vad", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["usage"] == 350, out
    assert await tokens_used(running, "rt-vad") == 350 + 31  # the response, and its input's transcription
    assert await iterations(running, "rt-vad") == 3  # the upgrade, the transcription, the response
    assert [e["type"] for e in mock.events].count("response.create") == 0


async def test_tools_the_passport_denies_are_withheld_from_session_update_and_response_create(env):
    running, mock, sdk_env = env
    tools = [{"type": "function", "name": "search_papers", "parameters": {"type": "object"}},
             {"type": "function", "name": "run_shell", "parameters": {"type": "object"}}]
    code = PRELUDE + f"""
async def steps(conn):
    await conn.session.update(session={{"type": "realtime", "tools": {tools!r}, "tool_choice": "auto"}})
    updated = await until(conn, ("session.updated",))
    out["session_tools"] = [t["name"] for t in updated.session.to_dict().get("tools", [])]
    await conn.response.create(response={{"max_output_tokens": 100, "tools": {tools!r},
                                          "tool_choice": {{"type": "function", "name": "run_shell"}}}})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-withhold", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert "raised" not in out, out
    assert out["session_tools"] == ["search_papers"]
    update, create = [e for e in mock.events if e["type"] in ("session.update", "response.create")]
    assert [t["name"] for t in update["session"]["tools"]] == ["search_papers"]
    assert [t["name"] for t in create["response"]["tools"]] == ["search_papers"]
    assert "tool_choice" not in create["response"]  # it named the withheld tool
    record = await running.runtime.end_session("rt-withhold")
    withheld = events_of(record, "on_governor_tools_withheld")
    assert len(withheld) == 2 and all(e["detail"]["tools"] == ["run_shell"] for e in withheld)
    assert verified(running, record)


async def test_a_tool_call_is_a_step_and_a_denied_one_is_not_delivered(env):
    running, mock, sdk_env = env
    mock.script(Turn(tool=("search_papers", {"query": "agents"})), Turn(tool=("run_shell", {"cmd": "rm -rf /"})))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 100})
    done = await until(conn, ("response.done",))
    out["first"] = [o["name"] for o in done.response.to_dict()["output"] if o["type"] == "function_call"]
    out["events"] = []
    await conn.response.create(response={"max_output_tokens": 100})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-tools", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["first"] == ["search_papers"]
    kinds = [e["type"] for e in out["events"]]
    # the undeclared tool: its completed call never reached the client; the socket was cut
    assert "response.function_call_arguments.done" not in kinds and "response.done" not in kinds
    assert kinds[-1] == "error" and out["events"][-1]["error"]["code"] == "on_governor_tool_denied", out
    assert out["raised"]["code"] == 1008
    record = await running.runtime.end_session("rt-tools")
    assert events_of(record, "on_governor_tool_denied") and verified(running, record)


async def test_the_beta_realtime_client_is_governed_alike(env):
    running, mock, sdk_env = env
    mock.script(Turn(text="Hi there.", input_tokens=20, output_tokens=5))
    code = PRELUDE + """
async def main():
    async with client.beta.realtime.connect(model="gpt-realtime", extra_headers={"ADL-Session": "rt-beta"}) as conn:
        await conn.response.create(response={"max_response_output_tokens": 50})
        done = await until(conn, ("response.done",))
        out["usage"] = done.response.usage.total_tokens
asyncio.run(main())
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["usage"] == 25
    assert await tokens_used(running, "rt-beta") == 25
    assert mock.upgrades[0].get("OpenAI-Beta") == "realtime=v1"


async def test_an_open_socket_is_charged_wall_clock_and_cut_at_its_cap(tmp_path):
    from tests.restartable_governor import write_passport

    def one_second(document):
        document["permissions"]["resource_limits"]["budget"]["wall_clock_sec"]["per_session"] = 1

    passport = write_passport(tmp_path / "passport.json", mutate=one_second)
    async with realtime_governor(tmp_path, passport=passport, tick_interval=0.25) as (running, mock, sdk_env):
        code = PRELUDE + """
async def steps(conn):
    await until(conn, ("never",))  # an idle socket: the user has not spoken yet
asyncio.run(talk("rt-clock", steps))
print(json.dumps(out))
"""
        out = await run_python(code, sdk_env)
        assert out["raised"]["code"] == 1008, out
        error = out["events"][-1]["error"]
        assert error["governor"]["dimension"] == "wall_clock_sec" and error["code"] == "on_budget_exhausted"
        assert mock.closes  # the upstream's socket was closed too
