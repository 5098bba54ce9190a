"""The tools withheld from an exchange, in the session's record (docs/tools.md).

The adapters withhold offered tools the step may not use (governor/adapters/withhold.py)
and leave the names in `exchange.state["withheld"]`; only then, and only when a name was
withheld, the proxy logs it and records it in the exchange's session before anything goes
on: before the request is forwarded (OpenAI, Anthropic) or the tools/list answer is
delivered (MCP). Cause `on_governor_tools_withheld`, action `fallback`, detail:

    {"decision": "withhold", "step": "model_call" | "tools_list", "protocol", "route",
     "count", "tools": [first 32 names, each cut to 128 characters],
     "tools_omitted"?, "names_cut"?, "persona"?}

An exchange that withholds nothing pays the one `in` test the caller makes. The event
cannot be recorded (journal unwritable, the session ended meanwhile): `WithheldNotRecorded`
is raised and the hook fails closed (the request is not forwarded, the answer is replaced).
"""

from __future__ import annotations

import logging
from typing import Any

from governor.adapters import withhold

log = logging.getLogger("governor.proxy")

_ROUTE = 300  # characters of the (agent-controlled) path kept in the detail


class WithheldNotRecorded(RuntimeError):
    """The withholding could not be recorded: the exchange must not go on."""


async def record(runtime: Any, flow: Any, exchange: Any, where: str) -> None:
    """Log and record what `exchange` withheld from its `where` ("request" or "answer");
    nothing when it withheld no name (a dropped tool_choice alone names none)."""
    names = exchange.state["withheld"]
    if not names:
        return
    request = flow.request
    log.info("governor: withheld %d tool(s) the step may not use from the %s of %s %s in session %s: %s",
             len(names), where, request.method, request.pretty_url, exchange.session, withhold.rendered(names))
    recorder = getattr(runtime, "record_withheld", None)
    if recorder is None:  # a runtime that keeps no record
        return
    detail: dict[str, Any] = {"decision": "withhold", "step": "model_call" if where == "request" else "tools_list",
                              "protocol": exchange.adapter.name, "route": request.path.split("?", 1)[0][:_ROUTE],
                              **withhold.recorded_detail(names)}
    if exchange.persona is not None:
        detail["persona"] = exchange.persona
    if not await recorder(exchange.session, detail):
        raise WithheldNotRecorded(f"session {exchange.session} has ended: the tools withheld from its {where} "
                                  "cannot be recorded")


__all__ = ["WithheldNotRecorded", "record"]
