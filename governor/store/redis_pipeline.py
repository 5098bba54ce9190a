"""Auto-pipelining for the Redis store's asyncio client (governor.store.redis_async): the
scripts called in one turn of the event loop go to Redis as one pipeline, one write on one
connection, and each caller's future gets its own reply.

Why: a round trip on redis-py's asyncio client costs ~0.15-0.19 ms of CPU whatever the
command (the send syscall, the pool, the timeouts, the retry wrapper: bench/FINDINGS.md,
"Redis per-step CPU"); under load many steps share one trip instead of paying one each.

Order is FIFO: one batch is in flight at a time, and calls made while it is wait for the
next one, so a command queued before another is executed by Redis before it (a session's
settlement before its next admission). The pipeline is not a transaction: each command
succeeds or fails on its own, an error reply fails its caller only. A batch that loses its
connection (or times out, or reads a reply that is not RESP) fails every caller still
waiting on it with that error, never leaving one waiting: each read has the socket timeout.

Scripts run by EVALSHA; the connection loads them when it connects (AsyncCounters'
on-connect), and a NOSCRIPT (the script cache flushed since) loads them and runs the
commands that got it again, in their order, on the same connection, before the next batch."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any, Callable, Sequence

import redis
from redis.exceptions import NoScriptError

log = logging.getLogger("governor.store")


class Script:
    """A Lua script known by its SHA-1 (what EVALSHA names)."""

    __slots__ = ("source", "sha")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class Pipeline:
    """The calls of one event loop to one Redis, batched per turn of the loop."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool  # redis.asyncio.ConnectionPool: a batch takes one connection from it
        self._queue: list[tuple[Script, tuple[Any, ...], asyncio.Future]] = []
        self._sender: asyncio.Task | None = None  # the task sending batches while calls are queued
        self.batches = 0  # batches sent (tests and benches read it)

    def call(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> asyncio.Future:
        """Queue EVALSHA of `script`; the future gets its reply (or its error: a
        redis.ResponseError for an error reply, another redis.RedisError when the batch failed)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append((script, ("EVALSHA", script.sha, len(keys), *keys, *args), future))
        if self._sender is None:  # started next turn: the calls of this one join the batch
            self._sender = asyncio.get_running_loop().create_task(self._send_queued())
        return future

    async def drain(self) -> None:
        """Wait until every call queued so far has its reply (a stop flushes the queue first)."""
        while (sender := self._sender) is not None:
            await asyncio.wait((sender,))  # never raises: the callers got what it raised

    async def _send_queued(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._send(batch)
        finally:
            self._sender = None
            if self._queue:  # cancelled with calls queued: none is left waiting
                _fail(self._queue, redis.ConnectionError("Redis store: the pipeline stopped"))
                self._queue = []

    async def _send(self, batch: list[tuple[Script, tuple[Any, ...], asyncio.Future]]) -> None:
        self.batches += 1
        try:
            connection = await self._pool.get_connection()
        except BaseException as exc:
            _fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        try:
            missing = await self._exchange(connection, batch)
            if missing:  # the script cache was flushed: load, then run those again, in order
                scripts = list({script.sha: script for script, _, _ in missing}.values())
                await connection.send_packed_command(connection.pack_commands(
                    [("SCRIPT", "LOAD", script.source) for script in scripts]))
                for _ in scripts:
                    await connection.read_response()
                log.warning("Redis store: scripts were missing on the server (SCRIPT FLUSH?), loaded again")
                missing = await self._exchange(connection, missing)
                _fail(missing, redis.ResponseError("Redis store: NOSCRIPT after the script was loaded"))
        except BaseException as exc:
            await connection.disconnect(nowait=True)  # replies may be pending on it: never reused
            _fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            await self._pool.release(connection)

    @staticmethod
    async def _exchange(connection: Any, batch: list[tuple[Script, tuple[Any, ...], asyncio.Future]]
                        ) -> list[tuple[Script, tuple[Any, ...], asyncio.Future]]:
        """Send the batch in one write and give each caller its reply once every reply of the
        batch is read (those read before a failure too); the entries answered NOSCRIPT (not
        run), in order.

        Not each as it is read: Redis answers a batch in parts when it is larger than one
        read of its (16 KB: a shared session's ~30 scripts carry ~40 KB), and the callers
        woken by the first part queued their next calls while the rest was read, splitting
        the next batch, and the next: 16 callers in lockstep took 0.11 batches a call instead
        of 0.06 (bench/FINDINGS.md, session 21). Woken together, their next calls go together."""
        await connection.send_packed_command(pack(connection.encoder.encode, [command for _, command, _ in batch]),
                                             check_health=False)
        missing = []
        answers: list[tuple[asyncio.Future, Any, bool]] = []
        try:
            for entry in batch:
                try:
                    answers.append((entry[2], await connection.read_response(), True))
                except NoScriptError:
                    missing.append(entry)
                except redis.ResponseError as exc:  # this command's error: its caller's alone
                    answers.append((entry[2], exc, False))
        finally:
            for future, answer, ok in answers:
                if future.done():  # its caller was cancelled
                    continue
                if ok:
                    future.set_result(answer)
                else:
                    future.set_exception(answer)
        return missing


def pack(encode: Callable[[Any], bytes], commands: Sequence[Sequence[Any]]) -> list[bytes]:
    """The commands in RESP, as one buffer: what redis-py's `pack_commands` sends, at about
    a third of its CPU (it grows a buffer per argument; a shared session's scripts carry ~50
    arguments each, measured 45 us a command there, 18 here: bench/FINDINGS.md, session 20).
    str, bytes and int, nearly every argument, are done here (an int with one formatting,
    not redis-py's checks and repr: a quarter less CPU for a shared session's scripts); the
    rest by redis-py's `encode` (a float as its repr, a bool refused), so the bytes are the same."""
    parts = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for arg in command:
            kind = type(arg)
            if kind is str:
                arg = arg.encode()
            elif kind is int:  # its repr, as redis-py's (a bool is not an int here: refused by `encode`)
                arg = b"%d" % arg
            elif kind is not bytes:
                arg = encode(arg)
            parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return [b"".join(parts)]


def _fail(batch: list[tuple[Script, tuple[Any, ...], asyncio.Future]], exc: BaseException) -> None:
    """Every caller of `batch` still waiting gets `exc` (as a redis.RedisError: the store's
    failure), so none waits for a reply that will not come."""
    if not isinstance(exc, redis.RedisError):
        exc = redis.ConnectionError(f"Redis store: the pipeline failed: {type(exc).__name__}: {exc}")
    for _, _, future in batch:
        if not future.done():
            future.set_exception(exc)
