"""Plan editing (§5.4, intervention_model `plan_editing`): the step a reviewer approves
in place of the one the agent sent.

What can be edited: a tool call the agent itself sends through the governor (an MCP
`tools/call`), whose request the proxy rewrites before it goes upstream. The edited
step is admitted afresh (its permissions, path patterns, budgets) under an approval
bound to the edited step's digest; the record's approval event carries both digests
(`original_step_digest`: what the agent asked; `step_digest`: what was approved and ran).

What cannot: a tool call an LLM *proposes* in its response (the agent runs it, not the
governor), a model call, a persona spawn or a delegation. An edit of those is refused
(409 `not_editable`) and the reviewer approves or rejects the step as it is. Rewriting a
model's proposed call would change what the agent believes the model said; approving or
rejecting it is the honest answer there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from governor.adapters.mcp import target_path
from governor.policy.steps import Step, ToolCall

MAX_EDITED_ARGUMENTS = 32 * 1024  # characters of canonical JSON; the control body is 64 KiB


class EditRefused(Exception):
    """An edit the governor will not apply: `code` for the API, the message for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def editable(limits: Any, step: Step) -> bool:
    """Whether a reviewer may edit this held step (the passport allows it, and the proxy
    can send the edited request)."""
    return bool(getattr(limits, "plan_editing", False)) and type(step) is ToolCall and step.origin == "agent"


def edited_step(limits: Any, step: Step, arguments: Any) -> ToolCall:
    """The held `step` with the reviewer's `arguments`; EditRefused says why not."""
    if not getattr(limits, "plan_editing", False):
        raise EditRefused("plan_editing_not_declared",
                          "the passport's human_oversight.intervention_model is not plan_editing: "
                          "this step can be approved or rejected, not edited")
    if type(step) is not ToolCall or step.origin != "agent":
        what = "a tool call proposed by a model" if type(step) is ToolCall else "this kind of step"
        raise EditRefused("not_editable",
                          f"{what} cannot be edited (only a tool call the agent sends through the governor, "
                          "an MCP tools/call, can be): approve or reject it as it is")
    if not isinstance(arguments, Mapping):
        raise EditRefused("bad_edited_arguments", '"edited_arguments" must be a JSON object')
    if not all(isinstance(key, str) for key in arguments):
        raise EditRefused("bad_edited_arguments", '"edited_arguments" keys must be strings')
    from governor.common.canonical import canonicalize, inexact_json

    if (inexact := inexact_json(arguments)) is not None:
        raise EditRefused("bad_edited_arguments", f'"edited_arguments"{inexact}: the approved step would not be '
                          "the call that runs (send a large number as a string)")
    try:
        size = len(canonicalize(dict(arguments)))
    except (TypeError, ValueError) as exc:
        raise EditRefused("bad_edited_arguments", f'"edited_arguments" cannot be canonicalized: {exc}') from None
    if size > MAX_EDITED_ARGUMENTS:
        raise EditRefused("bad_edited_arguments",
                          f'"edited_arguments" is {size} bytes canonical; at most {MAX_EDITED_ARGUMENTS}')
    edited = dict(arguments)
    # a fresh step: its target path (path patterns, triggers) is the edited one's
    return dataclasses.replace(step, arguments=edited, target_path=target_path(edited), approval_id=None)
