"""Who a session acts as, bound by the principal that opens it (issue #32 item 6), not read
from the agent's headers: the persona (and instance) it runs as, and its lineage, the chain of
(session id, passport digest) from the root of its delegation chain to its parent.

A principal binds them when it opens the session (`POST /v1/sessions` with `persona`,
`instance`, `parent`, or `delegation`; `governor sessions open --persona --parent
--delegation`). `parent` names a session of this governor; `delegation` is a token this
governor (or one with the same key and id) issued for a parent session
(`POST /v1/sessions/{id}/delegation`): Ed25519 over the JCS of its claims, so a principal
elsewhere (the orchestrator of a delegated agent) can carry a lineage it cannot forge. The
depth of a session's delegated calls is computed from its lineage (§4.2.2: "relative to the
root of the current delegation chain"); the record names the lineage (an
`on_governor_identity` event, the session's first).

The agent's `ADL-Persona` and `ADL-Delegation-Depth` headers are honoured only when the
operator opts in (`--agent-identity headers`), which trusts the agent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Collection, Mapping

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from governor.common.canonical import b64url, b64url_decode, canonicalize

AGENT_IDENTITY_MODES = ("principal", "headers")
MAX_LINEAGE = 64  # links; a chain longer than any max_depth a passport declares in practice
DELEGATION_TTL_SEC = 3600.0
MAX_TOKEN_LENGTH = 16384
_NAME = re.compile(r"[A-Za-z0-9._:@~-]{1,128}")
_DIGEST = re.compile(r"[A-Za-z0-9_-]{43}")  # base64url SHA-256, as the record's passport_digest


class IdentityError(ValueError):
    """What a principal asked to bind cannot be bound; the message says why."""


@dataclass(frozen=True, slots=True)
class Identity:
    persona: str | None = None
    instance: str | None = None
    lineage: tuple[tuple[str, str], ...] = ()  # (session id, passport digest), root first, parent last

    @property
    def depth(self) -> int:
        """How far from the root of its delegation chain the session is (the root: 0)."""
        return len(self.lineage)

    @property
    def persona_value(self) -> str | None:
        """The persona as the proxy's persona registry reads it (`name` or `name; instance=id`)."""
        if self.persona is None:
            return None
        return self.persona if self.instance is None else f"{self.persona}; instance={self.instance}"

    def to_json(self) -> dict[str, Any]:
        return {"persona": self.persona, "instance": self.instance, "lineage": [list(link) for link in self.lineage]}

    @classmethod
    def from_json(cls, value: Any) -> Identity | None:
        if not isinstance(value, dict):
            return None
        return cls(value.get("persona"), value.get("instance"), _lineage(value.get("lineage") or []))

    def view(self) -> dict[str, Any]:
        return {"persona": self.persona, "instance": self.instance, "depth": self.depth,
                "lineage": [{"session": s, "passport_digest": d} for s, d in self.lineage]}

    def child_lineage(self, session: str, digest: str) -> tuple[tuple[str, str], ...]:
        return (*self.lineage, (session, digest))


def _lineage(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or len(value) > MAX_LINEAGE:
        raise IdentityError(f"a lineage is a list of at most {MAX_LINEAGE} [session, passport digest] links")
    links = []
    for link in value:
        if (not isinstance(link, (list, tuple)) or len(link) != 2 or not all(isinstance(x, str) for x in link)
                or not _NAME.fullmatch(link[0]) or not _DIGEST.fullmatch(link[1])):
            raise IdentityError(f"a lineage link is [session id, base64url SHA-256 passport digest], not {link!r}")
        links.append((link[0], link[1]))
    return tuple(links)


def bind(body: Mapping[str, Any], *, personas: Collection[str], parent_of: Any, digest: str,
         verify_delegation: Any, max_depth: int | None) -> Identity | None:
    """The identity a principal's request to open a session binds, or None (it binds none).
    `parent_of(session)` gives a parent session's Identity (IdentityError when it cannot be a
    parent); `verify_delegation(token)` the lineage a delegation token carries."""
    persona, instance = body.get("persona"), body.get("instance")
    if persona is not None:
        if not isinstance(persona, str) or persona not in personas:
            declared = ", ".join(sorted(personas)) or "none"
            raise IdentityError(f"persona {persona!r} is not declared by the passport (declared: {declared})")
    if instance is not None:
        if persona is None:
            raise IdentityError("an instance needs its persona")
        if not isinstance(instance, str) or not _NAME.fullmatch(instance):
            raise IdentityError("instance must be 1-128 characters of letters, digits and . _ : @ ~ -")
    parent, token = body.get("parent"), body.get("delegation")
    if parent is not None and token is not None:
        raise IdentityError("give a parent session or a delegation token, not both")
    lineage: tuple[tuple[str, str], ...] = ()
    if parent is not None:
        if not isinstance(parent, str):
            raise IdentityError("parent must be a session id")
        lineage = parent_of(parent).child_lineage(parent, digest)
    elif token is not None:
        if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH:
            raise IdentityError("delegation must be a token issued by POST /v1/sessions/{id}/delegation")
        lineage = verify_delegation(token)
    if max_depth is not None and len(lineage) > max_depth:
        raise IdentityError(f"the delegation chain is {len(lineage)} deep, past the passport's max_depth {max_depth}")
    if persona is None and not lineage:
        return None
    return Identity(persona, instance, lineage)


# --- delegation tokens ------------------------------------------------------------------------

def mint_delegation(key: Ed25519PrivateKey, issuer: str, lineage: tuple[tuple[str, str], ...], now: float,
                    ttl: float = DELEGATION_TTL_SEC) -> str:
    """A token for a child of the session whose lineage (its own link last) is `lineage`:
    `base64url(JCS(claims)).base64url(Ed25519 signature over those bytes)`."""
    claims = {"typ": "adl-delegation", "iss": issuer, "iat": math.floor(now), "exp": math.floor(now + ttl),
              "lineage": [list(link) for link in lineage]}
    payload = canonicalize(claims)
    return f"{b64url(payload)}.{b64url(key.sign(payload))}"


def verify_delegation(token: str, public_key: Ed25519PublicKey, issuer: str, now: float) -> tuple[tuple[str, str], ...]:
    """The lineage a token of this issuer carries; IdentityError when it is not one (forged,
    another issuer's, expired, malformed)."""
    head, dot, tail = token.partition(".")
    try:
        payload, signature = b64url_decode(head), b64url_decode(tail)
    except (ValueError, TypeError):
        raise IdentityError("the delegation token is not base64url") from None
    if not dot or len(signature) != 64:
        raise IdentityError("the delegation token is not PAYLOAD.SIGNATURE")
    try:
        public_key.verify(signature, payload)
    except InvalidSignature:
        raise IdentityError("the delegation token's signature does not verify with this governor's key") from None
    try:
        claims = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise IdentityError("the delegation token's claims are not JSON") from None
    if not isinstance(claims, dict) or claims.get("typ") != "adl-delegation" or claims.get("iss") != issuer:
        raise IdentityError(f"the delegation token was not issued by this governor ({issuer})")
    exp = claims.get("exp")
    if not isinstance(exp, int) or isinstance(exp, bool) or exp <= now:
        raise IdentityError("the delegation token has expired")
    return _lineage(claims.get("lineage"))
