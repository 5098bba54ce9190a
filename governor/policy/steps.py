"""The vocabulary shared by the decision point, the runtime and the wire adapters.

Steps are what an adapter makes of traffic; decisions are what the policy engine
makes of steps. Both are plain frozen data so a session can be replayed from its
record: the same (limits, state, step, now) always gives the same decision.

Times are seconds since the epoch as floats, always passed in by the caller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

# --- causes: the table and the extension namespace are governor/policy/causes.py ----------

from governor.policy.causes import (
    ON_ANOMALY,
    ON_BUDGET_EXHAUSTED,
    ON_DELEGATION_DENIED,
    ON_GOVERNOR_DELEGATION_ADMITTED as ON_DELEGATION_ADMITTED,
    ON_GOVERNOR_ERROR,
    ON_GOVERNOR_OVERSIGHT_TRIGGER as ON_OVERSIGHT_TRIGGER,
    ON_GOVERNOR_REQUEST_REFUSED as ON_REQUEST_REFUSED,
    ON_GOVERNOR_SESSION_INTEGRITY as ON_SESSION_INTEGRITY,
    ON_GOVERNOR_SUB_AGENT_ENDED as ON_SUB_AGENT_ENDED,
    ON_GOVERNOR_SUB_AGENT_SPAWNED as ON_SUB_AGENT_SPAWNED,
    ON_GOVERNOR_TOOL_DENIED as ON_TOOL_DENIED,
    ON_ITERATION_LIMIT,
    ON_OVERSIGHT_TIMEOUT,
    ON_SUB_AGENT_DENIED,
    ON_TOOL_ERROR,
)

KNOWN_CAUSES = (
    ON_BUDGET_EXHAUSTED,
    ON_ITERATION_LIMIT,
    ON_SUB_AGENT_DENIED,
    ON_DELEGATION_DENIED,
    ON_OVERSIGHT_TIMEOUT,
    ON_TOOL_ERROR,
    ON_ANOMALY,
)


class Tier(str, enum.Enum):
    R1 = "R1"  # observe and record; blocks only a requires_confirmation tool (held) and a passport swap
    R2 = "R2"  # block on §2-§4 hard limits, apply §6
    R3 = "R3"  # R2 plus §7 anomaly monitoring and §5 oversight escalation


class Action(str, enum.Enum):
    """A §6 response. PERMIT is not a §6 action: it is the absence of one."""

    PERMIT = "permit"
    HALT = "halt"
    PAUSE = "pause"
    FALLBACK = "fallback"
    CONTINUE = "continue"
    DENY = "deny"  # the step is refused but the session goes on (e.g. a rejected approval)


# --- steps ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelCall:
    """An LLM request about to go upstream."""

    model: str
    expected_input_tokens: int
    expected_output_tokens: int
    tools_offered: tuple[str, ...] = ()
    persona: str | None = None
    provider: str = ""  # "openai" | "anthropic" | ...; informational
    approval_id: str | None = None  # set when a reviewer released this exact step
    # Output fitting (governor.policy.fitting): the smallest output limit per answer the
    # governor may lower this call's to when it does not fit its caps; None: never lowered.
    output_floor: int | None = None
    output_choices: int = 1  # answers generated (`n`): expected_output_tokens is per answer times this
    # What the call consumes besides tokens, priced per unit by the pricing table (images of a
    # size and quality, seconds of audio, characters spoken): ((unit, count), ...), e.g.
    # (("image/1024x1024/standard", 2),). Units are cost only: token caps count tokens.
    units: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Usage observed for a model call, final or cumulative-so-far (streams).

    `final` is False while a stream is still flowing: the engine then checks the
    running total against the caps (a crossing cuts the stream) without committing.

    `input_tokens` counts every input token, cached ones included; `cached_input_tokens`
    is the part of it billed at the cached-input price (adapters normalise providers
    that report cache reads separately). `reserved` is what the model call's admission
    reserved (its Decision.charges, filled in by the runtime from the ticket): the
    engine projects counter - reserved + actual, so the counter snapshot may include
    the outstanding reservation.

    `ends_call` (final reports only, set by the runtime): the report is also the end of
    its model call, whose in-flight slot it frees, as StepDone("model") would after it;
    one step instead of two on every model call.

    `units`: what the call consumed besides tokens (images, audio seconds, characters:
    ModelCall.units), priced per unit; token caps count only the tokens.
    """

    model: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    persona: str | None = None
    final: bool = True
    reserved: tuple[CounterCharge, ...] = ()
    ends_call: bool = False
    units: tuple[tuple[str, float], ...] = ()  # what was consumed besides tokens (ModelCall.units)
    # measure, don't believe (adapters.counting): the provider's own output figure (None: it
    # reported no usage) and the governor's count of the output it relayed (None: not
    # counted); output_tokens is then the larger. Both None for reports that are not measured.
    reported_output_tokens: int | None = field(default=None, compare=False)
    counted_output_tokens: int | None = field(default=None, compare=False)

    def with_reserved(self, reserved: tuple[CounterCharge, ...], ends_call: bool = False) -> "UsageReport":
        """This report with `reserved` (and `ends_call`) set (dataclasses.replace, without its
        field walk: the runtime does this once per model call)."""
        return UsageReport(self.model, self.input_tokens, self.output_tokens, self.cached_input_tokens,
                           self.persona, self.final, reserved, ends_call and self.final, self.units,
                           self.reported_output_tokens, self.counted_output_tokens)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool invocation: an MCP tools/call, or a tool_use/tool_calls an LLM asked for."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    target_path: str | None = None
    data_classes: tuple[str, ...] = ()  # categories and/or a sensitivity level
    sensitivity: str | None = None  # public|internal|confidential|restricted
    persona: str | None = None
    approval_id: str | None = None  # set when a reviewer released this exact step
    # "agent": the agent invokes the tool through the governor (MCP tools/call) now.
    # "model": an LLM response asks the agent to run it (tool_calls / tool_use). It is
    # counted and gated there; when the agent then executes that same call (same tool,
    # same canonical arguments) through the governor, the execution consumes the
    # admission instead of being counted and reviewed a second time.
    origin: str = "agent"


@dataclass(frozen=True, slots=True)
class PersonaSpawn:
    """A new instance of a declared persona (§4.1); `instance` names it in the record."""

    persona: str
    approval_id: str | None = None
    instance: str | None = None


@dataclass(frozen=True, slots=True)
class PersonaExit:
    """A persona instance ended (`reason`: idle, ended, ...): its parallel slot is free."""

    persona: str
    instance: str | None = None
    reason: str | None = None
    lived_sec: float | None = None


@dataclass(frozen=True, slots=True)
class Delegation:
    """An A2A call to a separately identified peer (§4.2)."""

    peer_id: str
    peer_passport: Mapping[str, Any] | None  # admitted (verified) peer passport, or None
    peer_verified: bool
    chain_depth: int  # depth of the delegation this step would create (root call = 1)
    peer_url: str | None = None
    approval_id: str | None = None
    persona: str | None = None  # the persona delegating, when one is named (§8.3 attribution)


@dataclass(frozen=True, slots=True)
class ToolError:
    """An upstream tool failed (MCP error result, tool server 5xx)."""

    tool: str
    message: str = ""
    persona: str | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    """Wall-clock has moved on; checks wall_clock_sec and max_duration_sec."""


@dataclass(frozen=True, slots=True)
class PassportPresented:
    """The agent presented passport bytes mid-session (§1.3 anti-swap)."""

    digest: str


@dataclass(frozen=True, slots=True)
class SessionEnd:
    pass


@dataclass(frozen=True, slots=True)
class StepDone:
    """An admitted model call ("model") or tool call ("tool") is over: its in-flight slot is free."""

    kind: str  # "model" | "tool"
    persona: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalGranted:
    """A reviewer approved a paused step (§5); the step is released once, by its digest.

    `edited_digest`: under plan_editing, the reviewer approved an edited step instead;
    the approval is then bound to (and releases only) the step with that digest."""

    approval_id: str
    reviewer: str
    reason: str = ""  # the reviewer's note, recorded with the approval
    edited_digest: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRejected:
    """A reviewer rejected a paused step (§5): that step is denied, the session goes on."""

    approval_id: str
    reviewer: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ApprovalExpired:
    """No reviewer answered within response_time_minutes (§5.3)."""

    approval_id: str


@dataclass(frozen=True, slots=True)
class EnvelopeDeviation:
    """The agent's statistical envelope (policy/envelope.py) holds a sticky deviation this
    session has not recorded yet: §7's on_anomaly, resolved through §6 (R3)."""

    deviation: Mapping[str, Any]
    approval_id: str | None = None  # a reviewer released the session from this deviation's pause


Step = (
    ModelCall
    | UsageReport
    | ToolCall
    | PersonaSpawn
    | PersonaExit
    | Delegation
    | ToolError
    | Tick
    | PassportPresented
    | SessionEnd
    | StepDone
    | ApprovalGranted
    | ApprovalRejected
    | ApprovalExpired
    | EnvelopeDeviation
)


# --- decisions -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Consumption:
    tokens: int = 0
    cost_usd: float = 0.0
    wall_clock_sec: float = 0.0


class CounterCharge(NamedTuple):
    """One budget counter a step draws on, with the cap it must stay within.

    The store applies all charges of a decision atomically: either every counter
    stays within its cap after adding `amount`, or none is changed and the store
    names the charge that would overshoot. Counter identity is
    (scope, persona, dimension) within the session (per_session) or within the
    agent across sessions (per_day, a rolling 24 hours).

    A NamedTuple rather than a frozen dataclass: a model call makes several per
    request, and a tuple is built in half the time.
    """

    scope: str  # "per_session" | "per_day"
    dimension: str  # "tokens" | "cost_usd" | "wall_clock_sec"
    amount: float
    cap: float | None  # None: tracked, not capped
    persona: str | None = None  # None: the parent's aggregate counter


CounterKey = tuple[str, str | None, str]  # (scope, persona, dimension)


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What a §5 pause asks a reviewer; released only for the step whose digest it names."""

    id: str
    reason: str
    step_digest: str  # digest_of({"tool": ..., "arguments": ...})
    expires_at: float
    trigger: str
    monitor_only: bool = False


@dataclass(frozen=True)  # no __slots__: permitted() fills the instance __dict__ in one go
class Decision:
    """The PDP's answer for one step.

    action:      PERMIT when nothing fired; otherwise the resolved §6 action.
    enforced:    False when the tier only observes (R1): the step goes ahead and the
                 event is recorded with what *would* have happened.
    cause:       the cause that fired, or None.
    fail_closed: True when action is HALT because nothing was declared for the cause.
    details:     dimension, scope, observed, limit, matched rule, persona, ...
    event:       the record event to append ({cause, action, detail}), or None when
                 nothing is recorded (a plain permit).
    charges:     counter charges to reserve atomically before admitting the step
                 (model calls: the expected consumption; usage: the actual).
    allowed_tools: for model calls and persona steps, the tools the step may use
                 (None: no restriction declared).
    fallback_value / fallback_message: a FALLBACK's substitute.
    approval:    for PAUSE, the approval request to hold the step on.
    warnings:    one-time threshold warnings ((dimension, scope, fraction)), for logs
                 and metrics, never events.
    prior_events: events recorded before `event` by the same step: causes that an
                 explicit continue overrode, or that R1 only observed, while the step
                 was still being checked. `events` gives them all, in order.
    settles:     True when `charges` record consumption that already happened (a final
                 usage report, elapsed wall-clock): the runtime commits them whatever
                 the action (they carry no cap), releasing the step's `reserved`
                 charges. False: `charges` are a reservation to make only when the
                 step goes ahead (not `blocks`).
    """

    action: Action = Action.PERMIT
    enforced: bool = True
    cause: str | None = None
    fail_closed: bool = False
    details: Mapping[str, Any] = field(default_factory=dict)
    event: Mapping[str, Any] | None = None
    charges: tuple[CounterCharge, ...] = ()
    allowed_tools: frozenset[str] | None = None
    fallback_value: Any = None
    fallback_message: str | None = None
    approval: ApprovalRequest | None = None
    warnings: tuple[tuple[str, str, float], ...] = ()
    prior_events: tuple[Mapping[str, Any], ...] = ()
    settles: bool = False

    @property
    def events(self) -> tuple[Mapping[str, Any], ...]:
        """Every record event of this decision, in the order to append them."""
        if self.event is None:
            return self.prior_events
        return (*self.prior_events, self.event)

    @property
    def blocks(self) -> bool:
        """True when the step must not go ahead as asked."""
        action = self.action  # identity tests: asked several times per step
        return action is not _PERMIT and action is not _CONTINUE and self.enforced

    @property
    def halts(self) -> bool:
        return self.action is _HALT and self.enforced


_PERMIT, _CONTINUE, _HALT = Action.PERMIT, Action.CONTINUE, Action.HALT
PERMIT = Decision()
_DEFAULTS = dict(PERMIT.__dict__)  # every field's default, whatever fields Decision grows


def permitted(charges: tuple[CounterCharge, ...], allowed_tools: frozenset[str] | None,
              warnings: tuple[tuple[str, str, float], ...], details: Mapping[str, Any], settles: bool) -> Decision:
    """Decision(charges=..., allowed_tools=..., warnings=..., details=..., settles=...), built
    without the frozen dataclass's field-by-field __init__: the decision point makes one
    per model call and per usage report."""
    decision = object.__new__(Decision)
    values = _DEFAULTS.copy()
    values.update(charges=charges, allowed_tools=allowed_tools, warnings=warnings, details=details, settles=settles)
    object.__setattr__(decision, "__dict__", values)
    return decision
