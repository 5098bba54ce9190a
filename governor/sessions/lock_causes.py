"""Which halts lock the agent: the causes a lock may follow and `--lock-on`'s parsing."""

from __future__ import annotations

import logging
from typing import Any

from governor.policy import causes, steps

log = logging.getLogger("governor.sessions")

DEFAULT_LOCK_CAUSES = (causes.ON_GOVERNOR_SESSION_INTEGRITY,)

# The causes a session can halt for (the §6 degradation causes and the governor's own), the
# only ones a lock can follow.
LOCKABLE_CAUSES = (steps.ON_BUDGET_EXHAUSTED, steps.ON_ITERATION_LIMIT, steps.ON_SUB_AGENT_DENIED,
                   steps.ON_DELEGATION_DENIED, steps.ON_OVERSIGHT_TIMEOUT, steps.ON_TOOL_ERROR, steps.ON_ANOMALY,
                   steps.ON_SESSION_INTEGRITY, steps.ON_GOVERNOR_ERROR, steps.ON_TOOL_DENIED,
                   steps.ON_OVERSIGHT_TRIGGER)


def parse_lock_causes(value: Any) -> tuple[str, ...]:
    """`--lock-on`: comma-separated causes (on_*), or "none"."""
    if isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    else:
        items = [v.strip() for v in str(value).split(",")]
    items = [v for v in items if v]
    if items == ["none"]:
        return ()
    for old in [v for v in items if v in causes.LEGACY_NAMES]:  # typed as before the on_governor_ namespace
        log.warning("lock cause %s is deprecated: it is now %s (docs/reference/deciding.md)", old,
                    causes.LEGACY_NAMES[old])
    items = [causes.canonical_cause(v) for v in items]
    bad = [v for v in items if v not in LOCKABLE_CAUSES]
    if bad:  # a typo would otherwise disable the lock it meant to set
        raise ValueError(f"lock causes must be causes a session halts for (or none), not {', '.join(bad)}; known: "
                         + ", ".join(LOCKABLE_CAUSES))
    return tuple(dict.fromkeys(items))
