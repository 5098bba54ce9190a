"""The chain's hooks, called in order without mitmproxy's walk over sub-addons.

mitmproxy calls an event on each top-level addon through `AddonManager.invoke_addon`, which
walks the addon and its `addons` (recursive generators, a `hasattr` and a `getattr` per
sub-addon) on every event, the events no sub-addon handles (`update`, after each flow
event) included. A request passes eight such events; in the process that walk, and the
error guard of one more top-level addon (the connection guard's), cost about 50 us of CPU
per request (bench/FINDINGS.md, "Where the plain call's extra cost came from").

`hook_table` resolves once which members define which hook; `dispatcher` makes the one
callable the chain exposes for a hook. It calls the members' hooks in their order, as
mitmproxy did: a hook's awaitable is awaited before the next member is called, an exception
ends the event for the members after it (mitmproxy's guard around the chain logs it), and it
stays synchronous (returns None) while no member returns an awaitable. An `isolated` member
(the connection guard, which was a top-level addon of its own) keeps its own guard: its
exception is logged, as mitmproxy's guard logged it, and the members after it still run.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Sequence

from mitmproxy import hooks

log = logging.getLogger("governor.proxy")

Hook = Callable[..., Any]


def hook_table(members: Sequence[Any], isolated: Sequence[Any] = ()) -> dict[str, list[tuple[Hook, bool]]]:
    """For each mitmproxy event some member handles: its members' hooks in order, each with
    whether it is isolated (`isolated` members come first, in their order)."""
    table: dict[str, list[tuple[Hook, bool]]] = {}
    for member in isolated:
        for name in hooks.all_hooks:
            if inspect.iscoroutinefunction(getattr(member, name, None)):
                raise TypeError(f"an isolated member's hooks must be synchronous: {type(member).__name__}.{name}")
    ordered = [(member, True) for member in isolated] + [(member, False) for member in members]
    for name in hooks.all_hooks:
        found = [(hook, alone) for member, alone in ordered
                 if callable(hook := getattr(member, name, None))]
        if found:
            table[name] = found
    return table


def dispatcher(name: str, found: Sequence[tuple[Hook, bool]]) -> Hook:
    """One callable for event `name` that calls `found` in order (see the module's doc)."""
    calls = tuple(found)
    if len(calls) == 1 and not calls[0][1]:
        return calls[0][0]  # one member handles it: its own hook, nothing between

    def dispatch(*args: Any) -> Any:
        for index, (hook, alone) in enumerate(calls):
            if alone:
                _isolated(name, hook, args)
                continue
            result = hook(*args)
            if result is not None and inspect.isawaitable(result):
                return _rest(name, calls, index + 1, result, args)
        return None

    dispatch.__name__ = dispatch.__qualname__ = name
    return dispatch


async def _rest(name: str, calls: Sequence[tuple[Hook, bool]], start: int, pending: Any, args: tuple) -> None:
    """The members after one that returned an awaitable, once it is done."""
    await pending
    for hook, alone in calls[start:]:
        if alone:
            _isolated(name, hook, args)
            continue
        result = hook(*args)
        if result is not None and inspect.isawaitable(result):
            await result


def _isolated(name: str, hook: Hook, args: tuple) -> None:
    try:
        hook(*args)
    except Exception:  # as mitmproxy's guard around a top-level addon: logged, the event goes on
        log.exception("governor: addon error in %s", name)
