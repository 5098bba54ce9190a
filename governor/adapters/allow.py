"""The operator's allow-list: destinations that spend nothing (a package index, an internal
API), let through although no adapter governs them.

An entry names a host (glob: `*` within one label), a path (glob: `*` within one segment,
`**` across; default `/**`) and optionally methods. It applies only to what no adapter
governs: selection (governor.adapters.AdapterRegistry.select) governs model endpoints and
JSON-RPC bodies and refuses model-shaped bodies first, so an entry can never let a model
call, an MCP `tools/call` or an A2A message through ungoverned. Everything else no entry
names is refused (default deny, `unknown_traffic: deny`).

In the config file (`allow:`), a list of mappings or strings; on the command line
(`--allow`, repeatable) and in `GOVERNOR_ALLOW` (comma-separated), strings:

    pypi.org                       any method, any path
    files.pythonhosted.org/**      the same, spelled out
    GET,HEAD api.internal/status/* those methods, that path
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from governor.policy.patterns import Pattern, PatternError, compile_host, compile_path

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One allowed destination: `host` and `path` as written, `methods` (upper case) or
    None for any."""

    host: str
    path: str = "/**"
    methods: frozenset[str] | None = None
    _host: Pattern | None = field(default=None, init=False, repr=False, compare=False)
    _path: Pattern | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            host = compile_host(self.host)
            # paths are matched normalized and folded (RequestView.match_route), like routes
            path = compile_path(self.path.lower())
        except PatternError as exc:
            raise ValueError(f"allow entry {self.describe()}: {exc}") from None
        if not self.path.startswith("/"):
            raise ValueError(f"allow entry {self.describe()}: the path must start with '/'")
        if self.methods is not None and not self.methods <= HTTP_METHODS:
            unknown = ", ".join(sorted(self.methods - HTTP_METHODS))
            raise ValueError(f"allow entry {self.describe()}: unknown method {unknown}")
        object.__setattr__(self, "_host", host)
        object.__setattr__(self, "_path", path)

    def matches(self, method: str, host: str, route: str) -> bool:
        """`route`: the request's normalized, lower-case path (RequestView.match_route)."""
        if self.methods is not None and method not in self.methods:
            return False
        assert self._host is not None and self._path is not None
        return self._host.matches(host) and self._path.matches(route or "/")

    def describe(self) -> str:
        methods = ",".join(sorted(self.methods)) + " " if self.methods else ""
        return f"{methods}{self.host}{'' if self.path == '/**' else self.path}"

    @classmethod
    def parse(cls, value: Any) -> "AllowEntry":
        """From a config mapping {host, path, methods} or a string `[METHODS ]host[/path]`."""
        if isinstance(value, str):
            return cls._from_text(value)
        if not isinstance(value, dict) or "host" not in value:
            raise ValueError(f"allow entry {value!r}: expected a string or a mapping with a host")
        unknown = set(value) - {"host", "path", "methods"}
        if unknown:
            raise ValueError(f"allow entry {value!r}: unknown keys {', '.join(sorted(map(str, unknown)))}")
        host, path, methods = value["host"], value.get("path", "/**"), value.get("methods")
        if not isinstance(host, str) or not host or not isinstance(path, str) or not path:
            raise ValueError(f"allow entry {value!r}: host and path must be non-empty strings")
        if methods is not None:
            if isinstance(methods, str):
                methods = methods.split(",")
            if not isinstance(methods, list) or not methods or not all(isinstance(m, str) and m for m in methods):
                raise ValueError(f"allow entry {value!r}: methods must be a list of HTTP methods")
            methods = frozenset(m.strip().upper() for m in methods)
        return cls(host.strip(), path.strip(), methods)

    @classmethod
    def _from_text(cls, text: str) -> "AllowEntry":
        words = text.split()
        if not words or len(words) > 2:
            raise ValueError(f"allow entry {text!r}: expected [METHODS ]HOST[/PATH]")
        methods = frozenset(m.strip().upper() for m in words[0].split(",") if m.strip()) if len(words) == 2 else None
        target = words[-1]
        if "://" in target:
            raise ValueError(f"allow entry {text!r}: a host and path, not a URL (no scheme)")
        host, slash, path = target.partition("/")
        if not host:
            raise ValueError(f"allow entry {text!r}: no host")
        return cls(host, "/" + path if slash and path else "/**", methods or None)


__all__ = ["AllowEntry", "HTTP_METHODS"]
