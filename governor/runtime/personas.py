"""Persona instances on the wire (Runtime §4.1): what `max_parallel` and a persona's
wall-clock share count.

A request names a persona with the `ADL-Persona` header, optionally with an instance:

    ADL-Persona: reviewer                  the session's one implicit instance of reviewer
    ADL-Persona: reviewer; instance=r-17   instance r-17 of reviewer in this session

An instance lives from the first governed request that names it until it is ended
through the control plane or has been idle (no request of it in flight, none begun)
for `idle_sec`; its session's end ends it too. The first request of an instance that
is not alive admits a PersonaSpawn (the decision point checks the declared persona,
max_parallel, the parent's max_concurrent; recorded either way); its end admits a
PersonaExit (recorded), which frees the slot. While an instance lives, the persona's
wall-clock meters are charged by the runtime's Ticks, and a Tick is settled just
before every spawn and end so the persona is charged from its first step to its end.

The registry lives beside the runtime (one per governor process): a request of a live
instance costs a dict lookup; spawns and ends take the session's decision round.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from governor.policy.steps import PERMIT, Action, Decision, PersonaExit, PersonaSpawn, Tick
from governor.runtime.api import Admission

log = logging.getLogger("governor.personas")

MAX_PERSONA_LENGTH = 128
MAX_INSTANCE_LENGTH = 128
_INSTANCE = re.compile(r"[A-Za-z0-9._:@~-]+")
DEFAULT_IDLE_SEC = 60.0
# Live instances one session may hold, whatever the passport declares: an agent inventing
# instance ids cannot grow the governor's memory (or its record) without bound.
MAX_INSTANCES_PER_SESSION = 1024


class PersonaHeaderError(ValueError):
    """An ADL-Persona value the governor cannot read; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class PersonaActivity:
    """A governed request names a persona (instance): the runtime resolves it to the live
    instance or a PersonaSpawn. Not a decision-point step: the registry handles it."""

    persona: str
    instance: str | None = None
    # the session whose state counts the instance (its spawn and end, against max_parallel):
    # the parent session its principal bound (governor.sessions.identity); None: its own
    host: str | None = None


def parse_persona(value: str) -> PersonaActivity:
    """`name` or `name; instance=id` -> PersonaActivity; PersonaHeaderError when malformed.

    The name is the persona's declared name (printable, no `;` or `,`: a repeated header
    is folded with `, ` and is refused); the instance id is 1-128 of [A-Za-z0-9._:@~-]."""
    name, _, rest = value.partition(";")
    name = name.strip(" \t")
    if not name:
        raise PersonaHeaderError("ADL-Persona names no persona")
    if "," in name:
        raise PersonaHeaderError("ADL-Persona appears more than once or names several personas; send one")
    if len(name) > MAX_PERSONA_LENGTH:
        raise PersonaHeaderError(f"ADL-Persona name is longer than {MAX_PERSONA_LENGTH} characters")
    if not name.isprintable():
        raise PersonaHeaderError("ADL-Persona name contains control or undecodable characters")
    instance = None
    if rest.strip(" \t"):
        key, eq, raw = rest.partition("=")
        key, raw = key.strip(" \t").lower(), raw.strip(" \t")
        if key != "instance" or not eq:
            raise PersonaHeaderError("ADL-Persona takes one parameter, `instance=<id>`")
        if "," in raw or ";" in raw:
            raise PersonaHeaderError("ADL-Persona appears more than once or has several instance parameters; send one")
        if not raw or len(raw) > MAX_INSTANCE_LENGTH or not _INSTANCE.fullmatch(raw):
            raise PersonaHeaderError(f"ADL-Persona instance must be 1-{MAX_INSTANCE_LENGTH} characters of "
                                     "letters, digits and . _ : @ ~ -")
        instance = raw
    return PersonaActivity(name, instance)


Key = tuple[str, str, "str | None"]  # (session, persona, instance)


@dataclass(eq=False, slots=True)
class Instance:
    session: str
    persona: str
    instance: str | None
    started: float
    last_active: float
    busy: int = 0  # requests of it in flight
    host: str | None = None  # the session whose state counts it (None: its own)

    def view(self, now: float) -> dict[str, Any]:
        return {"persona": self.persona, "instance": self.instance, "lived_sec": round(now - self.started, 3),
                "idle_sec": 0.0 if self.busy else round(now - self.last_active, 3), "requests_in_flight": self.busy}


class InstanceLease:
    """The ticket of a request's persona admission: while held the instance is busy (not
    idle). Released by `Runtime.finish` as any ticket is, exactly once."""

    __slots__ = ("instance", "clock", "released")

    def __init__(self, instance: Instance, clock: Callable[[], float]) -> None:
        self.instance = instance
        self.clock = clock
        self.released = False
        instance.busy += 1

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.instance.busy -= 1
            self.instance.last_active = self.clock()


@dataclass(slots=True)
class _Spawning:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0


class PersonaInstances:
    """The live persona instances of one governor's sessions."""

    def __init__(self, runtime: Any, *, idle_sec: float = DEFAULT_IDLE_SEC,
                 clock: Callable[[], float] | None = None) -> None:
        if idle_sec <= 0:
            raise ValueError("the persona idle time must be positive")
        self.runtime = runtime  # governor.runtime.core.Runtime: admit, await_approval, finish, limits
        self.idle_sec = idle_sec
        self.clock = clock or getattr(runtime, "clock", time.time)
        self._live: dict[Key, Instance] = {}
        self._by_session: dict[str, dict[Key, Instance]] = {}  # the same instances, by session
        self._spawning: dict[Key, _Spawning] = {}
        self._changing: dict[str, int] = {}  # session -> spawns and ends under way (see reconcile)
        self._orphans = 0
        self.max_per_session = MAX_INSTANCES_PER_SESSION

    # --- the wire ----------------------------------------------------------------------

    async def enter(self, session: str, activity: PersonaActivity) -> Admission:
        """A governed request of `activity`'s instance: a lease on the live instance, or the
        PersonaSpawn's admission (its ticket a lease when it went ahead)."""
        key = (session, activity.persona, activity.instance)
        live = self._live.get(key)
        if live is not None:  # the usual case: no decision round
            live.last_active = self.clock()
            return Admission(PERMIT, session, InstanceLease(live, self.clock))
        spawning = self._spawning.get(key)
        if spawning is None:
            spawning = self._spawning[key] = _Spawning()
        spawning.waiting += 1
        try:
            async with spawning.lock:  # one spawn per new instance, however many first requests
                live = self._live.get(key)
                if live is not None:
                    live.last_active = self.clock()
                    return Admission(PERMIT, session, InstanceLease(live, self.clock))
                return await self._spawn(key, activity.host or session)
        finally:
            spawning.waiting -= 1
            if spawning.waiting == 0:
                del self._spawning[key]

    async def _spawn(self, key: Key, host: str) -> Admission:
        session, persona, instance = key
        runtime = self.runtime
        if len(self._by_session.get(session, ())) >= self.max_per_session:
            reason = (f"the session already has {self.max_per_session} live persona instances, the governor's "
                      f"limit; end some (POST /v1/sessions/{session}/personas/{persona}/end) or let them idle out")
            log.warning("session %s: persona instance %s refused: %s", session, key[1:], reason)
            return Admission(Decision(action=Action.DENY, details={"reason": reason}), session, None,
                             {"session": session, "cause": None, "action": "deny", "reason": reason,
                              "persona": persona})
        self._changing[session] = self._changing.get(session, 0) + 1
        try:
            await self._settle_clock(host)
            admission = await runtime.admit(host, PersonaSpawn(persona, instance=instance or _hosted(session, host)))
            decision = admission.decision
            if decision.action is Action.PAUSE and decision.enforced and decision.approval is not None:
                held = admission  # a declared pause on on_sub_agent_denied: the reviewer decides
                admission = await runtime.await_approval(host, decision.approval.id)
                if held.ticket is not None and held.ticket is not admission.ticket:
                    await runtime.finish(host, held.ticket)
            if admission.ticket is not None:
                await runtime.finish(host, admission.ticket)  # a spawn holds no reservation
            if admission.decision.blocks:
                return admission if host == session else Admission(admission.decision, session, None,
                                                                   admission.governor_object)
            now = self.clock()
            live = self._add(Instance(session, persona, instance, now, now, host=None if host == session else host))
            log.info("persona %s%s spawned in session %s", persona, f" ({instance})" if instance else "", session)
            return Admission(admission.decision, session, InstanceLease(live, self.clock), admission.governor_object)
        finally:
            self._done_changing(session)

    async def _settle_clock(self, session: str) -> None:
        """Charge wall-clock up to now, so a persona is charged from its spawn to its end."""
        if self.runtime.limits.clock_checked:
            admission = await self.runtime.admit(session, Tick())
            if admission.ticket is not None:
                await self.runtime.finish(session, admission.ticket)

    def _done_changing(self, session: str) -> None:
        remaining = self._changing.get(session, 1) - 1
        if remaining > 0:
            self._changing[session] = remaining
        else:
            self._changing.pop(session, None)

    # --- ends --------------------------------------------------------------------------

    async def end(self, session: str, persona: str, instance: str | None, reason: str) -> dict[str, Any]:
        """End a live instance (KeyError when there is none); its end is recorded."""
        live = self._remove((session, persona, instance))
        if live is None:
            raise KeyError((session, persona, instance))
        return await self._exit(live, reason)

    def _add(self, live: Instance) -> Instance:
        key = (live.session, live.persona, live.instance)
        self._live[key] = live
        self._by_session.setdefault(live.session, {})[key] = live
        return live

    def _remove(self, key: Key) -> Instance | None:
        live = self._live.pop(key, None)
        if live is not None:
            mine = self._by_session.get(key[0])
            if mine is not None:
                mine.pop(key, None)
                if not mine:
                    del self._by_session[key[0]]
        return live

    async def _exit(self, live: Instance, reason: str) -> dict[str, Any]:
        session = live.session
        self._changing[session] = self._changing.get(session, 0) + 1
        try:
            now = self.clock()
            view = live.view(now)
            host = live.host or session  # the session whose state counted it
            await self._settle_clock(host)
            admission = await self.runtime.admit(
                host, PersonaExit(live.persona, instance=live.instance or _hosted(session, live.host),
                                  reason=reason, lived_sec=now - live.started))
            if admission.ticket is not None:
                await self.runtime.finish(host, admission.ticket)
        finally:
            self._done_changing(session)
        log.info("persona %s%s ended in session %s (%s)", live.persona,
                 f" ({live.instance})" if live.instance else "", session, reason)
        return {"session": session, **view, "reason": reason}

    async def end_all(self, session: str, reason: str) -> None:
        """End every live instance of the session (it is ending), each end recorded."""
        for key in list(self._by_session.get(session, ())):
            live = self._remove(key)
            if live is not None:
                await self._exit(live, reason)

    def hosted(self, session: str) -> bool:
        """Whether a live instance of `session` is counted in another (its parent) session."""
        return any(i.host is not None for i in self._by_session.get(session, {}).values())

    def forget(self, session: str) -> None:
        """The session ended: its instances end with it (SessionEnd settled their wall-clock)."""
        for key in list(self._by_session.get(session, ())):
            self._remove(key)

    async def sweep(self) -> None:
        """End the instances idle for `idle_sec`; called by the runtime's sweeper."""
        now = self.clock()
        idle = [k for k, i in self._live.items() if i.busy <= 0 and now - i.last_active >= self.idle_sec]
        for key in idle:
            live = self._remove(key)
            if live is not None:
                try:
                    await self._exit(live, "idle")
                except Exception:  # one bad session must not stop the others' ends
                    log.exception("could not end persona instance %s", key)

    def reconcile(self, session: str, personas_live: dict[str, int]) -> None:
        """Slots the session's state holds that no instance here accounts for (a session
        resumed after a restart): adopted as instances of their own, ended when idle."""
        mine = self._by_session.get(session, {})
        if sum(personas_live.values()) <= len(mine) or self._changing.get(session):
            return  # all accounted for, or a spawn or end is between the decision and this registry
        counted: dict[str, int] = {}
        for _, persona, _ in mine:
            counted[persona] = counted.get(persona, 0) + 1
        now = self.clock()
        for persona, slots in personas_live.items():
            for _ in range(slots - counted.get(persona, 0)):
                self._orphans += 1
                instance = f"resumed-{self._orphans}"
                self._add(Instance(session, persona, instance, now, now))
                log.warning("session %s: persona %s held a slot no instance accounts for (a restart?); "
                            "adopted as instance %s, ended when idle", session, persona, instance)

    # --- views -------------------------------------------------------------------------

    def instances(self, session: str) -> list[dict[str, Any]]:
        now = self.clock()
        mine = self._by_session.get(session, {})
        return [mine[k].view(now) for k in sorted(mine, key=lambda k: (k[1], k[2] or ""))]


def _hosted(session: str, host: str | None) -> str | None:
    """The instance id of a child session's persona in its host's record: the child's id."""
    return session if host is not None and host != session else None


__all__ = ["DEFAULT_IDLE_SEC", "InstanceLease", "PersonaActivity", "PersonaHeaderError", "PersonaInstances",
           "parse_persona"]
