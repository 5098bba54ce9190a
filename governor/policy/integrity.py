"""§1.3 anti-swap for a resumed session: the pin it was admitted with is not the governor's now.

A session resumed after a restart (its state in the store, its journal in the data
directory) carries the pin it was admitted with: a passport digest and a tier. When the
governor now runs another pin, that is a session-integrity fault in that session, resolved
through §6 with the degradation the session's ORIGINAL passport declares (the session's
contract; the new passport's word does not count for it), halt when nothing is declared.

There is no step to hold or substitute at resumption, so a declared `pause` halts (nobody
could approve a request that is not there) and a `fallback` goes on like `continue`, under
the original limits (recorded as declared). At every tier, R1 included (the Security
Considerations give anti-swap no tier exemption). Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from typing import Any, Mapping

from governor.policy import degradation as _degradation
from governor.policy.limits import Limits
from governor.policy.steps import ON_SESSION_INTEGRITY, Action, Decision

PIN_CHANGED = "pin_changed_across_restart"


def pin_changed(limits: Limits | None, detail: Mapping[str, Any]) -> Decision:
    """The decision for a resumed session whose pin differs from the governor's.

    `limits`: the session's original limits (compiled from its own passport and tier), or
    None when they cannot be reconstructed: then halt, fail closed, whatever was declared."""
    detail = {"reason": PIN_CHANGED, **detail}
    if limits is None:
        detail.update(limits_in_force="unavailable", fail_closed=True)
        return Decision(action=Action.HALT, cause=ON_SESSION_INTEGRITY, fail_closed=True, details=detail,
                        event={"cause": ON_SESSION_INTEGRITY, "action": Action.HALT.value, "detail": detail})
    resolution = limits.degradation.get(ON_SESSION_INTEGRITY, _degradation.FAIL_CLOSED)
    action = Action.HALT if resolution.action is Action.PAUSE else resolution.action
    detail["fail_closed"] = resolution.fail_closed or resolution.action is Action.PAUSE
    detail["limits_in_force"] = "original"
    if resolution.declared_by is not None:
        detail["declared_by"] = resolution.declared_by
    # resolved at every tier, R1 included: anti-swap fails closed with no tier exemption
    if action is not Action.HALT:
        detail["overridden_cause"] = ON_SESSION_INTEGRITY  # §6: a continue names what it overrode
    return Decision(action=action, cause=ON_SESSION_INTEGRITY, fail_closed=detail["fail_closed"], details=detail,
                    event={"cause": ON_SESSION_INTEGRITY, "action": action.value, "detail": detail},
                    fallback_message=resolution.message)


__all__ = ["PIN_CHANGED", "pin_changed"]
