"""Runtime §1.3: the admitted passport, pinned to its exact canonical bytes.

The passport digest is base64url(SHA-256(JCS(whole admitted document, signature
included))): the spec leaves its format open; this is the same encoding as the
record's `prev_hash`, and including the signature makes a re-signed passport
(same limits, new signature) a different pin, as §1.3 asks.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from governor.common.canonical import canonicalize, sha256_b64url
from governor.passport.errors import PassportError
from governor.passport.loader import first_non_json_value, parse_passport


def passport_digest(document: Mapping[str, Any]) -> str:
    """The pin: base64url(SHA-256(JCS(document))), signature included."""
    return sha256_b64url(canonicalize(thaw(document)))


def deep_freeze(value: Any) -> Any:
    """Read-only view of a JSON value: objects become MappingProxyType, arrays tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: deep_freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(deep_freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy (dicts and lists) of a JSON value, frozen or not."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(item) for item in value]
    return value


class PinnedPassport:
    """An admitted passport, immutable: the governor's enforcement contract for a session.

    The governed members (§2-§7) are read through properties that return frozen
    views (None when the passport does not declare the member). A passport
    presented mid-session is compared by canonical bytes (`check_presented`); a
    mismatch is the §1.3 session-integrity fault, cause
    `governor.policy.steps.ON_SESSION_INTEGRITY`, which the policy engine resolves.
    """

    __slots__ = ("_frozen", "canonical_bytes", "digest")
    _frozen: Mapping[str, Any]
    canonical_bytes: bytes
    digest: str

    def __init__(self, document: Mapping[str, Any]) -> None:
        plain = thaw(document)
        problem = first_non_json_value(plain)
        if problem:
            raise PassportError(f"cannot pin a passport that is not plain JSON: {problem}")
        canonical = canonicalize(plain)
        object.__setattr__(self, "canonical_bytes", canonical)
        object.__setattr__(self, "digest", sha256_b64url(canonical))
        object.__setattr__(self, "_frozen", deep_freeze(plain))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a pinned passport is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("a pinned passport is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PinnedPassport) and other.canonical_bytes == self.canonical_bytes

    def __hash__(self) -> int:
        return hash(self.canonical_bytes)

    def __repr__(self) -> str:
        return f"PinnedPassport(id={self.id!r}, version={self.version!r}, digest={self.digest!r})"

    # --- the whole document --------------------------------------------------------

    @property
    def frozen(self) -> Mapping[str, Any]:
        """The whole document as a read-only view (no copy)."""
        return self._frozen

    @property
    def document(self) -> dict[str, Any]:
        """A plain JSON-able deep copy, safe to hand to code that mutates."""
        return thaw(self._frozen)

    # --- anti-swap (§1.3) ------------------------------------------------------------

    def check_presented(self, presented: Mapping[str, Any] | bytes | str) -> bool:
        """True when `presented` (a document, or its JSON/YAML bytes) is this exact passport.

        Compared by canonical bytes, so formatting (JSON vs YAML, key order,
        whitespace) does not matter and any change of value, signature included, does.
        Bytes that do not parse as a passport do not match.
        """
        if isinstance(presented, (bytes, str)):
            try:
                presented = parse_passport(presented)
            except PassportError:
                return False
        plain = thaw(presented)
        if first_non_json_value(plain):
            return False
        return canonicalize(plain) == self.canonical_bytes

    def matches_digest(self, digest: str) -> bool:
        """True when `digest` (e.g. a PassportPresented step's) is this passport's pin."""
        return digest == self.digest

    # --- identity ------------------------------------------------------------------------

    @property
    def id(self) -> str | None:
        return self._frozen.get("id")

    @property
    def name(self) -> str:
        return self._frozen["name"]

    @property
    def version(self) -> str:
        return self._frozen["version"]

    # --- governed members (Runtime §2-§7) ------------------------------------------------

    @property
    def resource_limits(self) -> Mapping[str, Any] | None:
        """permissions.resource_limits (Core §9.6): max_concurrent, max_duration_sec, budget."""
        return self._member("permissions", "resource_limits")

    @property
    def budget(self) -> Mapping[str, Any] | None:
        """permissions.resource_limits.budget: {tokens, cost_usd, wall_clock_sec} x {per_session, per_day}."""
        return self._member("permissions", "resource_limits", "budget")

    @property
    def sub_agents(self) -> tuple[Mapping[str, Any], ...] | None:
        """permissions.sub_agents (Core §9.7.1)."""
        return self._member("permissions", "sub_agents")

    @property
    def delegation(self) -> Mapping[str, Any] | None:
        """permissions.delegation (Core §9.7.2)."""
        return self._member("permissions", "delegation")

    @property
    def tools(self) -> tuple[Mapping[str, Any], ...] | None:
        """tools[] (Core §8.1)."""
        return self._member("tools")

    @property
    def tool_invocation(self) -> Mapping[str, Any] | None:
        """runtime.tool_invocation (Core §11.3)."""
        return self._member("runtime", "tool_invocation")

    @property
    def error_handling(self) -> Mapping[str, Any] | None:
        """runtime.error_handling (Core §11.4)."""
        return self._member("runtime", "error_handling")

    @property
    def degradation(self) -> Mapping[str, Any] | None:
        """runtime.degradation (Core §11.5): cause -> response."""
        return self._member("runtime", "degradation")

    @property
    def human_oversight(self) -> Mapping[str, Any] | None:
        """human_oversight (governance profile; Runtime §5)."""
        return self._member("human_oversight")

    @property
    def anomaly_baseline(self) -> Mapping[str, Any] | None:
        """anomaly_baseline (governance profile; Runtime §7)."""
        return self._member("anomaly_baseline")

    @property
    def data_classification(self) -> Mapping[str, Any]:
        """data_classification (required): sensitivity and categories."""
        return self._frozen["data_classification"]

    def _member(self, *path: str) -> Any:
        value: Any = self._frozen
        for name in path:
            if not isinstance(value, Mapping) or name not in value:
                return None
            value = value[name]
        return value
