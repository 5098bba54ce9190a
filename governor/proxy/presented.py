"""The ADL-Passport request header: the digest of the passport an agent presents (§1.3 anti-swap).

`sha256=<digest>` is taken as the digest itself. Anything else is base64url of a
passport document (JSON or YAML), read as the pin was read and digested. The
header is the agent's, so reading it is bounded: at most MAX_PRESENTED_BYTES
decoded, and the passport reader's own bounds (no YAML anchors or aliases,
nesting at most governor.common.documents.MAX_DEPTH levels). What remains costs up to a
few hundred milliseconds of YAML parsing, so it runs in one worker thread, never
on the event loop: with a timeout, a bound on parses in flight, and a small cache
(an agent presenting the same passport on every request pays once).

A header that cannot be read is a PresentedPassportError carrying the reason and
the digest of the bytes as presented (which never equals a pin), so the proxy
records the mismatch as before and refuses the request saying why.
"""

from __future__ import annotations

import asyncio
import binascii
import re
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from governor.common.canonical import b64url_decode, sha256_b64url

HEADER = "ADL-Passport"
MAX_PRESENTED_BYTES = 64 * 1024  # decoded; a passport is a few KiB
_MAX_ENCODED = (MAX_PRESENTED_BYTES * 4 + 2) // 3 + 2  # its base64url, padding tolerated
_MAX_DIGEST_CHARS = 128  # a SHA-256 digest in base64url is 43
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")
PARSE_TIMEOUT = 2.0  # seconds
MAX_PARSES_IN_FLIGHT = 8  # queued or running; beyond: 503 at once (the digest form needs no parse)
_CACHE_SIZE = 64


class PresentedPassportError(Exception):
    """The header is not a readable passport: `reason` says why, `digest` is that of the bytes."""

    def __init__(self, reason: str, digest: str, *, busy: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.digest = digest
        self.busy = busy  # the governor could not read it now (timeout, too many at once)


def presented_digest(value: str) -> str:
    """The digest a header value presents (see the module doc); PresentedPassportError otherwise.

    Synchronous and bounded; the proxy calls it through PresentedPassports, off the event loop."""
    value = value.strip()
    if value.startswith("sha256="):
        digest = value[len("sha256="):]
        # a claimed digest is compared, never parsed; only its size is bounded (it is recorded)
        return digest if len(digest) <= _MAX_DIGEST_CHARS else sha256_b64url(value.encode())
    raw = decode_header(value)
    from governor.passport import PassportError, parse_passport, passport_digest

    try:
        return passport_digest(parse_passport(raw, source=HEADER, max_bytes=MAX_PRESENTED_BYTES))
    except PassportError as exc:
        raise PresentedPassportError(f"not a readable passport: {exc}", sha256_b64url(raw)) from None
    except RecursionError:  # not expected past the reader's depth bound: still a clear refusal
        raise PresentedPassportError("not a readable passport: nested too deeply", sha256_b64url(raw)) from None


def decode_header(value: str) -> bytes:
    """The bytes a non-digest header value carries: cheap checks, on any thread."""
    if len(value) > _MAX_ENCODED:
        raise PresentedPassportError(
            f"{len(value)} characters, more than the {MAX_PRESENTED_BYTES} bytes a presented passport may have "
            f"(present sha256=<digest> instead)", sha256_b64url(value.encode()))
    if not _BASE64URL.fullmatch(value):
        raise PresentedPassportError("neither sha256=<digest> nor base64url of a passport",
                                     sha256_b64url(value.encode()))
    try:
        return b64url_decode(value.rstrip("="))
    except (ValueError, binascii.Error):
        raise PresentedPassportError("not valid base64url", sha256_b64url(value.encode())) from None


def _outcome(value: str) -> str | PresentedPassportError:
    """presented_digest's answer as a value (the worker's result is cached either way)."""
    try:
        return presented_digest(value)
    except PresentedPassportError as exc:
        return exc


class PresentedPassports:
    """Digests of ADL-Passport headers for the proxy: cached, parsed in one worker thread."""

    def __init__(self, *, timeout: float = PARSE_TIMEOUT, max_in_flight: int = MAX_PARSES_IN_FLIGHT,
                 cache_size: int = _CACHE_SIZE) -> None:
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.cache_size = cache_size
        self._cache: OrderedDict[str, str | PresentedPassportError] = OrderedDict()  # header -> outcome, LRU
        self._pending: dict[str, asyncio.Future] = {}  # header -> its read, until the worker is done with it
        self._executor: ThreadPoolExecutor | None = None

    async def digest(self, value: str) -> str:
        """The presented digest; PresentedPassportError (with .busy when it could not be read now)."""
        stripped = value.strip()
        if stripped.startswith("sha256="):
            return presented_digest(stripped)
        cached = self._cache.get(stripped)
        if cached is not None:
            self._cache.move_to_end(stripped)
            if isinstance(cached, PresentedPassportError):
                raise PresentedPassportError(cached.reason, cached.digest)
            return cached
        decode_header(stripped)  # too long or not base64url: refused here, no thread needed
        future = self._pending.get(stripped)  # the same header already being read: wait for that
        if future is None:
            if len(self._pending) >= self.max_in_flight:
                raise PresentedPassportError(
                    f"{len(self._pending)} presented passports are being read already; retry, or present "
                    f"sha256=<digest>", sha256_b64url(stripped.encode()), busy=True)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="governor-passport-header")
            future = asyncio.get_running_loop().run_in_executor(self._executor, _outcome, stripped)
            self._pending[stripped] = future
            future.add_done_callback(lambda done: self._finished(stripped, done))
        try:
            outcome = await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except asyncio.TimeoutError:
            raise PresentedPassportError(f"not read within {self.timeout:g} s", sha256_b64url(stripped.encode()),
                                         busy=True) from None
        if isinstance(outcome, PresentedPassportError):
            raise PresentedPassportError(outcome.reason, outcome.digest)
        return outcome

    def _finished(self, value: str, future: asyncio.Future) -> None:
        # runs when the worker is done, also after a timeout: until then the read counts as in flight
        self._pending.pop(value, None)
        if not future.cancelled() and future.exception() is None:
            self._cache[value] = future.result()
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
