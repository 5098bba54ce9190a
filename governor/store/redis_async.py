"""The Redis store's asyncio client: the per-step path's calls (reserve within a snapshot,
commit, release) awaited on the proxy's event loop, with no thread per step.

It runs the blocking store's own scripts with the same encoding (redis_calls) and defers to
that store for everything that is not a round trip: whether it is usable, what a failure
means, the fence's epoch and what a fence error says, and whether a new connection's primary
is the one the store wrote to. So a loss found by either client fails both closed, and one
acknowledgement clears both. Like the blocking client it never retries a command that may
have run (a retried reservation could count twice). Its calls are auto-pipelined: those of
one turn of the event loop go to Redis in one round trip, in the order they were made
(governor.store.redis_pipeline); `commit_soon` queues a settlement without awaiting it."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Protocol, Sequence

import redis
from redis.exceptions import AskError

from governor.policy.steps import CounterCharge, CounterKey
from governor.store.base import Reservation, RollingWindow, StoreError, UnknownReservation
from governor.store.redis_calls import ReserveWithin, commit_args
from governor.store.redis_scripts import PRELUDE
from governor.store.redis_shared_scripts import SHARED_ADMIT, SHARED_SETTLE
from governor.store.redis_client import RedisOptions, make_client
from governor.store.redis_pipeline import Pipeline, Script


class Fenced(Protocol):
    """What the blocking store shares with its asyncio client (governor.store.redis.RedisStore)."""

    prefix: str
    epoch: str
    window: RollingWindow
    session_space: str  # "" for shared sessions, local sessions' own space otherwise (redis.LOCAL_SESSIONS)

    @property
    def keys(self) -> list[str]: ...

    def check_usable(self) -> None: ...

    def failure(self, exc: Exception) -> StoreError: ...

    def fence_error(self, exc: Exception) -> bool: ...

    def primary_seen(self, info: Any) -> str | None: ...

    def primary_lost(self, why: str, fence: str | None) -> None: ...


class AsyncCounters:
    """The per-step counter calls of one RedisStore, on one event loop, auto-pipelined: the
    calls of one turn of the loop share one round trip (governor.store.redis_pipeline)."""

    def __init__(self, url: str, options: RedisOptions, extra: dict[str, str], store: Fenced, *, ttl_ms: int,
                 reserve_within: str, commit: str, release: str) -> None:
        self._store = store
        self._ttl_ms = ttl_ms  # how long per_day keys live past their last write
        self._client = make_client(url, options, extra, self._on_connect, asynchronous=True)
        self._reserve_within = Script(reserve_within)
        self._commit = Script(commit)
        self._release = Script(release)
        self._shared_admit = Script(PRELUDE + SHARED_ADMIT)
        self._shared_settle = Script(PRELUDE + SHARED_SETTLE)
        self._scripts = (self._reserve_within, self._commit, self._release, self._shared_admit, self._shared_settle)
        self.pipeline = Pipeline(self._client.connection_pool)

    async def _on_connect(self, connection: Any) -> None:
        """The blocking client's check, on an asyncio connection: a new primary that may have
        missed this store's writes fails the store closed. Then the scripts are loaded, so
        the first EVALSHA of each finds it (a NOSCRIPT would run it after the batch's others)."""
        await connection.on_connect()
        try:
            await connection.send_command("INFO", "replication")
            info = await connection.read_response()
        except redis.ResponseError:  # INFO refused (a proxy in front of Redis): nothing to compare
            info = None
        why = self._store.primary_seen(info) if info is not None else None
        if why is not None:
            try:
                await connection.send_command("GET", self._store.keys[0])
                fence = await connection.read_response()
            except redis.RedisError:
                fence = None
            self._store.primary_lost(why, fence)
            raise redis.ConnectionError("Redis store: the primary changed; writes may have been lost")
        await connection.send_packed_command(connection.pack_commands(
            [("SCRIPT", "LOAD", script.source) for script in self._scripts]), check_health=False)
        for _ in self._scripts:
            try:
                await connection.read_response()
            except redis.ResponseError:  # refused (a proxy): a NOSCRIPT loads it later
                pass

    def _call(self, script: Script, args: Sequence[Any]) -> asyncio.Future:
        store = self._store
        return self.pipeline.call(script, store.keys, (store.prefix, store.epoch, *args))

    def _again(self, exc: redis.RedisError, attempt: int) -> bool:
        """True when a failed command may run once more (the fence was acknowledged on another
        replica; a Cluster slot moved: the script did not run); else raises what it means."""
        if isinstance(exc, redis.ResponseError) and attempt == 1 and (
                isinstance(exc, AskError) or self._store.fence_error(exc)):
            return True
        raise self._store.failure(exc) from exc

    async def _run(self, script: Script, args: Sequence[Any]) -> Any:
        for attempt in (1, 2):
            self._store.check_usable()
            try:
                return await self._call(script, args)
            except redis.RedisError as exc:
                self._again(exc, attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns or raises

    def _malformed(self, result: Any, exc: Exception) -> StoreError:
        """A reply of the wrong shape (not what the script answers): the store's failure."""
        return self._store.failure(redis.InvalidResponse(f"unexpected reply {str(result)[:80]!r} ({exc})"))

    async def reserve_within(self, agent: str, session: str, keys: Sequence[CounterKey],
                             charges: Sequence[CounterCharge], now: float) -> tuple[dict[CounterKey, float], Reservation]:
        """The store's reserve_within, awaited."""
        call = ReserveWithin.of(self._store.window, self._ttl_ms, agent, self._store.session_space + session, keys,
                                charges, now)
        result = await self._run(self._reserve_within, call.args)
        try:
            return call.answer(result)
        except (TypeError, ValueError, IndexError) as exc:
            raise self._malformed(result, exc) from exc

    async def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        result = await self._run(self._commit, commit_args(self._store.window, self._ttl_ms, reservation_id, actual, now))
        failure = self._committed(result, reservation_id)
        if failure is not None:
            raise failure

    def commit_soon(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float,
                    done: Callable[[Exception | None], None]) -> None:
        """`commit`, queued now (before any call made after it) and not awaited: `done` gets
        None or what failed (the store's failure, UnknownReservation: not outstanding) once
        the reply is read. Raises at once when the store is not usable (nothing queued)."""
        self._store.check_usable()
        self._soon(self._commit, commit_args(self._store.window, self._ttl_ms, reservation_id, actual, now),
                   lambda result: done(self._committed(result, reservation_id)), done)

    def _soon(self, script: Script, args: list[Any], reply: Callable[[Any], None],
              failed: Callable[[Exception], None], attempt: int = 1) -> None:
        """`script` queued now and not awaited: `reply` gets its answer once read, `failed` what
        failed (a call `_again` allows runs once more, as `_run` does)."""
        def replied(future: asyncio.Future) -> None:
            try:
                if future.cancelled():
                    raise redis.ConnectionError("Redis store: a queued call was cancelled")
                exc = future.exception()
                if exc is None:
                    reply(future.result())
                elif self._again(exc, attempt):  # type: ignore[arg-type]
                    self._store.check_usable()
                    self._soon(script, args, reply, failed, 2)
            except Exception as failure:
                failed(failure)

        self._call(script, args).add_done_callback(replied)

    def _committed(self, result: Any, reservation_id: str) -> Exception | None:
        """COMMIT's answer: None (committed), UnknownReservation (not outstanding: committed
        or released before, as a retried commit finds it), or the reply's malformation."""
        try:
            return None if int(result) == 1 else UnknownReservation(reservation_id)
        except (TypeError, ValueError) as exc:
            return self._malformed(result, exc)

    async def release(self, reservation_id: str) -> bool:
        result = await self._run(self._release, (reservation_id,))
        try:
            return int(result) == 1
        except (TypeError, ValueError) as exc:  # not what the script answers: the store's failure, not a crash
            raise self._malformed(result, exc) from None

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
        try:
            code = int(result[0])
            if code == -1:
                return code, _bytes(result[1]), {}, None
            if code < 0:
                return code, None, {}, None
            snapshot, held = call.answer([1 if code == 3 else result[0], *result[1:]])
        except (TypeError, ValueError, IndexError, AttributeError) as exc:
            raise self._malformed(result, exc) from exc
        return code, None, snapshot, held if code in (0, 1) else None

    async def shared_settle(self, reservation_id: str, actual: Sequence[CounterCharge], now: float, session: str,
                            expected: str, state: bytes) -> tuple[int, bytes | None]:
        """Commit the reservation at `actual` and save `state`, under SHARED_ADMIT's
        conditions: (code, the state as it stands on a conflict)."""
        args = [*commit_args(self._store.window, self._ttl_ms, reservation_id, actual, now), session, expected, state,
                repr(now)]
        return self._shared_settled(await self._run(self._shared_settle, args))

    def _shared_settled(self, result: Any) -> tuple[int, bytes | None]:
        """SHARED_SETTLE's answer: (code, the state as it stands on a conflict)."""
        try:
            code = int(result[0])
            return code, _bytes(result[1]) if code == -1 else None
        except (TypeError, ValueError, IndexError, AttributeError) as exc:
            raise self._malformed(result, exc) from exc

    def shared_settle_soon(self, reservation_id: str, actual: Sequence[CounterCharge], now: float, session: str,
                           expected: str, state: bytes,
                           done: Callable[[int | None, bytes | None, Exception | None], None]) -> None:
        """`shared_settle`, queued now (before any call made after it) and not awaited: `done`
        gets (code, the state on a conflict, None) or (None, None, what failed) once the reply
        is read. Raises at once when the store is not usable (nothing queued)."""
        self._store.check_usable()
        args = [*commit_args(self._store.window, self._ttl_ms, reservation_id, actual, now), session, expected, state,
                repr(now)]
        self._soon(self._shared_settle, args, lambda result: done(*self._shared_settled(result), None),
                   lambda failure: done(None, None, failure))

    async def drain(self) -> None:
        """Every call queued so far sent and its reply handled."""
        await self.pipeline.drain()

    async def aclose(self) -> None:
        await self.pipeline.drain()  # queued settlements reach Redis before the connections close
        await self._client.aclose()


def _bytes(value: Any) -> bytes | None:
    return value.encode() if isinstance(value, str) else value
