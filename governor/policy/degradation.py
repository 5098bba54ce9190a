"""Runtime §6: the one procedure every fired cause goes through.

`compile_degradation(runtime)` turns the passport's `runtime` member into a map from
cause to Resolution, once, at admission; `resolve(cause, map)` is then a lookup:

1. a response declared for the cause applies (halt, pause, fallback with its value
   and message, or continue);
2. nothing declared: halt, with `fail_closed=True`. Absence is not consent.

`runtime.error_handling` (Core §11.4) is read as the on_tool_error cause, unless
`runtime.degradation.on_tool_error` is declared, which wins:

    error_handling.on_tool_error: abort          -> halt (whatever fallback_behavior says)
    fallback_behavior.action: return_error       -> continue: the tool's error goes back
                                                    to the agent, recorded as overriding
                                                    on_tool_error
    fallback_behavior.action: use_default        -> fallback with `default` and `message`
    fallback_behavior.action: skip               -> fallback with no value: the failed
                                                    call's result is dropped
    error_handling.on_tool_error: continue|retry -> continue (a retry is a new tool call,
                                                    counted and loop-checked like any other)

A loop (§3) resolves `loop_detection.on_detected` first: `resolve(cause, map,
first=...)` with the compiled on_detected response.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from governor.policy.causes import LEGACY_NAMES, canonical_cause
from governor.policy.steps import ON_TOOL_ERROR, Action

_CAUSE = re.compile(r"^on_[a-z0-9_]+$")
_ACTIONS = {"halt": Action.HALT, "pause": Action.PAUSE, "fallback": Action.FALLBACK, "continue": Action.CONTINUE}


class DegradationError(ValueError):
    """A degradation member the governor cannot apply; says which and why."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """The response to apply for a fired cause.

    declared_by: where the response came from (e.g. "runtime.degradation.on_anomaly"),
    None for the fail-closed default.
    """

    action: Action
    value: Any = None
    message: str | None = None
    fail_closed: bool = False
    notify: bool = False
    declared_by: str | None = None


FAIL_CLOSED = Resolution(Action.HALT, fail_closed=True)

DegradationMap = Mapping[str, Resolution]


def response(entry: Any, where: str) -> Resolution:
    """One declared response. Core's schema makes it an object; a bare action string
    (`on_detected: halt`) is accepted as shorthand."""
    if isinstance(entry, str):
        entry = {"action": entry}
    if not isinstance(entry, Mapping):
        raise DegradationError(f"{where}: expected an object with an action, got {entry!r}")
    action = _ACTIONS.get(entry.get("action"))  # type: ignore[arg-type]
    if action is None:
        raise DegradationError(f"{where}: action must be one of halt, pause, fallback, continue, got {entry.get('action')!r}")
    message = entry.get("message")
    if message is not None and not isinstance(message, str):
        raise DegradationError(f"{where}.message: must be a string")
    return Resolution(action, entry.get("value"), message, False, bool(entry.get("notify", False)), where)


def _from_error_handling(error_handling: Mapping[str, Any]) -> Resolution | None:
    where = "runtime.error_handling"
    on_tool_error = error_handling.get("on_tool_error")
    if on_tool_error == "abort":
        return Resolution(Action.HALT, declared_by=f"{where}.on_tool_error")
    behaviour = error_handling.get("fallback_behavior")
    if isinstance(behaviour, Mapping) and "action" in behaviour:
        kind = behaviour["action"]
        message = behaviour.get("message") if isinstance(behaviour.get("message"), str) else None
        source = f"{where}.fallback_behavior"
        if kind == "return_error":
            return Resolution(Action.CONTINUE, message=message, declared_by=source)
        if kind == "use_default":
            return Resolution(Action.FALLBACK, behaviour.get("default"), message, declared_by=source)
        if kind == "skip":
            return Resolution(Action.FALLBACK, None, message, declared_by=source)
        raise DegradationError(f"{source}.action: must be return_error, use_default or skip, got {kind!r}")
    if on_tool_error in ("continue", "retry"):
        return Resolution(Action.CONTINUE, declared_by=f"{where}.on_tool_error")
    if on_tool_error is not None:
        raise DegradationError(f"{where}.on_tool_error: must be abort, continue or retry, got {on_tool_error!r}")
    return None


def compile_degradation(runtime: Mapping[str, Any] | None) -> dict[str, Resolution]:
    """cause -> Resolution for everything the passport declares; undeclared causes are absent."""
    runtime = runtime if isinstance(runtime, Mapping) else {}
    compiled: dict[str, Resolution] = {}
    error_handling = runtime.get("error_handling")
    if isinstance(error_handling, Mapping):
        from_error_handling = _from_error_handling(error_handling)
        if from_error_handling is not None:
            compiled[ON_TOOL_ERROR] = from_error_handling
    degradation = runtime.get("degradation")
    if degradation is None:
        return compiled
    if not isinstance(degradation, Mapping):
        raise DegradationError("runtime.degradation: must be an object keyed by cause")
    for cause, entry in degradation.items():
        if cause == "extensions":
            continue
        if not isinstance(cause, str) or not _CAUSE.match(cause):
            raise DegradationError(f"runtime.degradation: key {cause!r} is not a cause (^on_[a-z0-9_]+$)")
        # a name from before the on_governor_ namespace is read as the new one (causes.LEGACY_NAMES);
        # the caller says it is deprecated (legacy_degradation_names)
        compiled[canonical_cause(cause)] = response(entry, f"runtime.degradation.{cause}")  # wins over error_handling
    return compiled


def legacy_degradation_names(runtime: Any) -> list[str]:
    """The causes a passport's runtime.degradation declares under their pre-namespace names."""
    degradation = runtime.get("degradation") if isinstance(runtime, Mapping) else None
    return [name for name in degradation if name in LEGACY_NAMES] if isinstance(degradation, Mapping) else []


def resolve(cause: str, degradation_map: DegradationMap, *, first: Resolution | None = None) -> Resolution:
    """§6 steps 1-2: the declared response for `cause` (`first` when given), else halt, fail closed."""
    if first is not None:
        return first
    return degradation_map.get(cause, FAIL_CLOSED)
