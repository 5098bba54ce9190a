"""Wire adapters and their selection.

Each protocol module defines `ADAPTERS`, a tuple of Adapter classes; this module
loads the known modules (skipping any not written yet), then picks the adapter
for a request: first the configured route mapping (host/path pattern -> adapter
name or "ignore"), then each adapter's own `match`, in order.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from governor.adapters.base import Adapter, AdapterConfig, RequestView

# In match order: the LLM adapters decide on the path alone, so they go first and
# the JSON-RPC ones (which look at the body) only see what is left.
ADAPTER_MODULES = (
    "governor.adapters.openai",
    "governor.adapters.anthropic",
    "governor.adapters.mcp",
    "governor.adapters.a2a",
)

IGNORE = "ignore"


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
    return re.compile("".join(out), re.IGNORECASE if separator == "." else 0)


@dataclass(frozen=True, slots=True)
class Route:
    """An exception to matching: requests to `host` (glob, `*` within a label) whose
    path matches `path` (glob, `*` within a segment, `**` across) go to `adapter`
    (a registered name) or are passed through unrecorded when adapter == "ignore"."""

    host: str
    path: str
    adapter: str

    def matches(self, host: str, route: str) -> bool:
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

    def __init__(self, adapters: Sequence[Adapter], routes: Iterable[Route] = ()) -> None:
        self.adapters = list(adapters)
        self.by_name = {a.name: a for a in self.adapters}
        self.routes = list(routes)
        for route in self.routes:
            if route.adapter != IGNORE and route.adapter not in self.by_name:
                raise ValueError(
                    f"route {route.host}{route.path} names unknown adapter {route.adapter!r} "
                    f"(known: {', '.join(sorted(self.by_name)) or 'none'}, or 'ignore')"
                )

    @classmethod
    def default(cls, config: AdapterConfig | None = None, routes: Iterable[Route] = ()) -> "AdapterRegistry":
        config = config or AdapterConfig()
        return cls([klass(config) for klass in available_adapter_classes()], routes)

    def select(self, request: RequestView) -> Adapter | str | None:
        """The adapter for this request, IGNORE, or None (unknown traffic)."""
        if self.routes:
            route_path = request.route
            for route in self.routes:
                if route.matches(request.host, route_path):
                    return IGNORE if route.adapter == IGNORE else self.by_name[route.adapter]
        for adapter in self.adapters:
            if adapter.match(request):
                return adapter
        return None


__all__ = ["AdapterRegistry", "Route", "IGNORE", "ADAPTER_MODULES", "available_adapter_classes"]
