"""Single-use nonces for counterparty-seeded records (Runtime §8.5, Trust §1.2.7).

A counterparty asks for a fresh record bound to a challenge. Either the governor
draws the nonce (`issue()`), or the counterparty brings its own (`register(value)`),
which is the stronger form: a governor cannot pre-sign a record for a value it
has not seen. Either way the nonce is single-use within its time to live.

`NonceIssuer` is the door; `MemoryNonces` keeps them in this process (enough when
the record is signed by the process that issued the nonce, as with a sidecar);
`StoreNonces` keeps them in the state store, shared by replicas.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Callable, Protocol

NONCE_BYTES = 18  # 24 base64url characters
MIN_NONCE_LENGTH = 22  # a counterparty's own nonce: at least 16 bytes of base64url
MAX_NONCE_LENGTH = 256
_NONCE_CHARS = re.compile(r"[A-Za-z0-9_-]+")


class NonceError(Exception):
    """A nonce cannot be used; `code` names why, for the client."""

    code = "nonce_invalid"


class UnknownNonce(NonceError):
    code = "nonce_unknown"


class ExpiredNonce(NonceError):
    code = "nonce_expired"


class ReusedNonce(NonceError):
    code = "nonce_reused"


class MalformedNonce(NonceError):
    code = "nonce_malformed"


class TooManyNonces(NonceError):
    code = "nonce_capacity"


def check_format(value: str) -> None:
    """MalformedNonce unless `value` is a well-formed nonce (its length and alphabet)."""
    if not (MIN_NONCE_LENGTH <= len(value) <= MAX_NONCE_LENGTH) or not _NONCE_CHARS.fullmatch(value):
        raise MalformedNonce(
            f"a nonce must be {MIN_NONCE_LENGTH}-{MAX_NONCE_LENGTH} base64url characters "
            "(at least 16 random bytes)")


class NonceIssuer(Protocol):
    ttl: float

    def issue(self) -> tuple[str, float]:
        """A fresh nonce and the time it expires (seconds since the epoch)."""

    def register(self, value: str) -> float:
        """Accept a counterparty-chosen nonce; returns its expiry."""

    def consume(self, value: str) -> None:
        """Use a nonce once; raises a NonceError saying why it cannot be used."""


class MemoryNonces:
    """In-process nonces with TTL pruning.

    A consumed nonce is remembered until it would have expired, so a second use
    is reported as a reuse rather than as unknown; after that it is forgotten
    (and, being expired, could not be used anyway).
    """

    def __init__(self, ttl: float = 300.0, *, capacity: int = 10_000,
                 clock: Callable[[], float] = time.time) -> None:
        if ttl <= 0:
            raise ValueError("nonce time to live must be positive")
        self.ttl = ttl
        self._capacity = capacity
        self._clock = clock
        self._live: dict[str, float] = {}  # nonce -> expires_at
        self._used: dict[str, float] = {}  # consumed nonce -> expires_at
        self._pruned_at = float("-inf")

    def issue(self) -> tuple[str, float]:
        value = secrets.token_urlsafe(NONCE_BYTES)
        return value, self._add(value)

    def register(self, value: str) -> float:
        check_format(value)
        if value in self._live or value in self._used:
            raise ReusedNonce("this nonce was already registered; draw a fresh one")
        return self._add(value)

    def consume(self, value: str) -> None:
        now = self._clock()
        if value in self._used:
            raise ReusedNonce("nonce already used: request a fresh one")
        expires_at = self._live.pop(value, None)
        if expires_at is None:
            raise UnknownNonce("nonce not issued or registered by this governor (or long expired)")
        if now >= expires_at:
            raise ExpiredNonce(f"nonce expired {now - expires_at:.0f}s ago: request a fresh one")
        self._used[value] = expires_at

    def _add(self, value: str) -> float:
        now = self._clock()
        if len(self._live) >= self._capacity or now - self._pruned_at >= 1.0:
            self._prune(now)
        if len(self._live) >= self._capacity:
            raise TooManyNonces(f"{self._capacity} nonces outstanding: try again later")
        expires_at = now + self.ttl
        self._live[value] = expires_at
        return expires_at

    def _prune(self, now: float) -> None:
        # Expired live nonces stay one extra TTL so a late use reads "expired", not "unknown".
        self._live = {v: t for v, t in self._live.items() if t + self.ttl > now}
        self._used = {v: t for v, t in self._used.items() if t > now}
        self._pruned_at = now


class StoreNonces:
    """Nonces kept in the state store, shared by every replica on the same backend.

    The store answers only "usable or not", so a refusal cannot say whether the
    nonce was unknown, used or expired.
    """

    def __init__(self, store, ttl: float = 300.0, *, clock: Callable[[], float] = time.time) -> None:
        if ttl <= 0:
            raise ValueError("nonce time to live must be positive")
        self.ttl = ttl
        self._store = store
        self._clock = clock

    def issue(self) -> tuple[str, float]:
        value = secrets.token_urlsafe(NONCE_BYTES)
        return value, self._put(value)

    def register(self, value: str) -> float:
        check_format(value)
        return self._put(value)

    def consume(self, value: str) -> None:
        if not self._store.take_nonce(value, self._clock()):
            raise UnknownNonce("nonce unknown, already used or expired: request a fresh one")

    def _put(self, value: str) -> float:
        now = self._clock()
        expires_at = now + self.ttl
        self._store.put_nonce(value, expires_at, now)
        return expires_at
