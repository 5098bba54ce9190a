"""§5.4 plan_editing: the PDP binds an edited approval to the edited step's digest, and
governor.runtime.edit decides which held steps a reviewer may edit."""

from __future__ import annotations

import json

import pytest

from governor.policy import Action, ApprovalGranted, ToolCall, step_digest
from governor.runtime.edit import MAX_EDITED_ARGUMENTS, EditRefused, editable, edited_step
from tests.test_policy_support import Driver, passport, tools

TOOLS = tools("search", "send_email", "delete_note", send_email={"requires_confirmation": True},
              delete_note={"requires_confirmation": True})
EDITING = passport(tools=TOOLS, human_oversight={"triggers": ["x"], "intervention_model": "plan_editing"})
APPROVE_REJECT = passport(tools=TOOLS, human_oversight={"triggers": ["x"], "intervention_model": "approve_reject"})


def test_an_edited_approval_releases_the_edited_step_once_and_never_the_original():
    driver = Driver(EDITING)
    original = ToolCall("send_email", {"to": "everyone@example.com"})
    edited = ToolCall("send_email", {"to": "team@example.com"})
    request = driver.run(original).approval
    granted = driver.run(ApprovalGranted(request.id, "alice", edited_digest=step_digest(edited)))
    detail = granted.event["detail"]
    assert granted.action is Action.CONTINUE and detail["edited"] is True
    assert detail["original_step_digest"] == step_digest(original) == request.step_digest
    assert detail["step_digest"] == step_digest(edited)
    # the original step is not released by the edited approval: it is held afresh
    again = driver.run(ToolCall("send_email", {"to": "everyone@example.com"}, approval_id=request.id))
    assert again.action is Action.PAUSE and again.approval.id != request.id
    released = driver.run(ToolCall("send_email", {"to": "team@example.com"}, approval_id=request.id))
    assert released.action is Action.PERMIT and released.details["released_by"] == request.id
    assert driver.state.approvals[request.id].status == "used"


def test_the_pdp_refuses_an_edit_the_passport_does_not_allow():
    driver = Driver(APPROVE_REJECT)
    request = driver.run(ToolCall("send_email", {"to": "x"})).approval
    refused = driver.run(ApprovalGranted(request.id, "alice", edited_digest=step_digest(ToolCall("send_email", {"to": "y"}))))
    assert refused.action is Action.DENY and "plan_editing" in refused.details["reason"]
    assert driver.state.approvals[request.id].status == "pending"  # still answerable as it is


def test_which_steps_are_editable():
    limits = Driver(EDITING).limits
    assert limits.plan_editing and not Driver(APPROVE_REJECT).limits.plan_editing
    assert editable(limits, ToolCall("delete_note", {"path": "/a"}))
    assert not editable(limits, ToolCall("delete_note", {"path": "/a"}, origin="model"))
    assert not editable(Driver(APPROVE_REJECT).limits, ToolCall("delete_note", {"path": "/a"}))


def test_an_edited_step_takes_the_edited_target_path():
    limits = Driver(EDITING).limits
    step = edited_step(limits, ToolCall("delete_note", {"path": "/notes/a.md"}, target_path="/notes/a.md",
                                        approval_id="apr-1"), {"path": "/etc/passwd"})
    assert step.arguments == {"path": "/etc/passwd"} and step.target_path == "/etc/passwd"
    assert step.approval_id is None and step.tool == "delete_note"


@pytest.mark.parametrize("arguments, code", [
    (["not", "an", "object"], "bad_edited_arguments"),
    ("text", "bad_edited_arguments"),
    ({"x": "y" * (MAX_EDITED_ARGUMENTS + 1)}, "bad_edited_arguments"),
    ({"x": float("nan")}, "bad_edited_arguments"),
    ({"account": [1, {"id": 2**53 + 1}]}, "bad_edited_arguments"),  # JCS would round it: digest != what runs
    ({"x": json.loads("[" * 70 + "]" * 70)}, "bad_edited_arguments"),  # deeper than digests and webhooks take
])
def test_hostile_edits_are_refused_with_a_reason(arguments, code):
    limits = Driver(EDITING).limits
    with pytest.raises(EditRefused) as refused:
        edited_step(limits, ToolCall("delete_note", {"path": "/a"}), arguments)
    assert refused.value.code == code and refused.value.message


def test_a_model_proposed_call_or_an_approve_reject_passport_cannot_be_edited():
    with pytest.raises(EditRefused) as model:
        edited_step(Driver(EDITING).limits, ToolCall("delete_note", {"path": "/a"}, origin="model"), {"path": "/b"})
    assert model.value.code == "not_editable"
    with pytest.raises(EditRefused) as declared:
        edited_step(Driver(APPROVE_REJECT).limits, ToolCall("delete_note", {"path": "/a"}), {"path": "/b"})
    assert declared.value.code == "plan_editing_not_declared"


async def test_the_runtime_refuses_to_edit_a_model_proposed_call_and_keeps_it_pending(tmp_path):
    import asyncio

    from tests.console_harness import passport as console_passport
    from tests.control_harness import real_runtime

    runtime, _ = real_runtime(console_passport(), tmp_path)
    try:
        proposed = ToolCall("delete_note", {"path": "/notes/m.md"}, origin="model")
        held = await runtime.admit("s-1", proposed)
        assert held.decision.action is Action.PAUSE
        [view] = runtime.approvals()
        assert view["plan_editing"] is False
        with pytest.raises(EditRefused) as refused:
            await runtime.resolve_approval(view["id"], True, "r", edited_arguments={"path": "/notes/n.md"})
        assert refused.value.code == "not_editable"
        assert [a["id"] for a in runtime.approvals()] == [view["id"]]
        waiting = asyncio.create_task(runtime.await_approval("s-1", view["id"]))
        answer = await runtime.resolve_approval(view["id"], True, "r")
        released = await asyncio.wait_for(waiting, 10)
        assert answer["edited"] is False and not released.decision.blocks
        assert released.edited_arguments is None  # the proxy sends the agent's request unchanged
    finally:
        await runtime.close()
