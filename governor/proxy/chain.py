"""The enforcement point as mitmproxy addons, in the order mitmproxy calls them.

`assemble` makes the collaborators (the refuser, the runtime calls, the enforcer, the
holds) and gives each addon what it needs in its constructor. The addons share per-flow
state only through the flow's `FlowState` (governor.proxy.flow_state); none imports
another. A hook reaches every addon that defines it, in this order, whatever an earlier
one did to the flow, so each looks at the flow's state (and `flow.response`) first:

  OriginGuard      server connections reported to the control plane's origin (with one)
  SessionBinding   request: the session, ADL-* headers stripped; the FlowState put on
  Admission        request: adapter, passport, steps admitted (holds); the Flight put on
  UnknownTraffic   request: what no adapter claims: allowed by the operator, else refused
                   (default deny) or forwarded (counted); tcp_start: a raw stream, likewise
  Answers          responseheaders / response / error: the answer and the stream relay
  RealtimeSockets  response (a governed 101) / websocket_message / websocket_end: a Realtime
                   WebSocket governed event by event
  InFlight         request: tracked; response / error: the exchange ends; ticks, timeouts

The `Chain` is added to the master as one addon, and it calls its members' hooks itself, in
this order (governor.proxy.dispatch: one callable per event, resolved at construction), after
the connection guard's (governor.proxy.connections, when given: it keeps its own error guard).
One top-level addon, because mitmproxy wraps each top-level addon's call of every event in its
error guard: six of them cost ~70 us of dispatch per request, nested ~13 us (measured with
mitmproxy's AddonManager, four lifecycle events and their updates); and no `addons` attribute,
because mitmproxy walks sub-addons anew on every event (bench/FINDINGS.md). The guard being the
chain's, an exception ends the event for the addons after the one that raised: so every
hook that an addon after it depends on catches, logs and fails closed (and a cancelled
answers' hook ends its exchange itself, through the shared `Exchanges`).
"""

from __future__ import annotations

from typing import Any, Callable

from governor.adapters import AdapterRegistry
from governor.proxy import holds, recording
from governor.proxy.admission import Admission
from governor.proxy.lineage import Lineage
from governor.proxy.answers import Answers
from governor.proxy.binding import SessionBinding
from governor.proxy.dispatch import dispatcher, hook_table
from governor.proxy.drain import Drain
from governor.proxy.egress import EgressHosts
from governor.proxy.enforcing import Enforcer
from governor.proxy.exchanges import Exchanges
from governor.proxy.held_steps import HeldSteps
from governor.proxy.in_flight import InFlight
from governor.proxy.origin_guard import OriginGuard
from governor.proxy.policy import ProxyPolicy
from governor.proxy.realtime_sockets import RealtimeSockets
from governor.proxy.refusing import Refuser
from governor.proxy.runtime_calls import RuntimeCalls, Tasks
from governor.proxy.unknown import UnknownTraffic
from governor.runtime.api import RuntimeAPI


class Chain:
    """The governor's addons (`members`, whose hooks the chain calls in this order) and what
    a running proxy, its tests and its benchmarks look at: the registry, the holds, the
    recordings, the traffic no adapter claimed, the policy."""

    name = "governor"  # in the master's addon lookup

    def __init__(self, addons: list[Any], registry: AdapterRegistry, holds_: holds.Holds,
                 recording_: recording.Recording, unknown: UnknownTraffic, policy: ProxyPolicy,
                 drain: Drain | None = None, guard: Any = None) -> None:
        self.members = addons
        # mitmproxy finds each event's hook as an attribute: one dispatcher per event a member
        # (or the connection guard, isolated) handles, resolved once
        for event, found in hook_table(addons, () if guard is None else (guard,)).items():
            setattr(self, event, dispatcher(event, found))
        self.drain = drain  # a graceful stop: new requests refused, those in flight finished or cut
        self.registry = registry
        self.holds = holds_
        self.recording = recording_  # events recorded from tasks: a stop awaits them
        self.unknown_seen = unknown.unknown_seen  # host -> requests forwarded ungoverned
        self.allowed_seen = unknown.allowed_seen  # host -> requests the allow-list let through
        self._policy = policy

    @property
    def policy(self) -> ProxyPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: ProxyPolicy) -> None:
        """Every addon reads the new policy from its next hook on (tests change it live)."""
        self._policy = policy
        for addon in self.members:
            if hasattr(addon, "policy"):
                addon.policy = policy

    def hooks(self, name: str) -> list[Callable[..., Any]]:
        """The addons' `name` hooks in the order mitmproxy calls them, for drivers without a
        master (tests, benchmarks)."""
        return [hook for addon in self.members if (hook := getattr(addon, name, None)) is not None]


def assemble(runtime: RuntimeAPI, registry: AdapterRegistry, policy: ProxyPolicy, *, metrics: Any = None,
                origin: Any = None, sessions: Any = None, proxyserver: Any = None,
                egress: EgressHosts | None = None, guard: Any = None, tracing: Any = None) -> Chain:
    """The addons over `runtime`: `sessions` the session book (governor.sessions.book.SessionBook),
    `origin` the control plane's (governor.control.origin.ProxyOrigin), `proxyserver` this
    master's Proxyserver addon (transit works on its connections; None without a master),
    `egress` the passport's allowed_hosts (None: it declares none), `guard` the master's
    ConnectionGuard (what a drain waits for; None: the governed exchanges only), `tracing` the
    governor's OpenTelemetry traces (governor.proxy.tracing; None: no span, no cost)."""
    recorded = recording.Recording()  # events recorded from tasks: a stop awaits them
    traced = runtime if tracing is None else tracing.traced(runtime, lambda: passport_digest(runtime))
    calls = RuntimeCalls(traced, Tasks(recorded))
    refuser = Refuser(runtime, metrics)
    enforcer = Enforcer(refuser, runtime, recorded, metrics=metrics, proxyserver=proxyserver)
    held = holds.Holds(policy.review_hold, policy.review_retry_after,  # steps held for a reviewer
                       on_count=metrics.review_hold if metrics is not None else None)
    held_steps = HeldSteps(calls, held, refuser)
    exchanges = Exchanges(calls)  # in flight: tracked by InFlight, ended by it (or by Answers, cancelled)
    unknown = UnknownTraffic(runtime, policy, refuser, egress)
    drain = Drain(exchanges, enforcer, guard=guard, holds=held)
    addons: list[Any] = [] if origin is None else [OriginGuard(origin)]
    addons += [
        SessionBinding(runtime, registry, policy, refuser, sessions=sessions, origin=origin, metrics=metrics,
                       egress=egress, drain=drain),
        Admission(registry, policy, calls, held_steps, held, refuser, Lineage(runtime, sessions)),
        unknown,
        Answers(policy, calls, held_steps, held, refuser, enforcer, exchanges, metrics=metrics),
        RealtimeSockets(policy, calls, refuser, proxyserver=proxyserver, metrics=metrics),  # before InFlight ends the upgrade
        InFlight(policy, calls, enforcer, exchanges, metrics=metrics),
    ]
    if tracing is not None:  # the flow's span: current before the first addon, ended after the last
        addons = [tracing.opening, *addons, tracing.closing]
    return Chain(addons, registry, held, recorded, unknown, policy, drain, guard=guard)


def passport_digest(runtime: Any) -> str | None:
    """The pinned passport's digest: the policy version a trace's decisions name."""
    pinned = getattr(runtime, "pinned", None)
    return getattr(pinned, "digest", None)
