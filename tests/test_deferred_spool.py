"""The spool of refusals a replica could not chain yet (governor.evidence.deferred_spool) and the
shared book log's compaction choices (governor.store.redis_retention): what they keep, and
what garbage on disk or in Redis cannot make them do."""

from __future__ import annotations

import json

from governor.evidence.deferred_spool import DeferredSpool, already_chained
from governor.evidence.record import make_event
from governor.store.redis_retention import ended_before, opened_before, readable


def test_a_spooled_refusal_is_kept_until_chained_and_garbage_is_skipped(tmp_path, caplog):
    spool = DeferredSpool(tmp_path / "deferred")
    assert spool.sessions() == [] and spool.events("s-1") == []
    first = make_event("on_governor_error", "fallback", 1_700_000_000.0, {"reason": "store unreachable"})
    second = make_event("on_governor_error", "fallback", 1_700_000_001.0, {"reason": "store unreachable"})
    spool.add("s-1", first)
    spool.add("s-1", second)
    spool.add("odd session/../name", first)  # any printable id: files are named by its hash
    assert sorted(spool.sessions()) == ["odd session/../name", "s-1"]
    assert spool.events("s-1") == [json.loads(json.dumps(first)), json.loads(json.dumps(second))]
    # hostile: a torn last line, garbage, and another session's event written into s-1's file
    path = spool._file("s-1")
    with path.open("ab") as f:
        f.write(b'{"session": "s-2", "event": {"cause": "on_x", "action": "deny"}}\n')
        f.write(b"not json\n[1, 2]\n")
        f.write(b'{"session": "s-1", "event": {"cau')
    assert len(spool.events("s-1")) == 2  # only what is s-1's and whole
    assert "s-2" not in spool.sessions()
    assert "unreadable, skipped" in caplog.text
    spool.keep("s-1", [second])  # the first one chained
    assert spool.events("s-1") == [json.loads(json.dumps(second))]
    spool.keep("s-1", [])
    assert not path.exists() and spool.sessions() == ["odd session/../name"]


def test_an_event_already_in_the_chain_is_not_chained_twice():
    event = make_event("on_governor_error", "fallback", 1_700_000_000.0, {"reason": "store unreachable"})
    chained = [{"seq": 0, **make_event("on_budget_exhausted", "halt", 1_699_999_999.0)}, {"seq": 1, **event}]
    assert already_chained(json.loads(json.dumps(event)), chained)
    other = make_event("on_governor_error", "fallback", 1_700_000_002.0, {"reason": "store unreachable"})
    assert not already_chained(other, chained)


def test_book_compaction_drops_only_ended_sessions_and_garbage():
    lines = [json.dumps(entry) for entry in (
        {"op": "open", "id": "old", "by": "principal", "at": 1},
        {"op": "open", "id": "new", "by": "principal", "at": 2},
        {"op": "lock", "id": "lock-1", "session": "old", "cause": "on_x", "at": 3},
        {"op": "end", "id": "old", "at": 10},
        {"op": "end", "id": "new", "at": 500},
        {"op": "end", "id": 7, "at": 1},  # not an id
        {"op": "end", "id": "no-time", "at": "yesterday"},
    )] + ["garbage", '["a", "list"]', '{"no": "op"}']
    assert [entry["op"] for _, entry in readable(lines)] == ["open", "open", "lock", "end", "end", "end", "end"]
    assert ended_before(lines, 100) == ["old"]
    assert ended_before(lines, 1000) == ["old", "new"]
    # opened long ago (one another replica ended before its book read the open has no end entry)
    assert opened_before(lines + [json.dumps({"op": "open", "id": "dflt", "by": "default", "at": 1})], 2) == ["old"]


def test_on_a_real_redis_the_index_pages_skips_forgeries_backfills_and_retention_removes(tmp_path):
    import pytest
    import redis as redis_client

    from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    from governor.store.redis import RedisStore
    from governor.store.redis_retention import SharedRetention

    server = RedisServer()
    store = RedisStore(server.url + "?ended_ttl=10")
    raw = redis_client.Redis.from_url(server.url, decode_responses=True)
    try:
        sessions = store.shared_sessions()
        for name in ("s-a", "s-b", "s-c"):  # chained: the first append indexes them
            assert sessions.append(name, 0, "", b'{"kind":"header","body":{"start":"2026-01-01T00:00:00Z"}}', "h0")
        retention = SharedRetention(sessions)
        assert retention.page(None, 2) == ["s-a", "s-b"] and retention.page("s-b", 5) == ["s-c"]
        raw.zadd("governor:ids", {"s-forged": 0})  # no chain head: left out
        found = retention.entries(["s-a", "s-forged"])
        assert list(found) == ["s-a"] and found["s-a"] == (1, None, False, "2026-01-01T00:00:00Z")
        # a governor from before the index: chained, ended, recorded, in no index
        raw.sadd("governor:chains", "s-old")
        raw.hset("governor:chh:s-old", mapping={"len": 3, "hash": "h"})
        raw.set("governor:rec:s-old", "{}")
        sessions.put_record("s-a", {"session": "s-a"})
        assert retention.remove_ended(1_000.0) == []  # (far in the past: nothing is old enough)
        assert raw.zscore("governor:ids", "s-old") == 0 and raw.zscore("governor:ended", "s-old") == 1_000.0
        gone = retention.remove_ended(10**10)  # past every retention
        assert sorted(gone) == ["s-a", "s-old"]
        assert not raw.exists("governor:ch:s-a", "governor:chh:s-a", "governor:rec:s-a", "governor:chh:s-old",
                              "governor:rec:s-old")
        assert retention.page(None, 10) == ["s-b", "s-c", "s-forged"]
        # the book's compaction: entries of removed sessions go; an end entry forged (long ago) for a
        # session whose chain is there drops nothing; garbage goes
        book = [{"op": "open", "id": "s-a", "by": "principal", "at": 1.0}, {"op": "open", "id": "s-b", "by": "principal",
                "at": 2.0}, {"op": "lock", "id": "lock-1", "session": "s-a", "cause": "on_x", "at": 3.0},
                {"op": "end", "id": "s-a", "at": 4.0}, {"op": "end", "id": "s-b", "at": 1.0}]
        raw.rpush("governor:book", *[json.dumps(entry) for entry in book], "garbage")
        assert retention.compact_book(10**10, 0.5)
        assert [json.loads(line) for line in raw.lrange("governor:book", 0, -1)] == [book[1], book[2], book[4]]
        assert raw.get("governor:bookgen") == "2"  # (the removal above compacted it once already)
        whole = [line.encode() for line in raw.lrange("governor:book", 0, -1)]
        assert sessions.book_read(2, 1) == (2, whole)  # a reader of an earlier generation: the whole log
        assert sessions.book_read(2, 2) == (2, whole[2:])
        assert not raw.sismember("governor:chains", "s-a") and raw.zcard("governor:ended") == 0
    finally:
        raw.close()
        store.close()
        server.stop()


def test_ended_ttl_is_a_positive_number_of_seconds():
    import pytest

    from governor.store.redis_client import parse_options

    assert parse_options("redis://127.0.0.1:6379/0")[1].ended_ttl == 86400.0
    assert parse_options("redis://127.0.0.1:6379/0?ended_ttl=3600")[1].ended_ttl == 3600.0
    for bad in ("0", "-5", "a day", "nan", ""):
        with pytest.raises(ValueError, match="ended_ttl must be a positive number of seconds"):
            parse_options(f"redis://127.0.0.1:6379/0?ended_ttl={bad}")
