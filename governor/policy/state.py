"""What the decision point remembers about one session, as plain immutable data.

SessionState never holds budget totals of its own: budgets live in the store (they
are shared across the sessions of a rolling day). `counters` is only the snapshot the
runtime copies in from the store before each `decide` (`Limits.counter_keys(step)`
names the keys it needs); a missing key reads as 0.

Everything else is the session's own bookkeeping, changed only by `advance`, and
round-trips through `to_dict()` / `from_dict()` (plain JSON types) so the store can
persist it and a session can be replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from governor.policy.steps import CounterKey

PENDING = "pending"
GRANTED = "granted"
REJECTED = "rejected"
EXPIRED = "expired"
USED = "used"


@dataclass(frozen=True, slots=True)
class Approval:
    """A §5 pause waiting on, or answered by, a reviewer."""

    id: str
    step_digest: str
    cause: str  # the cause that paused the step (on_governor_oversight_trigger for triggers)
    trigger: str
    expires_at: float
    status: str = PENDING  # pending | granted | rejected | expired | used
    reviewer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)  # no __slots__: evolve() copies the instance __dict__ in one go
class SessionState:
    session: str
    started_at: float
    seq: int = 0  # steps decided so far; names approvals deterministically
    iterations: int = 0  # model calls admitted (one reason->act iteration each)
    tool_calls: int = 0
    in_flight: int = 0  # model and tool steps admitted and not yet done, agent-wide
    tools_in_flight: int = 0
    personas_live: Mapping[str, int] = field(default_factory=dict)
    recent_tools: tuple[str, ...] = ()  # loop-detection window of tool-call signatures
    tool_counts: Mapping[str, int] = field(default_factory=dict)
    data_classes: frozenset[str] = frozenset()
    deviations: frozenset[str] = frozenset()  # §7 deviations already recorded
    warned: frozenset[tuple[str, str]] = frozenset()  # (dimension, scope) warnings given
    feeds: Mapping[str, int] = field(default_factory=dict)  # R3: §2-§5 events counted (policy/feeds.py)
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    released_triggers: frozenset[str] = frozenset()  # session-level triggers a reviewer approved
    # tool calls a model response announced and the governor admitted, by loop signature,
    # not yet executed through the governor (see ToolCall.origin)
    announced: Mapping[str, int] = field(default_factory=dict)
    wall_clock_at: float | None = None  # elapsed wall-clock charged up to this time
    halted: bool = False
    halt_cause: str | None = None
    ended: bool = False
    counters: Mapping[CounterKey, float] = field(default_factory=dict)

    @classmethod
    def start(cls, session: str, now: float) -> "SessionState":
        return cls(session=session, started_at=now, wall_clock_at=now)

    def with_counters(self, counters: Mapping[CounterKey, float]) -> "SessionState":
        """The same state with a fresh counter snapshot from the store."""
        return self.evolve(counters=counters)

    def evolve(self, **changes: Any) -> "SessionState":
        """dataclasses.replace without its per-call field walk and __init__: the state is
        copied a few times per step, on the proxy's per-request path."""
        if not changes.keys() <= _FIELDS:
            raise TypeError(f"SessionState has no field(s) {sorted(changes.keys() - _FIELDS)}")
        values = self.__dict__.copy()
        values.update(changes)
        state = object.__new__(SessionState)
        object.__setattr__(state, "__dict__", values)
        return state

    def counter(self, key: CounterKey) -> float:
        return self.counters.get(key, 0.0)

    # --- persistence -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        # an empty collection is not sorted (most are, on a usual session): a shared session's
        # state is encoded twice a model call (runtime/shared_fast.py), 6.7 -> 3.6 us each
        return {
            "session": self.session,
            "started_at": self.started_at,
            "seq": self.seq,
            "iterations": self.iterations,
            "tool_calls": self.tool_calls,
            "in_flight": self.in_flight,
            "tools_in_flight": self.tools_in_flight,
            "personas_live": dict(sorted(self.personas_live.items())) if self.personas_live else {},
            "recent_tools": list(self.recent_tools),
            "tool_counts": dict(sorted(self.tool_counts.items())) if self.tool_counts else {},
            "data_classes": sorted(self.data_classes) if self.data_classes else [],
            "deviations": sorted(self.deviations) if self.deviations else [],
            "warned": [list(w) for w in sorted(self.warned)] if self.warned else [],
            "feeds": dict(sorted(self.feeds.items())) if self.feeds else {},
            "approvals": {k: a.to_dict() for k, a in sorted(self.approvals.items())} if self.approvals else {},
            "released_triggers": sorted(self.released_triggers) if self.released_triggers else [],
            "announced": dict(sorted(self.announced.items())) if self.announced else {},
            "wall_clock_at": self.wall_clock_at,
            "halted": self.halted,
            "halt_cause": self.halt_cause,
            "ended": self.ended,
            "counters": [[s, p, d, v] for (s, p, d), v in sorted(self.counters.items(), key=_counter_order)],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SessionState":
        """Inverse of to_dict; KeyError/TypeError/ValueError on malformed input."""
        return cls(
            session=str(data["session"]),
            started_at=float(data["started_at"]),
            seq=int(data["seq"]),
            iterations=int(data["iterations"]),
            tool_calls=int(data["tool_calls"]),
            in_flight=int(data["in_flight"]),
            tools_in_flight=int(data["tools_in_flight"]),
            personas_live={str(k): int(v) for k, v in data["personas_live"].items()},
            recent_tools=tuple(str(s) for s in data["recent_tools"]),
            tool_counts={str(k): int(v) for k, v in data["tool_counts"].items()},
            data_classes=frozenset(str(c) for c in data["data_classes"]),
            deviations=frozenset(str(c) for c in data["deviations"]),
            warned=frozenset((str(d), str(s)) for d, s in data["warned"]),
            feeds={str(k): int(v) for k, v in data.get("feeds", {}).items()},  # absent before R3 feeds
            approvals={str(k): Approval(**v) for k, v in data["approvals"].items()},
            released_triggers=frozenset(str(t) for t in data["released_triggers"]),
            announced={str(k): int(v) for k, v in data.get("announced", {}).items()},
            wall_clock_at=None if data["wall_clock_at"] is None else float(data["wall_clock_at"]),
            halted=bool(data["halted"]),
            halt_cause=data["halt_cause"],
            ended=bool(data["ended"]),
            counters={(str(s), p, str(d)): float(v) for s, p, d, v in data["counters"]},
        )


_FIELDS = frozenset(f.name for f in fields(SessionState))


def _counter_order(item: tuple[CounterKey, float]) -> tuple[str, str, str]:
    (scope, persona, dimension), _ = item
    return (scope, persona or "", dimension)
