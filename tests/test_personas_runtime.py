"""The persona-instance registry beside the real runtime (SQLite store, journal, a clock the
test moves): the header grammar, idle ends, busy instances, one spawn per new instance,
and slots a session resumed after a restart holds with no instance behind them."""

from __future__ import annotations

import asyncio

import pytest

from governor.evidence import verify_record
from governor.runtime.personas import PersonaActivity, PersonaHeaderError, parse_persona
from governor.store import SQLiteStore
from tests.test_runtime import Clock, make_runtime, pinned  # noqa: F401  (pinned is a fixture)


@pytest.mark.parametrize("value, parsed", [
    ("searcher", PersonaActivity("searcher")),
    ("  searcher  ", PersonaActivity("searcher")),
    ("searcher; instance=s-1", PersonaActivity("searcher", "s-1")),
    ("searcher;INSTANCE = a.b:c@d~e_f", PersonaActivity("searcher", "a.b:c@d~e_f")),
    ("doc reviewer", PersonaActivity("doc reviewer")),
])
def test_the_persona_header_grammar(value, parsed):
    assert parse_persona(value) == parsed


@pytest.mark.parametrize("value", [
    "", "   ", "a,b", "x" * 129, "bad\x00name", "bad\udc80name",  # an undecodable byte, as the proxy decodes it
    "s; instance", "s; instance=", "s; instance=a;b", "s; instance=a, s", "s; instance=" + "i" * 129,
    "s; instance=a/b", "s; other=1",
])
def test_malformed_persona_headers_are_refused(value):
    with pytest.raises(PersonaHeaderError):
        parse_persona(value)


@pytest.fixture
async def world(pinned, tmp_path):  # noqa: F811
    clock = Clock()
    runtime = make_runtime(pinned, tmp_path, clock)
    runtime.personas.idle_sec = 30
    yield runtime, clock
    await runtime.close()


def _causes(runtime, session):
    return [(e["cause"], e["detail"].get("instance"), e["detail"].get("reason"))
            for e in runtime.record(session)["events"]]


async def test_a_busy_instance_is_not_idle_and_ends_once_idle(world):
    runtime, clock = world
    admission = await runtime.admit("s", PersonaActivity("searcher", "a"))
    assert not admission.decision.blocks
    clock.t += 100
    await runtime.sweep()
    assert [i["instance"] for i in runtime.personas.instances("s")] == ["a"]  # a request of it is in flight
    await runtime.finish("s", admission.ticket)
    await runtime.finish("s", admission.ticket)  # a second release changes nothing
    clock.t += 29
    await runtime.sweep()
    assert runtime.personas.instances("s")[0]["requests_in_flight"] == 0
    clock.t += 1
    await runtime.sweep()
    assert runtime.personas.instances("s") == []
    assert _causes(runtime, "s") == [("on_governor_sub_agent_spawned", "a", None), ("on_governor_sub_agent_ended", "a", "idle")]
    assert runtime._sessions["s"].state.personas_live == {}


async def test_concurrent_first_requests_of_one_instance_spawn_it_once(world):
    runtime, _ = world
    admissions = await asyncio.gather(*(runtime.admit("s", PersonaActivity("summarizer", "x")) for _ in range(8)))
    assert all(not a.decision.blocks for a in admissions)
    assert runtime._sessions["s"].state.personas_live == {"summarizer": 1}  # max_parallel 1 holds
    assert [c for c, _, _ in _causes(runtime, "s")] == ["on_governor_sub_agent_spawned"]
    assert runtime.personas._spawning == {}  # nothing left behind


async def test_a_session_resumed_after_a_restart_gets_its_held_slots_back(pinned, tmp_path):  # noqa: F811
    clock = Clock()
    first = make_runtime(pinned, tmp_path, clock)
    await first.admit("s", PersonaActivity("searcher", "a"))
    await first.close(end_sessions=False)  # the governor stops; the instance registry is gone with it
    second = make_runtime(pinned, tmp_path, clock, store=SQLiteStore(tmp_path / "state.db"))
    second.personas.idle_sec = 30
    try:
        admission = await second.admit("s", PersonaActivity("searcher", "b"))  # resumes it: two slots held
        await second.finish("s", admission.ticket)
        assert second._sessions["s"].state.personas_live == {"searcher": 2}
        await second.sweep()  # the slot of `a` is adopted, to end when idle
        assert sorted(i["instance"] for i in second.personas.instances("s")) == ["b", "resumed-1"]
        clock.t += 31
        await second.sweep()
        assert second._sessions["s"].state.personas_live == {}
        record = await second.end_session("s")
    finally:
        await second.close()
    assert verify_record(record, public_key=second.key.public_key()).ok
    ends = sorted((e["detail"]["instance"], e["detail"]["reason"]) for e in record["events"]
                  if e["cause"] == "on_governor_sub_agent_ended")
    assert ends == [("b", "idle"), ("resumed-1", "idle")]


async def test_an_instance_ended_while_its_request_runs_is_not_revived_by_its_release(world):
    runtime, _ = world
    admission = await runtime.admit("s", PersonaActivity("searcher"))
    ended = await runtime.personas.end("s", "searcher", None, "ended_by_control")
    assert ended["reason"] == "ended_by_control" and ended["requests_in_flight"] == 1
    await runtime.finish("s", admission.ticket)
    assert runtime.personas.instances("s") == []
    with pytest.raises(KeyError):
        await runtime.personas.end("s", "searcher", None, "ended_by_control")


async def test_invented_instance_ids_cannot_grow_a_session_without_bound(world):
    runtime, _ = world
    runtime.personas.max_per_session = 3
    for n in range(3):  # the example's `searcher` has max_parallel 2, declared `continue` on denial
        assert not (await runtime.admit("s", PersonaActivity("searcher", f"i{n}"))).decision.blocks
    refused = await runtime.admit("s", PersonaActivity("searcher", "i3"))
    assert refused.decision.blocks and refused.ticket is None
    assert "3 live persona instances" in refused.governor_object["reason"]
    assert len(runtime.personas.instances("s")) == 3
    assert not (await runtime.admit("t", PersonaActivity("searcher", "i3"))).decision.blocks  # per session
