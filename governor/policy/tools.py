"""The tools a step may use: what a model call may be offered (Core §8.1, Runtime §4.1).

Pure: a function of the compiled limits and the step's persona. The proxy's adapters
withhold every offered tool outside this set before the model sees it
(governor/adapters/withhold.py); a call the model makes anyway is still decided as a
tool-call step (on_governor_tool_denied, on_sub_agent_denied).

Tool names are compared exactly, as the passport spells them: a name that differs only
by letter case or Unicode normalization is another tool, so it is not declared and is
withheld (fail closed; docs/tools.md).

What was withheld is recorded by the proxy, which alone sees the offered entries (the
request's, or an MCP server's tools/list answer): cause `on_governor_tools_withheld`, below.
"""

from __future__ import annotations

from governor.policy.causes import ON_GOVERNOR_TOOLS_WITHHELD as ON_TOOLS_WITHHELD
from governor.policy.limits import Limits

# Not named by the spec: offered tools the step may not use were removed before the model
# (or the agent, for an MCP tools/list answer) saw them; Core §8.1 and Runtime §4.1 forbid
# granting a tool outside the declared ones. Recorded with action `fallback` (the governor
# substituted the narrowed request or answer for the offered one and the session goes on;
# it is not `continue`: nothing undeclared went ahead), detail naming what was withheld,
# bounded (governor/adapters/withhold.py `recorded_detail`; docs/tools.md).


def step_tools(limits: Limits, persona: str | None) -> frozenset[str] | None:
    """The tools a model call (of `persona`, if any) may offer; None: no restriction.

    - At R1 the governor observes and does not alter execution (Runtime §1): None.
    - A persona: its declared tools (already narrowed to the parent's, §4.1); an
      undeclared persona may use none (fail closed).
    - Otherwise the passport's `tools[]`; a passport that declares no tools restricts none
      (its tool calls are not checked against a tool surface either).
    """
    if not limits.enforce_hard:
        return None
    if persona is None:
        return limits.parent_tools or None
    declared = limits.personas.get(persona)
    return declared.tools if declared is not None else frozenset()
