"""The policy decision point: pure, deterministic, no I/O and no clock reads.

    limits = compile_limits(document, tier=Tier.R2, pricing=load_pricing(path), config=PolicyConfig())
    state = SessionState.start(session_id, now)
    state = state.with_counters(snapshot_from_store(limits.counter_keys(step)))
    decision = decide(limits, state, step, now)
    state = advance(limits, state, step, decision, now)

See governor.policy.engine for the budget projection contract with the store.
"""

from governor.policy.engine import (
    advance,
    decide,
    governor_error,
    store_unreachable,
    counter_damaged,
    quiet_model_call,
    quiet_settlement,
    settlement,
    step_digest,
)
from governor.policy.compiling import compile_limits
from governor.policy.limits import Limits, LimitsError, PolicyConfig
from governor.policy.quiet import quiet_charges
from governor.policy.pricing import PricingError, PricingTable, load_pricing
from governor.policy.state import SessionState
from governor.policy.tools import step_tools
from governor.policy.steps import (
    KNOWN_CAUSES,
    ON_ANOMALY,
    ON_BUDGET_EXHAUSTED,
    ON_DELEGATION_ADMITTED,
    ON_DELEGATION_DENIED,
    ON_GOVERNOR_ERROR,
    ON_ITERATION_LIMIT,
    ON_OVERSIGHT_TIMEOUT,
    ON_OVERSIGHT_TRIGGER,
    ON_SESSION_INTEGRITY,
    ON_SUB_AGENT_DENIED,
    ON_SUB_AGENT_ENDED,
    ON_SUB_AGENT_SPAWNED,
    ON_TOOL_DENIED,
    ON_TOOL_ERROR,
    PERMIT,
    Action,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRejected,
    ApprovalRequest,
    Consumption,
    CounterCharge,
    CounterKey,
    Decision,
    Delegation,
    ModelCall,
    PassportPresented,
    PersonaExit,
    PersonaSpawn,
    SessionEnd,
    Step,
    StepDone,
    Tick,
    Tier,
    ToolCall,
    ToolError,
    UsageReport,
)

__all__ = [
    "compile_limits", "Limits", "LimitsError", "PolicyConfig", "SessionState", "decide", "advance", "settlement",
    "quiet_model_call", "quiet_charges", "quiet_settlement", "step_tools",
    "step_digest", "governor_error", "store_unreachable", "counter_damaged", "load_pricing", "PricingTable", "PricingError",
    "KNOWN_CAUSES", "ON_ANOMALY", "ON_BUDGET_EXHAUSTED", "ON_DELEGATION_DENIED", "ON_GOVERNOR_ERROR",
    "ON_ITERATION_LIMIT", "ON_OVERSIGHT_TIMEOUT", "ON_OVERSIGHT_TRIGGER", "ON_SESSION_INTEGRITY",
    "ON_SUB_AGENT_DENIED", "ON_SUB_AGENT_SPAWNED", "ON_SUB_AGENT_ENDED", "ON_DELEGATION_ADMITTED", "ON_TOOL_DENIED", "ON_TOOL_ERROR", "PERMIT", "Action", "ApprovalExpired", "ApprovalGranted",
    "ApprovalRejected", "ApprovalRequest", "Consumption", "CounterCharge", "CounterKey", "Decision",
    "Delegation", "ModelCall", "PassportPresented", "PersonaExit", "PersonaSpawn", "SessionEnd", "Step",
    "StepDone", "Tick", "Tier", "ToolCall", "ToolError", "UsageReport",
]
