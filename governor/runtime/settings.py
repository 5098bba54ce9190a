"""What the runtime's collaborators share and a caller may replace after construction.

The proxy's start-up sets the webhook notifier; tests swap the limits, the journal's fsync,
the sweeper's period and the idle timeout. One `RuntimeSettings` object, handed to every
collaborator and read where it is used, so a replacement reaches all of them at once;
`Runtime`'s attributes of the same names read and write it (`SharedSetting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from governor.notify.webhooks import NULL_NOTIFIER
from governor.policy import Limits


@dataclass(slots=True, eq=False)
class RuntimeSettings:
    limits: Limits  # the pinned passport's, compiled (a session resumed on another passport keeps its own)
    journal_sync: bool = True  # fsync each journal append (tests turn it off)
    notifier: Any = NULL_NOTIFIER  # webhooks (governor.notify): emit() queues, never waits
    # the sweeper's period: the bound on its deadlines (wall-clock caps of sessions with no tick
    # in flight, review expiry, idle ends); `governor run` keeps 1 s whatever `tick_interval`
    # (the proxy's in-flight ticks), tests shorten it
    sweep_interval_sec: float = 1.0
    session_idle_sec: float = 900.0  # a session with nothing in flight this long is ended
    duplicates: Any = None  # governor.runtime.duplicates.DuplicateWatch on a shared store, else None


class SharedSetting:
    """An attribute of the runtime kept in its `settings` (a RuntimeSettings)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, runtime: Any, owner: type | None = None) -> Any:
        return self if runtime is None else getattr(runtime.settings, self.name)

    def __set__(self, runtime: Any, value: Any) -> None:
        setattr(runtime.settings, self.name, value)
