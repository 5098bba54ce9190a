"""Enforcement events the proxy records from tasks of its own, kept through a shutdown.

A hook records what it enforces before it returns (mitmproxy awaits it). Some events are
recorded from tasks instead, and a graceful stop (SIGTERM) must not lose them:

  * a stream relay is synchronous, so the refusal of a cut it makes (held output past
    `max_held_stream_bytes`, an event past its bound: governor.proxy.refusals) is recorded
    by a task: `spawn`. Such a task is never cancelled; `settle` awaits it.
  * a stream's usage reports and tool calls, and each session's wall-clock ticks, are
    decided by background tasks that the done hook stops. Cancelled inside the runtime
    call, a task could drop the event the call was recording (the decision made in a worker
    thread, the journal append still queued for one). So such a call runs inside
    `with recording:`, and `cancel(task)` waits until the call has returned (the task is
    then cancelled at its next await, and starts no new call: `__enter__` refuses one).

`settle(timeout)` waits for both: the proxy's done hook awaits it, and `Running.stop`
again before `runtime.close()` ends the sessions and signs their final records. What
is still running past the bound is logged (a journal that hangs must not hang the stop).

Cost: `with recording:` is a dict insert and pop per runtime call from a background
task; a spawned record is the task the relay made before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine

log = logging.getLogger("governor.proxy")

SETTLE_SEC = 5.0  # how long a stop waits for records in progress (Running.stop gives the master 10 s)


class Recording:
    __slots__ = ("_tasks", "_calls", "_settled")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()  # tasks that record (spawned by a relay)
        self._calls: dict[asyncio.Task, bool] = {}  # task in a runtime call -> cancel it when the call returns
        self._settled: asyncio.Event | None = None  # while settle() waits

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Record from a task of its own (the caller cannot await): tracked until done."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_done)
        return task

    def __enter__(self) -> Recording:
        task = asyncio.current_task()
        if task is not None:
            if task.cancelling():  # asked to stop: no new decision (and record) is begun
                raise asyncio.CancelledError
            self._calls[task] = False
        return self

    def __exit__(self, *exc: object) -> None:
        task = asyncio.current_task()
        if task is not None and self._calls.pop(task, False):
            task.cancel()  # a stop asked for it during the call: now that it is over
        if self._settled is not None and not self._calls and not self._tasks:
            self._settled.set()

    def cancel(self, task: asyncio.Task) -> None:
        """Cancel a background task now, or once the runtime call it is in has returned."""
        if task in self._calls:
            self._calls[task] = True
        else:
            task.cancel()

    @property
    def pending(self) -> int:
        """Records and runtime calls in progress."""
        return len(self._tasks) + len(self._calls)

    async def settle(self, timeout: float = SETTLE_SEC) -> int:
        """Wait until every spawned record and every runtime call in progress is over, at
        most `timeout` seconds; the number still running then (0: nothing was left)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while self._tasks or self._calls:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._settled = asyncio.Event()
                try:
                    await asyncio.wait_for(self._settled.wait(), remaining)
                except TimeoutError:
                    break
        finally:
            self._settled = None
        left = self.pending
        if left:
            log.error("governor: %d enforcement record(s) still in progress after %.1fs at shutdown; "
                      "they may be missing from the final records", left, timeout)
        return left

    def _spawned_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("governor: recording an enforcement event failed", exc_info=error)
        if self._settled is not None and not self._calls and not self._tasks:
            self._settled.set()


__all__ = ["Recording", "SETTLE_SEC"]
