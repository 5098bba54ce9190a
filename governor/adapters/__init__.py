"""Wire adapters and their selection.

Each protocol module defines `ADAPTERS`, a tuple of Adapter classes; this module
loads the known modules (skipping any not written yet), then picks the adapter
for a request, on its normalized path (shapes.normalize_path, case folded):

1. the configured route mapping (host/path pattern -> adapter name);
2. the adapters that claim model endpoints by path (OpenAI, Anthropic): a POST is
   theirs; any other method with a body, or a PUT/PATCH, is refused (405), never
   forwarded ungoverned; a bodiless read (GET, HEAD, OPTIONS, DELETE) is not a model call;
3. a body shaped like a model call (shapes.model_shaped) on a path no adapter claims:
   refused (403); the free endpoints (moderation, token counting) are governed by their own
   adapters (governor.adapters.free_calls), claimed by path like the model endpoints;
4. the adapters that match by body (MCP, A2A: JSON-RPC), in order;
5. what none of these governs: IGNORE when the operator's allow-list (governor.adapters.allow,
   and the `routes` entries whose adapter is "ignore") names it, else None (unknown traffic,
   refused by default). An allow-list entry never lets through what steps 2-4 govern or refuse.

The rule is documented in docs/wire-protocols.md.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from governor.adapters import shapes
from governor.adapters.allow import AllowEntry
from governor.adapters.base import Adapter, AdapterConfig
from governor.adapters.deferred import DeferredWork
from governor.adapters.request_view import RequestView

# In match order: the LLM adapters decide on the path alone, so they go first and
# the JSON-RPC ones (which look at the body) only see what is left.
ADAPTER_MODULES = (
    "governor.adapters.openai",
    "governor.adapters.anthropic",
    "governor.adapters.ollama",  # after openai: Ollama's /api/embeddings is excluded there
    "governor.adapters.tgi",  # after ollama: /api/generate is Ollama's, not TGI's /generate
    "governor.adapters.openai_media",
    "governor.adapters.free_calls",
    "governor.adapters.openai_async",  # batches, files, runs, fine-tuning, vector stores, reads
    "governor.adapters.anthropic_batches",
    "governor.adapters.gemini",
    "governor.adapters.bedrock",
    "governor.adapters.realtime",
    "governor.adapters.mcp",
    "governor.adapters.a2a",
    "governor.adapters.compatible",  # no adapter: the endpoint rows of OpenAI-compatible servers
)

IGNORE = "ignore"

# Bodiless requests with these methods to a model endpoint read or delete what is stored
# there (GET /v1/chat/completions lists stored completions): not model calls.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


@dataclass(frozen=True, slots=True)
class Refusal:
    """Selection's verdict on a request that must not be forwarded: answered with `status`
    and `message`, in `adapter`'s error format when one claims the path."""

    status: int
    message: str
    adapter: Adapter | None = None


@lru_cache(maxsize=256)
def _glob(pattern: str, separator: str) -> re.Pattern[str]:
    """Core §4.4 glob: `*` stays within one segment, `**` spans segments (paths only)."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i) and separator == "/":
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append(f"[^{re.escape(separator)}]*")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    # paths too are matched without regard to case: they are compared normalized and folded
    return re.compile("".join(out), re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Route:
    """An exception to matching: requests to `host` (glob, `*` within a label) whose
    path matches `path` (glob, `*` within a segment, `**` across) go to `adapter`
    (a registered name); adapter == "ignore" makes the route an allow-list entry
    (governor.adapters.allow): what no adapter governs there passes unrecorded."""

    host: str
    path: str
    adapter: str

    def matches(self, host: str, route: str) -> bool:
        """`route`: the request's normalized path (RequestView.match_route)."""
        return bool(_glob(self.host, ".").fullmatch(host) and _glob(self.path, "/").fullmatch(route))

    @classmethod
    def parse(cls, value: dict) -> "Route":
        """From a config mapping entry {host, path, adapter}; host/path default to '*' / '/**'."""
        try:
            adapter = value["adapter"]
        except (KeyError, TypeError):
            raise ValueError(f"route {value!r} names no adapter") from None
        host = value.get("host", "*")
        path = value.get("path", "/**")
        if not all(isinstance(v, str) and v for v in (host, path, adapter)):
            raise ValueError(f"route {value!r}: host, path and adapter must be non-empty strings")
        if "**" in host:
            raise ValueError(f"route {value!r}: '**' is not allowed in a host pattern")
        return cls(host, path, adapter)


def available_adapter_classes() -> list[type[Adapter]]:
    classes: list[type[Adapter]] = []
    for name in ADAPTER_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that protocol has no adapter yet
                continue
            raise
        classes.extend(getattr(module, "ADAPTERS", ()))
    return classes


class AdapterRegistry:
    """Selects the adapter for a request. Built once at start-up."""

    def __init__(self, adapters: Sequence[Adapter], routes: Iterable[Route] = (),
                 allow: Iterable[AllowEntry] = ()) -> None:
        self.adapters = list(adapters)
        self.allow = list(allow)  # the operator's allow-list: what no adapter governs, let through
        self.by_name = {a.name: a for a in self.adapters}
        # adapters that claim model endpoints by path, and those that match by body
        self.path_adapters = [a for a in self.adapters if type(a).claims is not Adapter.claims]
        self.body_adapters = [a for a in self.adapters if type(a).claims is Adapter.claims]
        self.routes = self._checked(routes)

    def _checked(self, routes: Iterable[Route]) -> list[Route]:
        checked = list(routes)
        for route in checked:
            if route.adapter != IGNORE and route.adapter not in self.by_name:
                raise ValueError(
                    f"route {route.host}{route.path} names unknown adapter {route.adapter!r} "
                    f"(known: {', '.join(sorted(self.by_name)) or 'none'}, or 'ignore')"
                )
        return checked

    def reconfigure(self, routes: Iterable[Route], allow: Iterable[AllowEntry]) -> None:
        """New routes and allow-list (a reload, SIGHUP), from the next selection on; both are
        checked before either changes (ValueError: nothing changed)."""
        checked, entries = self._checked(routes), list(allow)
        self.routes, self.allow = checked, entries

    @classmethod
    def default(cls, config: AdapterConfig | None = None, routes: Iterable[Route] = (),
                allow: Iterable[AllowEntry] = ()) -> "AdapterRegistry":
        config = config or AdapterConfig()
        memory = DeferredWork()  # one for the registry: what one adapter charged, another settles
        return cls([klass(config, memory) if klass.remembers else klass(config)  # type: ignore[call-arg]
                    for klass in available_adapter_classes()], routes, allow)

    def routed(self, request: RequestView) -> Adapter | str | None:
        """What the route mapping says of this request: an adapter, IGNORE (an allow-list
        entry: it applies only to what no adapter governs), or None."""
        route_path = request.match_route
        for route in self.routes:
            if route.matches(request.host, route_path):
                return IGNORE if route.adapter == IGNORE else self.by_name[route.adapter]
        return None

    def claimant(self, request: RequestView) -> Adapter | None:
        """The adapter whose model endpoint the path is (whatever the method), if any."""
        route = request.match_route
        for adapter in self.path_adapters:
            if adapter.claims(route):
                return adapter
        return None

    def allowed(self, request: RequestView, routed: Adapter | str | None = None) -> str | None:
        """IGNORE when the allow-list (or an `ignore` route) names this request, else None:
        asked only of what no adapter governs."""
        if routed == IGNORE:
            return IGNORE
        if self.allow:
            method, host, route = request.method, request.host, request.match_route
            for entry in self.allow:
                if entry.matches(method, host, route):
                    return IGNORE
        return None

    def select(self, request: RequestView) -> Adapter | Refusal | str | None:
        """The adapter for this request, a Refusal, IGNORE (nothing governs it and the
        allow-list names it), or None (unknown traffic)."""
        target = None
        if self.routes:
            target = self.routed(request)
            if target is not None and target != IGNORE:
                return target
        route = request.match_route
        for adapter in self.path_adapters:
            if adapter.claims(route):
                if adapter.match(request):
                    return adapter
                if request.method in READ_METHODS and not request.content:
                    return self.allowed(request, target)
                return Refusal(405, f"{request.method} {request.normal_route} is a model endpoint; the governor "
                                    "governs model calls sent with POST and refuses other methods there (a body, "
                                    "or PUT/PATCH) rather than forward them ungoverned", adapter)
        matched = None
        for adapter in self.body_adapters:
            if adapter.match(request):
                matched = adapter
                break
        # after them, as they parse the body anyway; but before their verdict counts: MCP also
        # matches on a session header alone, whatever the body
        if request.content and self._model_shaped(request):
            return Refusal(403, f"{request.method} {request.host}{request.normal_route} carries a model call "
                                "(a JSON body with 'model' and 'messages', 'prompt' or 'input') to a path no "
                                "adapter governs; it is refused, not forwarded ungoverned (a 'routes' entry can "
                                "name the adapter that governs this path)")
        if matched is not None:
            return matched
        allowed = self.allowed(request, target)
        if allowed is not None and request.content \
                and shapes.model_shaped(request.content.lower()):
            # a server that folds the case of keys (Go's encoding/json) reads {"Model":…,"Messages":…}
            # as a model call: on a path the allow-list lets through, the sniff folds case too
            return Refusal(403, f"{request.method} {request.host}{request.normal_route} carries a model call (JSON "
                                "keys 'model' and 'messages', 'prompt' or 'input' in some letter case, which "
                                "servers that fold case read) to a path the allow-list lets through ungoverned; "
                                "it is refused (a 'routes' entry can name the adapter that governs this path)")
        return allowed

    @staticmethod
    def _model_shaped(request: RequestView) -> bool:
        """The sniff: the parse a body adapter already made, if any (a few key lookups);
        else a byte search first (most bodies end there), then the parse; the lenient
        parsers (shapes.model_shaped) only when the strict one failed."""
        content = request.content
        if not request.parsed and not shapes.may_be_model_shaped(content):
            return False
        parsed = request.json_or_none()
        if parsed is not None:
            return shapes.shape_of(parsed)
        return request.unparseable and shapes.model_shaped(content)


__all__ = ["AdapterRegistry", "AllowEntry", "Route", "Refusal", "IGNORE", "READ_METHODS", "ADAPTER_MODULES",
           "available_adapter_classes"]
