"""How the proxy's addons ask the runtime: a step admitted (a pause held until its reviewer
answers), a ticket released; and the tasks they start (`Tasks`), which a stop cancels.

`RuntimeCalls` is how the addons admit a step with its review and release a ticket; usage
reports and refusals' records go to the runtime itself (its `runtime`,
governor.runtime.api.RuntimeAPI).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from governor.policy.steps import Action, Step
from governor.proxy import holds, recording
from governor.runtime.api import Admission, RuntimeAPI

log = logging.getLogger("governor.proxy")


def paused(admission: Admission) -> bool:
    decision = admission.decision
    return decision.action is Action.PAUSE and decision.enforced and decision.approval is not None


class Tasks:
    """The tasks the proxy starts (tickers, the watchdog, stream checks, keep-alive lines):
    cancelled at a stop, once any runtime call they are in has returned."""

    def __init__(self, recording_: recording.Recording) -> None:
        self.recording = recording_  # events recorded from tasks: a stop awaits them
        self.running: set[asyncio.Task] = set()

    def spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return task

    async def stop(self) -> None:
        for task in list(self.running):
            self.recording.cancel(task)  # a task inside a runtime call: once the call has returned
        await self.recording.settle()


class RuntimeCalls:
    """Steps admitted and tickets released, for every addon of the proxy."""

    def __init__(self, runtime: RuntimeAPI, tasks: Tasks) -> None:
        self.runtime = runtime
        self.tasks = tasks

    async def admit(self, session: str, step: Step) -> Admission:
        """Admit one step; a PAUSE is held right here until the reviewer's answer (or the
        timeout's resolution) comes back."""
        admission = await self.runtime.admit(session, step)
        if paused(admission):
            admission = await self.reviewed(session, step, admission)
        return admission

    async def reviewed(self, session: str, step: Step, admission: Admission, relay: Any = None) -> Admission:
        """A paused step held until the reviewer's answer (or the timeout's resolution); a
        held stream is kept alive meanwhile."""
        approval = admission.decision.approval
        assert approval is not None
        log.info("governor: holding %s in session %s for approval %s", type(step).__name__, session, approval.id)
        pinger = None
        if relay is not None:
            pinger = self.tasks.spawn(holds.keep_alive(relay, holds.keepalive_interval(relay.flow.request.headers)))
        try:
            answered = await self.runtime.await_approval(session, approval.id)
        finally:
            if pinger is not None:
                pinger.cancel()
        if admission.ticket is not None and admission.ticket is not answered.ticket:
            await self.release(session, admission.ticket)
        return answered

    async def release(self, session: str, ticket: Any, error: str | None = None) -> None:
        if ticket is None:
            return
        try:
            await self.runtime.finish(session, ticket, error=error)
        except Exception:
            log.exception("governor: runtime.finish failed in session %s", session)
