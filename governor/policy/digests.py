"""What names a step and what a fired cause records: step digests, loop signatures,
approval ids and the enforcement event a decision carries.

Pure functions of their arguments. Kept apart from the decision point
(governor.policy.engine) because everything else in the policy room needs them: the
checks that fire causes, the approval handlers that name a held step, the state
transition that counts repeated tool calls, and the runtime (by way of governor.policy).
"""

from __future__ import annotations

import hashlib
from dataclasses import fields
from typing import Any, Mapping

from governor.common.canonical import b64url
from governor.policy.signature import canonical_bytes, digest
from governor.policy.steps import (
    ApprovalExpired, ApprovalGranted, ApprovalRejected, Delegation, EnvelopeDeviation, ModelCall, PassportPresented,
    PersonaExit, PersonaSpawn, SessionEnd, Step, StepDone, Tick, ToolCall, ToolError, UsageReport
)


STEP_KINDS: dict[type, str] = {
    ModelCall: "model_call",
    UsageReport: "usage_report",
    ToolCall: "tool_call",
    PersonaSpawn: "persona_spawn",
    PersonaExit: "persona_exit",
    Delegation: "delegation",
    ToolError: "tool_error",
    Tick: "tick",
    PassportPresented: "passport_presented",
    SessionEnd: "session_end",
    StepDone: "step_done",
    ApprovalGranted: "approval_granted",
    ApprovalRejected: "approval_rejected",
    ApprovalExpired: "approval_expired",
    EnvelopeDeviation: "envelope_deviation",
}


def _json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (tuple, list, frozenset)):
        return [_json(v) for v in value]
    return value


_BOOKKEEPING_FIELDS = frozenset({"approval_id", "reserved", "ends_call"})


def step_digest(step: Step) -> str:
    """The digest an approval names. ToolCall: digest_of({"tool", "arguments"}); other
    steps: digest_of({"step": kind, <fields but the runtime's bookkeeping>}): not
    approval_id, reserved or ends_call, which say how the runtime presents a step, not what
    the step is (a final report that ends its call is the same step as the report and its
    StepDone, so it must name the same approval)."""
    if type(step) is ToolCall:
        return digest({"tool": step.tool, "arguments": step.arguments})
    payload: dict[str, Any] = {"step": STEP_KINDS[type(step)]}
    for f in fields(step):  # type: ignore[arg-type]
        if f.name not in _BOOKKEEPING_FIELDS:
            payload[f.name] = _json(getattr(step, f.name))
    return digest(payload)


def loop_signature(tool: str, arguments: Mapping[str, Any]) -> str:
    """§3 signature: tool name + hex SHA-256 of JCS(arguments)."""
    return tool + "#" + hashlib.sha256(canonical_bytes(arguments)).hexdigest()


def approval_id(session: str, seq: int, digest_value: str) -> str:
    raw = f"{session}\x00{seq}\x00{digest_value}".encode()
    return "apr_" + b64url(hashlib.sha256(raw).digest())[:22]


def enforcement_event(cause: str, action: str, detail: dict[str, Any]) -> dict[str, Any]:
    return {"cause": cause, "action": action, "detail": detail}
