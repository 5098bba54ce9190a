"""The Redis store's asyncio client auto-pipelined (governor.store.redis_pipeline), against a
real redis-server: the calls of one loop turn in one write, each with its own answer, FIFO,
an error failing its own caller only, queued settlements flushed at close; and against a
hostile server that answers short, garbage or the wrong shape: every caller fails clearly,
none hangs."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import AsyncIterator, Iterator

import pytest
import pytest_asyncio
import redis

from governor.store import CounterDamaged, StoreIntegrityError, StoreUnavailable, UnknownReservation
from tests.redis_counters import DAY_TOKENS, KEYS, SESSION_COST, T0, charges, prefix
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer, redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

from governor.store.redis import RedisStore  # noqa: E402  (after the skip: needs the client only)



@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A server of this module's own, for the checks that count its reads or stop it."""
    server = RedisServer()
    yield server
    server.stop()  # continued first if a test stopped it


def reads(observer: redis.Redis) -> int:
    return int(observer.info("stats")["total_reads_processed"])


async def test_the_calls_of_one_loop_turn_go_in_one_write_each_with_its_own_answer(own_server):
    observer = redis.Redis.from_url(own_server.url, decode_responses=True)
    with RedisStore(own_server.url, prefix=prefix()) as store:
        counters = store.counters()
        await counters.reserve_within("agent", "warm", KEYS, [], T0)  # the connection made, its scripts loaded
        batches, before = counters.pipeline.batches, reads(observer)
        results = await asyncio.gather(*(counters.reserve_within("agent", f"s{i}", KEYS, charges(100, 0.01 * i), T0)
                                         for i in range(16)))
        after = reads(observer)
        assert counters.pipeline.batches - batches == 1
        # 16 scripts in one write: the server read them in at most two reads (one more: this INFO),
        # where a round trip each took 16
        assert after - before <= 3, after - before
        held = [r for _, r in results if r.ok]
        assert len(held) == 10 and [r.ok for _, r in results] == [True] * 10 + [False] * 6  # FIFO: the first ten
        # each read the agent's day as the calls before it left it, in the order they were made
        assert [s[DAY_TOKENS] for s, _ in results[:10]] == [100.0 * i for i in range(10)]
        assert [s[SESSION_COST] for s, _ in results] == [0.0] * 16  # and its own session's cost
        assert all(r.observed == 1000.0 for _, r in results[10:])
        assert len({r.id for r in held}) == 10
        await asyncio.gather(*(counters.release(r.id) for r in held))
    observer.close()


async def test_a_command_that_errors_fails_alone_and_its_neighbours_succeed(redis_url):
    with RedisStore(redis_url, prefix=prefix()) as store:
        counters = store.counters()
        await counters.reserve_within("agent", "warm", KEYS, [], T0)
        redis.Redis.from_url(redis_url).set(f"{store.prefix}sc:forged", "not a hash")  # a forged key type
        batches = counters.pipeline.batches
        results = await asyncio.gather(*(counters.reserve_within("agent", session, KEYS, charges(10, 0.5), T0)
                                         for session in ("a", "forged", "b")), return_exceptions=True)
        assert counters.pipeline.batches - batches == 1
        # the forged key is damage, named (governor.store.CounterDamaged), to this call alone
        assert isinstance(results[1], CounterDamaged) and "sc:forged" in str(results[1]), results[1]
        assert store.integrity is None  # one damaged key: not a loss of the store
        assert results[0][1].ok and results[0][0] == {DAY_TOKENS: 0.0, SESSION_COST: 0.0}
        assert results[2][1].ok and results[2][0] == {DAY_TOKENS: 10.0, SESSION_COST: 0.0}  # the forged one wrote nothing
        assert store.snapshot("agent", "b", T0, KEYS) == {DAY_TOKENS: 20.0, SESSION_COST: 0.5}


async def test_a_settlement_queued_before_an_admission_is_applied_before_it(redis_url):
    """The excess a settlement gives back admits the next call queued behind it in the same
    write: FIFO on one connection."""
    with RedisStore(redis_url, prefix=prefix()) as store:
        counters = store.counters()
        _, first = await counters.reserve_within("agent", "s", KEYS, charges(900, 0), T0)
        assert first.ok
        outcome: list = []
        batches = counters.pipeline.batches
        counters.commit_soon(first.id, charges(100, 0, cap=None), T0, outcome.append)  # not awaited
        snapshot, second = await counters.reserve_within("agent", "s", KEYS, charges(800, 0), T0)
        assert counters.pipeline.batches - batches == 1  # both in one write
        assert outcome == [None] and second.ok and snapshot[DAY_TOKENS] == 100.0  # settled first: 100 + 800 fit
        # the other way round (the admission first) the same cap refuses it
        _, third = await counters.reserve_within("agent", "s2", KEYS, charges(200, 0), T0)
        assert not third.ok and third.observed == 900.0
        # a settlement of a reservation settled already answers UnknownReservation: never counted twice
        counters.commit_soon(first.id, charges(100, 0, cap=None), T0, outcome.append)
        await counters.drain()
        assert isinstance(outcome[1], UnknownReservation)
        assert store.snapshot("agent", "s", T0, [DAY_TOKENS]) == {DAY_TOKENS: 900.0}


async def test_after_a_script_flush_the_batch_loads_its_scripts_and_runs_in_order(redis_url):
    with RedisStore(redis_url, prefix=prefix()) as store:
        counters = store.counters()
        _, first = await counters.reserve_within("agent", "s", KEYS, charges(900, 0), T0)
        redis.Redis.from_url(redis_url).script_flush()
        outcome: list = []
        counters.commit_soon(first.id, charges(100, 0, cap=None), T0, outcome.append)
        _, second = await counters.reserve_within("agent", "s", KEYS, charges(800, 0), T0)
        assert outcome == [None] and second.ok  # both NOSCRIPT, loaded, run again in their order


async def test_a_fence_lost_or_acknowledged_still_decides_per_command_through_the_pipeline(redis_url):
    with RedisStore(redis_url, prefix=prefix()) as store:
        counters = store.counters()
        await counters.reserve_within("agent", "s", KEYS, [], T0)
        redis.Redis.from_url(redis_url).delete(f"{store.prefix}fence")
        results = await asyncio.gather(*(counters.reserve_within("agent", f"s{i}", KEYS, charges(1, 0), T0)
                                         for i in range(4)), return_exceptions=True)
        assert all(isinstance(r, StoreIntegrityError) for r in results)
        outcome: list = []
        with pytest.raises(StoreIntegrityError):  # nothing queued on a store that fails closed
            counters.commit_soon("any", None, T0, outcome.append)
        assert store.acknowledge()["acknowledged"] is True
        _, held = await counters.reserve_within("agent", "s", KEYS, charges(1, 0), T0)
        assert held.ok


async def test_a_queued_settlement_is_flushed_at_close(redis_url):
    store = RedisStore(redis_url, prefix=prefix())
    counters = store.counters()
    _, held = await counters.reserve_within("agent", "s", KEYS, charges(900, 0.5), T0)
    outcome: list = []
    counters.commit_soon(held.id, charges(120, 0.25, cap=None), T0, outcome.append)
    await counters.aclose()  # what the store's close runs on the loop: the queue first
    assert outcome == [None]
    assert store.snapshot("agent", "s", T0, KEYS) == {DAY_TOKENS: 120.0, SESSION_COST: 0.25}
    store.close()


async def test_a_queued_settlement_that_cannot_reach_redis_reports_its_failure(own_server):
    with RedisStore(own_server.url + "?timeout=0.3&retry_after=2", prefix=prefix()) as store:
        counters = store.counters()
        _, held = await counters.reserve_within("agent", "s", KEYS, charges(900, 0), T0)
        outcome: list = []
        os.kill(own_server.process.pid, signal.SIGSTOP)
        try:
            counters.commit_soon(held.id, charges(100, 0, cap=None), T0, outcome.append)
            await asyncio.wait_for(counters.drain(), 5)
        finally:
            os.kill(own_server.process.pid, signal.SIGCONT)
        assert len(outcome) == 1 and type(outcome[0]) is StoreUnavailable and outcome[0].retry_after == 2.0
        # the reservation still counts what it reserved (the commit was not read, or did not run)...
        assert store.snapshot("agent", "s", T0, [DAY_TOKENS]) in ({DAY_TOKENS: 900.0}, {DAY_TOKENS: 100.0})
        # ...and settling it again settles it once
        try:
            await counters.commit(held.id, charges(100, 0, cap=None), T0)
        except UnknownReservation:
            pass  # the first one ran after all
        assert store.snapshot("agent", "s", T0, [DAY_TOKENS]) == {DAY_TOKENS: 100.0}


# --- a hostile server ------------------------------------------------------------------------


class HostileRedis:
    """A loopback server speaking just enough RESP for the client to connect (INFO, SCRIPT
    LOAD, the rest +OK), then answering scripts by `mode`: "short" (the first EVALSHA
    answered, the rest never), "garbage" (bytes that are not RESP), "shape" (an integer where
    the script answers an array)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.evalsha = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                command = await _read_command(reader)
                if command is None:
                    break
                name = command[0].upper()
                if name == b"INFO":
                    writer.write(b"$0\r\n\r\n")
                elif name == b"SCRIPT":
                    writer.write(b"$40\r\n" + b"0" * 40 + b"\r\n")
                elif name == b"EVALSHA":
                    self.evalsha += 1
                    if self.mode == "garbage":
                        writer.write(b"\x00\x01 not RESP at all\r\n")
                    elif self.mode == "shape":
                        writer.write(b":7\r\n")
                    elif self.mode == "array":
                        writer.write(b"*1\r\n:7\r\n")
                    elif self.evalsha == 1:  # short: one answer, then silence
                        writer.write(b":1\r\n")
                else:
                    writer.write(b"+OK\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _read_command(reader: asyncio.StreamReader) -> list[bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    assert line.startswith(b"*"), line
    parts = []
    for _ in range(int(line[1:])):
        size = int((await reader.readline())[1:])
        parts.append((await reader.readexactly(size + 2))[:-2])
    return parts


@pytest_asyncio.fixture
async def hostile(request) -> AsyncIterator[tuple[HostileRedis, str]]:
    server = HostileRedis(request.param)
    url = await server.start()
    yield server, url
    await server.stop()


@pytest.mark.parametrize("hostile", ["short", "garbage"], indirect=True)
async def test_a_batch_answered_short_or_with_garbage_fails_every_waiting_caller_without_a_hang(hostile, redis_url):
    server, url = hostile
    with RedisStore(redis_url, prefix=prefix()) as real:  # its blocking side opens on a real server
        counters = _counters_on(real, url)
        try:
            results = await asyncio.wait_for(asyncio.gather(
                *(counters.commit(f"r{i}", None, T0) for i in range(5)), return_exceptions=True), 5)
        finally:
            await counters.aclose()
        assert server.evalsha == 5
        failed = results[1:] if server.mode == "short" else results
        assert all(type(r) is StoreUnavailable for r in failed), results
        if server.mode == "short":
            assert results[0] is None  # the one answer read went to the first caller
            assert all("Timeout" in str(r) for r in failed)
        else:
            assert all("Protocol" in str(r) or "InvalidResponse" in str(r) for r in failed), failed


@pytest.mark.parametrize("hostile", ["shape", "array"], indirect=True)
async def test_a_reply_of_the_wrong_shape_is_the_stores_failure_not_a_crash(hostile, redis_url):
    server, url = hostile
    with RedisStore(redis_url, prefix=prefix()) as real:
        counters = _counters_on(real, url)
        try:
            if server.mode == "shape":  # a number where an array is answered
                calls = [counters.reserve_within("agent", "s", KEYS, charges(1, 0), T0),
                         counters.shared_admit("agent", "s", KEYS, charges(1, 0), T0, "", b"", []),
                         counters.shared_settle("r", (), T0, "s", "", b"")]
            else:  # an array where a number is answered
                calls = [counters.release("r"), counters.commit("r", None, T0)]
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
        finally:
            await counters.aclose()
        for r in results:
            assert type(r) is StoreUnavailable and "unexpected reply" in str(r), (type(r).__name__, str(r)[:200])


def _counters_on(store: RedisStore, url: str):
    """An asyncio client of `store` (its fence, epoch, failure semantics) on another server."""
    from governor.store.redis_async import AsyncCounters
    from governor.store.redis_client import parse_options
    from governor.store.redis_scripts import COMMIT, PRELUDE, RELEASE, RESERVE_WITHIN

    rest, options, extra = parse_options(url + "?timeout=0.3")
    return AsyncCounters(rest, options, extra, store, ttl_ms=1000, reserve_within=PRELUDE + RESERVE_WITHIN,
                         commit=PRELUDE + COMMIT, release=PRELUDE + RELEASE)


ECHO = "return ARGV"  # a script that answers its arguments as Redis read them


def test_the_pipelines_packing_is_byte_for_byte_what_redis_py_sends():
    """The pipeline packs its commands itself (a third of redis-py's CPU): the same bytes."""
    from redis.asyncio.connection import Connection

    from governor.store.redis_pipeline import pack

    connection = Connection()
    commands = [("EVALSHA", "a" * 40, 2, "k1", "k2", "agent", b"{\"a\":1}", 3, -7, 0, 2.5, 1e300, 1 / 3, "",
                 b"", "caf\u00e9 \u2603", b"\r\n$3\r\n\x00*1\r\n", 2 ** 70, memoryview(b"view")),
                ("EVALSHA", "b" * 40, 0)]
    assert pack(connection.encoder.encode, commands) == [b"".join(connection.pack_commands(commands))]
    with pytest.raises(redis.DataError):  # what redis-py refuses, refused the same
        pack(connection.encoder.encode, [("EVALSHA", "a" * 40, 0, True)])


async def test_arguments_with_resp_framing_inside_reach_the_script_intact_and_a_bad_one_fails_its_batch_alone(
        redis_url):
    from governor.store.redis_pipeline import Script

    with RedisStore(redis_url, prefix=prefix()) as store:
        counters = store.counters()
        pipeline, echo = counters.pipeline, Script(ECHO)
        hostile = [b"\r\n$5\r\nhello\r\n*2\r\n", "caf\u00e9", b"\x00\x01", "", 2.5, -3]
        assert await pipeline.call(echo, [], hostile) == ["\r\n$5\r\nhello\r\n*2\r\n", "caf\u00e9", "\x00\x01", "",
                                                          "2.5", "-3"]  # the store's client reads text
        bad, neighbour = pipeline.call(echo, [], [True]), pipeline.call(echo, [], ["x"])  # one batch
        with pytest.raises(redis.DataError):
            await bad
        with pytest.raises(redis.DataError):  # packed together: the batch was never sent
            await neighbour
        assert await pipeline.call(echo, [], ["after"]) == ["after"]  # the pipeline goes on
        await counters.aclose()


async def test_a_batch_answered_in_parts_wakes_its_callers_together(redis_url):
    """Redis answers a large batch in parts (it reads 16 KB of commands at a time, and the
    replies come as it goes): the callers get their replies once the whole batch is read, in
    one turn of the loop, not the first ones while the rest is read (they would queue their next
    calls into a batch of their own, and so on: bench/FINDINGS.md, session 21). Each still gets
    its own reply."""
    from governor.store.redis_pipeline import Script

    with RedisStore(redis_url, prefix=prefix()) as store:
        counters = store.counters()
        pipeline, echo = counters.pipeline, Script(ECHO)
        await pipeline.call(echo, [], ["warm"])  # the connection made, the script loaded
        woken: list[int] = []  # at each caller's wake-up: how many of the batch were answered
        futures = [pipeline.call(echo, [], [str(i), "x" * 8192]) for i in range(40)]  # ~330 KB each way
        for future in futures:
            future.add_done_callback(lambda _: woken.append(sum(f.done() for f in futures)))
        answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert [a[0] for a in answers] == [str(i) for i in range(40)]
        assert woken == [40] * 40, woken[:5]
        await counters.aclose()
