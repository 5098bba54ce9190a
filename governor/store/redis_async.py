"""The Redis store's asyncio client: the per-step path's calls (reserve within a snapshot,
commit, release) awaited on the proxy's event loop, with no thread per step.

It runs the blocking store's own scripts with the same encoding (redis_calls) and defers to
that store for everything that is not a round trip: whether it is usable, what a failure
means, the fence's epoch and what a fence error says, and whether a new connection's primary
is the one the store wrote to. So a loss found by either client fails both closed, and one
acknowledgement clears both. Like the blocking client it never retries a command (a retried
reservation could count twice)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import redis

from governor.policy.steps import CounterCharge, CounterKey
from governor.store.base import Reservation, RollingWindow, StoreUnavailable, UnknownReservation
from governor.store.redis_calls import ReserveWithin, commit_args
from governor.store.redis_scripts import PRELUDE
from governor.store.redis_shared_scripts import SHARED_ADMIT, SHARED_SETTLE
from governor.store.redis_client import RedisOptions, make_client


class Fenced(Protocol):
    """What the blocking store shares with its asyncio client (governor.store.redis.RedisStore)."""

    prefix: str
    epoch: str
    window: RollingWindow

    @property
    def keys(self) -> list[str]: ...

    def check_usable(self) -> None: ...

    def failure(self, exc: Exception) -> StoreUnavailable: ...

    def fence_error(self, exc: Exception) -> bool: ...

    def primary_seen(self, info: Any) -> str | None: ...

    def primary_lost(self, why: str, fence: str | None) -> None: ...


class AsyncCounters:
    """The per-step counter calls of one RedisStore, on one event loop."""

    def __init__(self, url: str, options: RedisOptions, extra: dict[str, str], store: Fenced, *, ttl_ms: int,
                 reserve_within: str, commit: str, release: str) -> None:
        self._store = store
        self._ttl_ms = ttl_ms  # how long per_day keys live past their last write
        self._client = make_client(url, options, extra, self._on_connect, asynchronous=True)
        register = self._client.register_script
        self._reserve_within = register(reserve_within)
        self._commit = register(commit)
        self._release = register(release)
        self._shared_admit = register(PRELUDE + SHARED_ADMIT)
        self._shared_settle = register(PRELUDE + SHARED_SETTLE)

    async def _on_connect(self, connection: Any) -> None:
        """The blocking client's check, on an asyncio connection: a new primary that may have
        missed this store's writes fails the store closed."""
        await connection.on_connect()
        try:
            await connection.send_command("INFO", "replication")
            info = await connection.read_response()
        except redis.ResponseError:  # INFO refused (a proxy in front of Redis): nothing to compare
            return
        why = self._store.primary_seen(info)
        if why is None:
            return
        try:
            await connection.send_command("GET", self._store.keys[0])
            fence = await connection.read_response()
        except redis.RedisError:
            fence = None
        self._store.primary_lost(why, fence)
        raise redis.ConnectionError("Redis store: the primary changed; writes may have been lost")

    async def _run(self, script: Any, args: Sequence[Any]) -> Any:
        store = self._store
        for attempt in (1, 2):
            store.check_usable()
            try:
                return await script(keys=store.keys, args=(store.prefix, store.epoch, *args))
            except redis.ResponseError as exc:
                if store.fence_error(exc) and attempt == 1:  # acknowledged elsewhere: run again
                    continue
                raise store.failure(exc) from exc
            except redis.RedisError as exc:
                raise store.failure(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns or raises

    async def reserve_within(self, agent: str, session: str, keys: Sequence[CounterKey],
                             charges: Sequence[CounterCharge], now: float) -> tuple[dict[CounterKey, float], Reservation]:
        """The store's reserve_within, awaited."""
        call = ReserveWithin.of(self._store.window, self._ttl_ms, agent, session, keys, charges, now)
        return call.answer(await self._run(self._reserve_within, call.args))

    async def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        result = await self._run(self._commit, commit_args(self._store.window, self._ttl_ms, reservation_id, actual, now))
        if int(result) != 1:
            raise UnknownReservation(reservation_id)

    async def release(self, reservation_id: str) -> bool:
        return int(await self._run(self._release, (reservation_id,))) == 1

    # --- a shared session's steps in one round trip (redis_shared_scripts) ------------------

    async def shared_admit(self, agent: str, session: str, keys: Sequence[CounterKey],
                           charges: Sequence[CounterCharge], now: float, expected: str, state: bytes,
                           bounds: Sequence[tuple[int, float, float, bool]]
                           ) -> tuple[int, bytes | None, dict[CounterKey, float], Reservation | None]:
        """Reserve `charges` and save `state` when the session's saved state has SHA-1
        `expected`, no round holds it and every bound (index into `keys`, addend, limit,
        strict; the index counts from 1) holds: (code, the state as it stands on a conflict, the snapshot, the
        reservation when held or refused). Codes as SHARED_ADMIT answers them."""
        call = ReserveWithin.of(self._store.window, self._ttl_ms, agent, session, keys, charges, now)
        args = [*call.args, expected, state, repr(now), len(bounds)]
        for index, addend, limit, strict in bounds:
            args += (index, repr(addend), repr(limit), "1" if strict else "0")
        result = await self._run(self._shared_admit, args)
        code = int(result[0])
        if code == -1:
            return code, _bytes(result[1]), {}, None
        if code < 0:
            return code, None, {}, None
        snapshot, held = call.answer([1 if code == 3 else result[0], *result[1:]])
        return code, None, snapshot, held if code in (0, 1) else None

    async def shared_settle(self, reservation_id: str, actual: Sequence[CounterCharge], now: float, session: str,
                            expected: str, state: bytes) -> tuple[int, bytes | None]:
        """Commit the reservation at `actual` and save `state`, under SHARED_ADMIT's
        conditions: (code, the state as it stands on a conflict)."""
        args = [*commit_args(self._store.window, self._ttl_ms, reservation_id, actual, now), session, expected, state,
                repr(now)]
        result = await self._run(self._shared_settle, args)
        code = int(result[0])
        return code, _bytes(result[1]) if code == -1 else None

    async def aclose(self) -> None:
        await self._client.aclose()


def _bytes(value: Any) -> bytes | None:
    return value.encode() if isinstance(value, str) else value
