"""The chain's own dispatch (governor/proxy/dispatch.py), driven by mitmproxy's AddonManager:
the members' hooks are called as mitmproxy called them when they were its sub-addons (in
order, an awaitable awaited before the next member, an exception ending the event for the
members after it), the connection guard first with its own error guard, and the usual path
stays synchronous."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from mitmproxy import addonmanager, master as mitm_master, options
from mitmproxy.proxy.layers.http import HttpRequestHook, HttpResponseHook
from mitmproxy.test import tflow

from governor.proxy.chain import Chain
from governor.proxy.dispatch import dispatcher, hook_table


class Member:
    """A sub-addon that writes each call into a shared log; `fail`/`suspend` per hook name."""

    def __init__(self, name: str, log: list[str], *, fail: set[str] = frozenset(), suspend: set[str] = frozenset(),
                 returns_coroutine: set[str] = frozenset()) -> None:
        self.tag, self.log, self.fail, self.suspend, self.returns_coroutine = name, log, fail, suspend, returns_coroutine

    def _hook(self, event: str) -> Any:
        self.log.append(f"{self.tag}.{event}")
        if event in self.fail:
            raise RuntimeError(f"{self.tag} failed in {event}")
        if event in self.suspend or event in self.returns_coroutine:
            async def later() -> None:
                await asyncio.sleep(0.01 if event in self.suspend else 0)
                self.log.append(f"{self.tag}.{event} done")
            return later()
        return None

    def request(self, flow: Any) -> Any:
        return self._hook("request")

    def response(self, flow: Any) -> Any:
        return self._hook("response")


class AsyncMember(Member):
    async def request(self, flow: Any) -> None:  # an `async def` hook, as Admission.request is
        self.log.append(f"{self.tag}.request")
        await asyncio.sleep(0)
        self.log.append(f"{self.tag}.request done")


class Guard:
    def __init__(self, log: list[str], fail: bool = False) -> None:
        self.log, self.fail = log, fail

    def response(self, flow: Any) -> None:
        self.log.append("guard.response")
        if self.fail:
            raise RuntimeError("guard failed")

    def running(self) -> None:
        self.log.append("guard.running")


def chain_of(members: list[Any], guard: Any = None) -> Chain:
    return Chain(members, registry=None, holds_=None, recording_=None,  # type: ignore[arg-type]
                 unknown=type("U", (), {"unknown_seen": {}, "allowed_seen": {}})(), policy=None,  # type: ignore[arg-type]
                 guard=guard)


async def lifecycle(chain: Chain, *events: Any) -> None:
    manager = addonmanager.AddonManager(mitm_master.Master(options.Options()))
    manager.chain = [chain]
    for event in events:
        await manager.handle_lifecycle(event)


def test_members_are_called_in_order_each_awaited_before_the_next() -> None:
    log: list[str] = []
    chain = chain_of([Member("a", log), AsyncMember("b", log), Member("c", log, suspend={"request"}), Member("d", log)])
    flow = tflow.tflow(resp=True)
    asyncio.run(lifecycle(chain, HttpRequestHook(flow)))
    assert log == ["a.request", "b.request", "b.request done", "c.request", "c.request done", "d.request"]


def test_an_exception_ends_the_event_for_the_members_after_it(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    chain = chain_of([Member("a", log), Member("b", log, fail={"request"}), Member("c", log)])
    flow = tflow.tflow(resp=True)
    with caplog.at_level(logging.ERROR):
        asyncio.run(lifecycle(chain, HttpRequestHook(flow), HttpResponseHook(flow)))
    # mitmproxy's guard around the chain logged it; the next event reaches every member again
    assert log == ["a.request", "b.request", "a.response", "b.response", "c.response"]
    assert "b failed in request" in caplog.text


def test_an_exception_after_an_await_ends_the_event_too() -> None:
    log: list[str] = []

    class LateFailure(Member):
        async def request(self, flow: Any) -> None:
            log.append("x.request")
            await asyncio.sleep(0)
            raise RuntimeError("late")

    chain = chain_of([Member("a", log), LateFailure("x", log), Member("c", log)])
    asyncio.run(lifecycle(chain, HttpRequestHook(tflow.tflow())))
    assert log == ["a.request", "x.request"]


def test_the_guard_comes_first_and_its_exception_does_not_stop_the_members(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    chain = chain_of([Member("a", log)], guard=Guard(log, fail=True))
    flow = tflow.tflow(resp=True)
    with caplog.at_level(logging.ERROR):
        asyncio.run(lifecycle(chain, HttpResponseHook(flow)))
    assert log == ["guard.response", "a.response"]
    assert "guard failed" in caplog.text


def test_the_usual_path_is_synchronous_and_lone_hooks_are_the_members_own() -> None:
    log: list[str] = []
    first, second = Member("a", log), Member("b", log)
    chain = chain_of([first, second], guard=Guard(log))
    flow = tflow.tflow(resp=True)
    assert chain.request(flow) is None  # no member returned an awaitable: no coroutine made
    assert log == ["a.request", "b.request"]
    assert chain.response(flow) is None and log[-3:] == ["guard.response", "a.response", "b.response"]
    chain.running()  # the guard's alone, still within its own error guard
    assert log[-1] == "guard.running"
    lone = chain_of([first])
    assert lone.request == first.request  # one member handles it: its own hook, nothing between
    assert not hasattr(chain, "addons")  # mitmproxy must not walk the members as sub-addons
    assert not hasattr(chain, "websocket_message")  # no member handles it: mitmproxy finds nothing
    assert chain.hooks("request") == [first.request, second.request]


def test_a_coroutine_returned_by_a_plain_hook_is_awaited_before_the_next() -> None:
    log: list[str] = []
    chain = chain_of([Member("a", log, returns_coroutine={"response"}), Member("b", log)], guard=Guard(log))
    asyncio.run(lifecycle(chain, HttpResponseHook(tflow.tflow(resp=True))))
    assert log == ["guard.response", "a.response", "a.response done", "b.response"]


def test_an_isolated_member_must_be_synchronous() -> None:
    class AsyncGuard:
        async def response(self, flow: Any) -> None: ...

    with pytest.raises(TypeError, match="synchronous"):
        hook_table([], (AsyncGuard(),))


def test_every_hook_of_the_real_chain_is_dispatched() -> None:
    """The chain `governor run` builds: every mitmproxy event any member (or the guard) handles
    has exactly one callable on the chain, calling them all in order."""
    from governor.proxy.connections import ConnectionGuard
    from governor.proxy.server import Settings, build_chain

    guard = ConnectionGuard()
    chain, _ = build_chain(Settings(control=None), object(), guard=guard)
    table = hook_table(chain.members, (guard,))
    assert {"request", "response", "responseheaders", "error", "requestheaders", "client_connected", "running",
            "done", "tcp_start", "websocket_message"} <= set(table)
    for event, found in table.items():
        exposed = getattr(chain, event)
        assert callable(exposed)
        if len(found) == 1 and not found[0][1]:
            assert exposed == found[0][0]
        else:
            assert exposed.__name__ == event
    assert dispatcher("x", [(print, False)]) is print
