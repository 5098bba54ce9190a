"""Sessions shared by three governor processes on one real Redis (issue #30 item 1;
docs/reference/shared-sessions.md): a session opened on A is served through B and C and ended
on A, and its one record, verified by `governor verify`, holds every event of every replica
in one chain; an unknown token is refused on every replica; an entry edited in Redis is
found and the step fails closed; a replica killed -9 loses nothing another cannot finalize.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import redis

from governor.cli import main as governor_cli
from governor.evidence.translog import record_sha256
from governor.store.redis_scripts import PRELUDE
from governor.store.redis_sessions import BEGIN_ROUND
from governor.store.redis_shared_scripts import SHARED_ADMIT, SHARED_SETTLE
from tests.shared_replicas import CONTROL, Replica, public_key, shared_keys


class MonitoredScripts:
    """The EVALSHA calls a redis-server runs while the block runs, read from MONITOR in a thread."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
        self.shas: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        with self.client.monitor() as monitor:
            self.started.set()
            while not self.stop.is_set():  # the replicas' background reads keep commands coming
                words = monitor.next_command()["command"].split()
                if words and words[0].upper() == "EVALSHA":
                    self.shas.append(words[1])

    def __enter__(self) -> "MonitoredScripts":
        self.started = threading.Event()
        self.thread.start()
        assert self.started.wait(10), "MONITOR did not start"
        time.sleep(0.1)  # MONITOR is on before the block's first command
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(15)
        self.client.close()

    def count(self, script: str) -> int:
        return self.shas.count(hashlib.sha1(script.encode()).hexdigest())

pytestmark = pytest.mark.asyncio

# a call the example passport's 20,000-token session budget refuses even with output fitting
UNFITTABLE = {"max_tokens": 30_000, "answers": 100}


@pytest.fixture
def redis_process():
    from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_process):
    return redis_process.url


async def start_three(tmp_path, url, **options) -> list[Replica]:
    keys = shared_keys(tmp_path)
    started = await asyncio.gather(*[Replica.start(name, tmp_path, keys, url, **options) for name in "abc"],
                                   return_exceptions=True)
    failed = [r for r in started if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*[r.stop() for r in started if not isinstance(r, BaseException)])
        raise failed[0]
    return started  # type: ignore[return-value]


def verify(tmp_path, record: dict, capsys) -> dict:
    path = tmp_path / f"record-{record['session']}.json"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(public_key(tmp_path / "gateway-keys" / "keys")),
                         "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 3 and report["verdict"] == "INCOMPLETE", report  # a pinned key: all but its binding checked
    return report


async def open_session(replica: Replica, **body) -> tuple[str, str]:
    answer = await replica.control.post("/v1/sessions", json=body)
    assert answer.status_code == 201, answer.text
    opened = answer.json()
    return opened["session"], opened["token"]


async def test_a_session_opened_on_a_is_served_through_b_and_c_and_ended_on_a_in_one_chain(tmp_path, redis_url, llm,
                                                                                           capsys):
    # (checkpoints every 0.5 s: a proof is published within a sweep or two of its session's end)
    a, b, c = replicas = await start_three(tmp_path, redis_url, extra={"log_checkpoint_seconds": 0.5})
    try:
        session, token = await open_session(a, label="across replicas")
        # round robin over the three replicas: every one serves the session it never opened
        statuses = [(await replica.chat(llm.url, token)).status_code for replica in (a, b, c, b, c, a)]
        assert statuses == [200] * 6, statuses
        for replica in replicas:  # the view any replica gives is the shared one
            view = await replica.control.get(f"/v1/sessions/{session}")
            assert view.status_code == 200, (replica.name, view.text)
            assert view.json()["state"] == "active"
        # a call the 20,000-token session budget refuses, on C: its event is in the chain
        refused = await c.chat(llm.url, token, **UNFITTABLE)
        assert refused.status_code in (403, 429), refused.text
        end = await a.control.post(f"/v1/sessions/{session}/end")
        assert end.status_code == 200, end.text
        record = end.json()
        verify(tmp_path, record, capsys)
        causes = [event["cause"] for event in record["events"]]
        assert refused.json()["error"]["governor"]["cause"] in causes, "C's refusal is in the record A wrote"
        # every event of the one chain in Redis, in its order, and nothing else
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        chain = [json.loads(line) for line in server.lrange(f"governor:ch:{session}", 0, -1)]
        server.close()
        assert chain[0]["kind"] == "header" and chain[-1]["kind"] == "end"
        chained = [(line["body"]["seq"], line["body"]["cause"], line["body"]["action"]) for line in chain[1:-1]]
        assert [(e["seq"], e["cause"], e["action"]) for e in record["events"]] == chained
        # written once: by A; B and C serve that same record, and refuse the ended token
        served = await c.control.get(f"/v1/sessions/{session}/record")  # C serves the record A wrote
        assert served.status_code == 200, served.text
        unchained = lambda events: [{k: v for k, v in e.items() if k != "prev_hash"} for e in events]  # noqa: E731
        assert unchained(served.json()["events"]) == unchained(record["events"])  # the same events, ended
        assert served.json()["outcome"] == record["outcome"]
        for replica in (b, c):
            again = await replica.control.post(f"/v1/sessions/{session}/end")
            assert again.status_code == 200, again.text
            assert again.json()["signature"] == record["signature"]
            answer = await replica.chat(llm.url, token)
            assert answer.status_code == 403, answer.text
        assert (a.data_dir / "records").exists()
        assert not list((b.data_dir / "records").glob("*.json")) if (b.data_dir / "records").exists() else True
        await listed_alike_on_every_replica(replicas, llm, redis_url, ended=session, capsys=capsys)
        await one_record_on_every_replica(replicas, llm, redis_url, tmp_path, capsys)
        await one_proof_on_every_replica(replicas, llm, redis_url, tmp_path, capsys, ended_on_a=session)
    finally:
        await asyncio.gather(*[r.stop() for r in replicas])


async def listed_alike_on_every_replica(replicas: list[Replica], llm, redis_url: str, ended: str, capsys) -> None:
    """GET /v1/sessions lists every shared session on every replica, the same: one opened on A,
    served through B and ended on C is listed through B (budgets and all), one still open and
    one ended on A are too; members forged in the store's index are not listed."""
    a, b, c = replicas
    moved, token = await open_session(a, label="opened on A, ended on C")
    fresh, _ = await open_session(b, label="opened on B, never served")
    assert (await b.chat(llm.url, token)).status_code == 200
    assert (await b.chat(llm.url, token, **UNFITTABLE)).status_code in (403, 429)
    assert (await c.control.post(f"/v1/sessions/{moved}/end")).status_code == 200
    server = redis.Redis.from_url(redis_url, decode_responses=True)
    server.zadd("governor:ids", {"forged-no-chain": 0, "forged-bad-state": 0, "forged-other-state": 0})
    server.hset("governor:chh:forged-bad-state", mapping={"len": 3, "hash": "x"})
    server.set("governor:st:forged-bad-state", "{not a state")
    server.hset("governor:chh:forged-other-state", mapping={"len": 3, "hash": "x"})
    server.set("governor:st:forged-other-state", server.get(f"governor:st:{moved}"))  # another session's
    server.rpush("governor:book", json.dumps({"op": "open", "id": "forged-in-book", "by": "principal", "at": 1,
                                              "token_sha256": "0" * 64}))
    server.close()
    pages = []
    for replica in (b, a, c):
        answer = await replica.control.get("/v1/sessions")
        assert answer.status_code == 200, (replica.name, answer.text)
        pages.append(answer.json()["sessions"])
    for page in pages:  # the same page on every replica, the shared sessions only
        assert [v["session"] for v in page] == sorted([ended, moved, fresh]), page
        for view in page:  # (the wall clock's use grows between two reads)
            view["budgets"] = [budget for budget in view["budgets"] if budget["dimension"] != "wall_clock_sec"]
    assert pages[0] == pages[1] == pages[2]
    views = {view["session"]: view for view in pages[0]}
    assert views[moved]["state"] == "ended" and views[ended]["state"] == "ended" and views[fresh]["state"] == "active"
    assert views[moved]["label"] == "opened on A, ended on C" and views[moved]["opened_by"] == "principal"
    assert views[moved]["iterations"] == 1 and views[moved]["events"] >= 1, views[moved]
    assert any(budget["used"] > 0 and budget["limit"] and budget["scope"] == "per_session"
               for budget in views[moved]["budgets"]), views[moved]["budgets"]
    assert views[fresh]["started_at"] and views[fresh]["iterations"] == 0
    # a page at a time, through another replica
    first = (await c.control.get("/v1/sessions", params={"limit": 1})).json()
    second = (await a.control.get("/v1/sessions", params={"limit": 2, "after": first["next"]})).json()
    assert [v["session"] for v in first["sessions"] + second["sessions"]] == sorted([ended, moved, fresh])
    assert first["next"] and second["next"] is None
    # `governor sessions list` against B's control plane: the same sessions
    token_file = b.data_dir / "control-token-for-the-cli"
    token_file.write_text(CONTROL)
    capsys.readouterr()
    assert governor_cli(["sessions", "list", "--control-url", b.control_url, "--token-file", str(token_file)]) == 0
    printed = capsys.readouterr().out
    assert all(session in printed for session in (ended, moved, fresh)) and "forged" not in printed, printed
    # one session's view, for one served elsewhere only, is the shared one on every replica
    for replica in replicas:
        view = (await replica.control.get(f"/v1/sessions/{moved}")).json()
        assert (view["state"], view["iterations"]) == ("ended", 1), (replica.name, view)


def chained_events(redis_url: str, session: str) -> list[tuple]:
    server = redis.Redis.from_url(redis_url, decode_responses=True)
    chain = [json.loads(line) for line in server.lrange(f"governor:ch:{session}", 0, -1)]
    server.close()
    return [(line["body"]["seq"], line["body"]["cause"], line["body"]["action"]) for line in chain
            if line["kind"] == "event"]


async def one_record_on_every_replica(replicas: list[Replica], llm, redis_url: str, tmp_path, capsys) -> None:
    """The record of a shared session is the same on every replica: while it is open an interim
    one (`Governor-Record: interim`) over every replica's events in the chain's order, even on a
    replica whose copy is stale or that never served it; once B ended it, the final record B
    wrote, byte for byte, on A (which served it before and holds a stale copy), B and C."""
    a, b, c = replicas
    session, token = await open_session(a, label="one record")
    for replica in (a, b):
        served = await replica.chat(llm.url, token)
        assert served.status_code == 200, (replica.name, served.text)
    refused = await b.chat(llm.url, token, **UNFITTABLE)  # a halt chained on B, after A's last read
    assert refused.status_code in (403, 429), refused.text
    chained = chained_events(redis_url, session)
    assert chained, "B's refusal is chained"
    for replica in (a, c):  # A's copy is behind B's event; C never served the session
        interim = await replica.control.get(f"/v1/sessions/{session}/record")
        assert interim.status_code == 200, (replica.name, interim.text)
        assert interim.headers["Governor-Record"] == "interim"
        assert [(e["seq"], e["cause"], e["action"]) for e in interim.json()["events"]] == chained, replica.name
        assert interim.json()["outcome"] == "halted", interim.json()
        verify(tmp_path, interim.json(), capsys)
    assert (await a.chat(llm.url, token)).status_code in (403, 429)  # halted on every replica
    end = await b.control.post(f"/v1/sessions/{session}/end")
    assert end.status_code == 200, end.text
    chained = chained_events(redis_url, session)
    assert [(e["seq"], e["cause"], e["action"]) for e in end.json()["events"]] == chained
    for replica in (a, b, c, a):
        served = await replica.control.get(f"/v1/sessions/{session}/record")
        assert served.status_code == 200, (replica.name, served.text)
        assert served.headers["Governor-Record"] == "final"
        assert served.content == end.content, (replica.name, served.text, end.text)
    verify(tmp_path, end.json(), capsys)
    checked = await c.reviewer.get(f"/v1/sessions/{session}/verification")  # the console's check: that record
    assert checked.status_code == 200, checked.text
    assert checked.json()["record"] == end.json() and checked.json()["verification"]["verdict"] == "INCOMPLETE"
    # A dropped its stale copy: its view says ended, and the session's token is refused there
    assert (await a.control.get(f"/v1/sessions/{session}")).json()["state"] == "ended"
    assert (await a.chat(llm.url, token)).status_code == 403
    # bound to a nonce issued on A: signed afresh over the whole ended chain
    nonce = (await a.control.post("/v1/nonces")).json()["nonce"]
    bound = await a.control.get(f"/v1/sessions/{session}/record", params={"nonce": nonce})
    assert bound.status_code == 200, bound.text
    unchained = lambda events: [{k: v for k, v in e.items() if k != "prev_hash"} for e in events]  # noqa: E731
    assert bound.json()["nonce"] == nonce  # (the header, and so each event's prev_hash, names it)
    assert unchained(bound.json()["events"]) == unchained(end.json()["events"])
    assert bound.json()["outcome"] == end.json()["outcome"]
    again = await a.control.get(f"/v1/sessions/{session}/record", params={"nonce": nonce})
    assert again.status_code == 409, again.text  # a nonce binds one record
    # hostile: ids that are no session, on a replica that never saw them
    for unknown in ("no-such-session", "x" * 300, "../../etc/passwd", "governor:rec:*"):
        missing = await c.control.get(f"/v1/sessions/{quote(unknown, safe='')}/record")
        assert missing.status_code == 404, (unknown, missing.text)
        assert missing.json()["error"]["code"] == "unknown_session"


async def proof_served(replica: Replica, session: str, within: float = 15.0) -> httpx.Response:
    """`?proof=1` on `replica` until the proof is published (503 proof_pending meanwhile)."""
    deadline = time.monotonic() + within
    while True:
        answer = await replica.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})
        if answer.status_code != 503 or time.monotonic() > deadline:
            return answer
        assert answer.json()["error"]["code"] == "proof_pending" and answer.headers["Retry-After"], answer.text
        await asyncio.sleep(0.2)


def verify_proof(tmp_path, answer: httpx.Response, log_key: Path, capsys, *witness: str) -> dict:
    """`governor verify RECORD --proof PROOF --log-key [--witness-key]` on what a replica served."""
    session = answer.json()["record"]["session"]
    record, proof = tmp_path / f"proved-{session}.json", tmp_path / f"proved-{session}.tlog-proof"
    record.write_text(json.dumps(answer.json()["record"]))
    proof.write_text(answer.json()["tlog_proof"])
    capsys.readouterr()
    code = governor_cli(["verify", str(record), "--offline", "--key", str(public_key(tmp_path / "gateway-keys" / "keys")),
                         "--proof", str(proof), "--log-key", str(log_key), "--json",
                         *[arg for key in witness for arg in ("--witness-key", key)]])
    report = json.loads(capsys.readouterr().out)
    assert code == 3 and report["log_proof"]["valid"], report  # the proof valid; the key pinned, not resolved
    return report


async def one_proof_on_every_replica(replicas: list[Replica], llm, redis_url: str, tmp_path, capsys,
                                     ended_on_a: str) -> None:
    """`?proof=1` of a shared session on any replica: 409 while it runs; once C ended it, C's log
    holds its record and C publishes the proof in Redis, which A and B serve (the record Redis
    holds, the proof `governor verify --proof` accepts with C's log key), and `POST end?proof=1`
    on B answers it too. Hostile: a proof edited in Redis (another session's, a wrong index,
    cut short, made by a forger's log with another key) is refused by A (500 proof_invalid)
    while C, whose log holds the record, still proves it; with no proof and none awaited the
    answer is 404 not_logged; an awaited one is published again by C's sweeper."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from governor.evidence.translog import TransparencyLog

    a, b, c = replicas
    session, token = await open_session(b, label="proved on every replica")
    assert (await b.chat(llm.url, token)).status_code == 200
    for replica in (a, c):  # open: no final record, so no proof (true here)
        running = await replica.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})
        assert running.status_code == 409 and running.json()["error"]["code"] == "session_running", running.text
    end = await c.control.post(f"/v1/sessions/{session}/end")
    assert end.status_code == 200, end.text
    first = await a.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})  # at once: pending or served
    assert first.status_code in (200, 503), first.text
    assert first.status_code == 200 or first.json()["error"]["code"] == "proof_pending", first.text
    served = {replica.name: await proof_served(replica, session) for replica in (a, b, c)}
    for name, answer in served.items():
        assert answer.status_code == 200, (name, answer.text)
        assert answer.json()["record"] == end.json(), name  # the record Redis holds, the one C wrote
        verify_proof(tmp_path, answer, c.data_dir / "log" / "log.vkey", capsys)
    # one governor key, one origin: every replica's log key is C's (a counterparty needs one)
    assert {(r.data_dir / "log" / "log.vkey").read_text() for r in replicas} == {(c.data_dir / "log" / "log.vkey").read_text()}
    ended_again = await b.control.post(f"/v1/sessions/{session}/end", params={"proof": "1"})
    assert ended_again.status_code == 200, ended_again.text
    assert ended_again.json()["record"] == end.json()
    verify_proof(tmp_path, ended_again, a.data_dir / "log" / "log.vkey", capsys)
    # the session A ended earlier: B serves its proof too, and it is another session's
    other = await proof_served(b, ended_on_a)
    assert other.status_code == 200, other.text

    server = redis.Redis.from_url(redis_url)
    try:
        published = server.get(f"governor:prf:{session}")
        assert published is not None and published.decode() in {answer.json()["tlog_proof"] for answer in served.values()}
        head, _, note = published.partition(b"\n\n")
        lines = head.split(b"\n")
        wrong_index = b"\n".join(line if not line.startswith(b"index ") else
                                 b"index " + str(int(line[6:]) + 1).encode() for line in lines) + b"\n\n" + note
        forger = TransparencyLog(tmp_path / "forger", Ed25519PrivateKey.generate(),
                                 note.split(b"\n", 1)[0].decode(), sync=False)
        forger.append(end.json())
        forged = forger.prove(end.json())
        edits = {"another session's": other.json()["tlog_proof"].encode(), "a wrong index": wrong_index,
                 "cut short": published[: len(published) // 2], "another key's": forged, "not a proof": b"\x00" * 40,
                 "not UTF-8": b"\xff\xfe" + published[2:]}
        for what, edited in edits.items():
            server.set(f"governor:prf:{session}", edited)
            refused = await a.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})
            assert refused.status_code == 500, (what, refused.text)
            assert refused.json()["error"]["code"] == "proof_invalid", (what, refused.text)
            assert "edited or damaged in the store" in refused.json()["error"]["message"], what
            own = await c.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})  # C proves it itself
            assert own.status_code == 200, (what, own.text)
        # no proof and none awaited: a replica that keeps no log wrote the record
        server.delete(f"governor:prf:{session}")
        none = await a.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})
        assert none.status_code == 404 and none.json()["error"]["code"] == "not_logged", none.text
        assert "keeps no transparency log" in none.json()["error"]["message"]
        # awaited again (as after C's restart): C's sweeper publishes it once more
        server.hset("governor:unproved", session, record_sha256(end.json()))
        again = await proof_served(a, session)
        assert again.status_code == 200, again.text
        assert server.hget("governor:unproved", session) is None
        # the record edited in Redis while its proof is awaited: C's sweeper publishes none for it
        # (and goes on publishing the others' proofs)
        edited_record = {**end.json(), "outcome": "completed" if end.json()["outcome"] != "completed" else "halted"}
        server.delete(f"governor:prf:{session}")
        server.set(f"governor:rec:{session}", json.dumps(edited_record))
        server.hset("governor:unproved", session, record_sha256(end.json()))
        later, later_token = await open_session(c, label="ended after an edit")
        assert (await c.chat(llm.url, later_token)).status_code == 200
        assert (await c.control.post(f"/v1/sessions/{later}/end")).status_code == 200
        assert (await proof_served(a, later)).status_code == 200  # C's sweeper published it
        assert server.hget("governor:unproved", session) is None  # dropped, not published
        assert server.get(f"governor:prf:{session}") is None
        edited = await a.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})
        assert edited.status_code == 404 and edited.json()["error"]["code"] == "not_logged", edited.text
        assert "not the one that replica logged" in edited.json()["error"]["message"]
        # the written record edited into what is not a record (not JSON, not UTF-8, not an object):
        # never served as final by a replica that reads it from the store (A never served this
        # session), on the record's route or the proof's; an awaited proof of it is dropped by the
        # sweeper, which goes on publishing the others'
        garbled, garbled_token = await open_session(c, label="its record garbled in the store")
        assert (await c.chat(llm.url, garbled_token)).status_code == 200
        garbled_end = await c.control.post(f"/v1/sessions/{garbled}/end")
        assert garbled_end.status_code == 200
        assert (await proof_served(a, garbled)).status_code == 200
        for garbage in (b"\xff not json", b"[]", b'"a record"'):
            server.set(f"governor:rec:{garbled}", garbage)
            for params in ({}, {"proof": "1"}):
                unreadable = await a.control.get(f"/v1/sessions/{garbled}/record", params=params)
                assert unreadable.status_code == 500, (garbage, params, unreadable.text)
                assert unreadable.json()["error"]["code"] == "record_unreadable", (garbage, unreadable.text)
        server.delete(f"governor:prf:{garbled}")
        server.hset("governor:unproved", garbled, record_sha256(garbled_end.json()))
        last, last_token = await open_session(c, label="ended after a record was garbled")
        assert (await c.chat(llm.url, last_token)).status_code == 200
        assert (await c.control.post(f"/v1/sessions/{last}/end")).status_code == 200
        assert (await proof_served(a, last)).status_code == 200
        assert server.hget("governor:unproved", garbled) is None
        # an unknown session has no proof on any replica
        missing = await a.control.get("/v1/sessions/no-such-session/record", params={"proof": "1"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_session", missing.text
    finally:
        server.close()


async def test_with_a_witness_each_replica_logs_under_its_own_origin_and_any_replica_serves_a_cosigned_proof(
        tmp_path, redis_process, llm, capsys):
    """Two replicas, each logging under its own origin (one log per replica: under one origin a
    witness would see two forks of one log), one real `governor witness` knowing both logs'
    keys, quorum 1, and a third replica that keeps no log: a session served through A and B
    and ended on A has its proof published by A once the witness cosigned a checkpoint holding
    it; B and C serve it, and it verifies offline with A's log key and the witness's key. A
    session ended on C has no proof anywhere: 404 not_logged on every replica. A fourth replica
    that signs a checkpoint once an hour leaves its proof pending (503 proof_pending) until its
    graceful stop publishes it; C serves it, B (whose witnesses never saw D's log) answers 503
    not_witnessed. With Redis frozen, B cannot read the proof (503
    store_unavailable, retryable) while A, whose log holds the record, still proves it."""
    import os
    import signal

    redis_url = redis_process.url
    from governor.evidence import ensure_governor_key
    from governor.evidence.tlog.note import Ed25519Signer
    from tests.test_witness import WitnessProcess

    keys = shared_keys(tmp_path)
    key, _ = ensure_governor_key(keys.parent, None)
    origins = {name: f"gateway.example/log/{name}" for name in "ab"}
    witness = WitnessProcess(tmp_path / "witness", *[Ed25519Signer(o, key).vkey() for o in origins.values()]).start()
    witnessed = {"witnesses": [[witness.url, witness.vkey()]], "witness_quorum": 1, "log_checkpoint_seconds": 0.5}
    started = await asyncio.gather(*[Replica.start(name, tmp_path, keys, redis_url, extra=extra) for name, extra in (
        ("a", {"log_origin": origins["a"], **witnessed}), ("b", {"log_origin": origins["b"], **witnessed}),
        ("c", {"log": False}), ("d", {"log_checkpoint_seconds": 3600}))], return_exceptions=True)
    replicas: list[Replica] = [r for r in started if not isinstance(r, BaseException)]
    try:
        assert len(replicas) == 4, started
        a, b, c, d = replicas
        session, token = await open_session(b, label="witnessed")
        for replica in (a, b):
            assert (await replica.chat(llm.url, token)).status_code == 200
        end = await a.control.post(f"/v1/sessions/{session}/end")
        assert end.status_code == 200, end.text
        served = await proof_served(b, session, within=30)  # published once the witness cosigned
        assert served.status_code == 200, served.text
        assert served.json()["record"] == end.json()
        report = verify_proof(tmp_path, served, a.data_dir / "log" / "log.vkey", capsys,
                              str(tmp_path / "witness" / "witness.vkey"))
        assert report["log_proof"]["origin"] == origins["a"] and report["log_proof"]["witnesses"], report
        own = await a.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})
        assert own.status_code == 200, own.text
        unlogged = await c.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})  # C keeps no log
        assert unlogged.status_code == 200 and unlogged.json()["tlog_proof"] == served.json()["tlog_proof"], \
            unlogged.text
        # a session ended on C, which keeps no log: no replica has a proof of it, and each says why
        other, other_token = await open_session(a, label="ended where nothing is logged")
        assert (await a.chat(llm.url, other_token)).status_code == 200
        assert (await c.control.post(f"/v1/sessions/{other}/end")).status_code == 200
        for replica in (a, b, c):
            none = await replica.control.get(f"/v1/sessions/{other}/record", params={"proof": "1"})
            assert none.status_code == 404 and none.json()["error"]["code"] == "not_logged", (replica.name, none.text)
            assert "keeps no transparency log" in none.json()["error"]["message"]
        for replica in (a, b):  # neither log was refused by the witness: no fork between them
            ready = (await replica.control.get("/readyz")).json()
            assert ready["witnessing"]["refused"] is None, (replica.name, ready["witnessing"])
        # D signs a checkpoint once an hour: the proof of a session it ended waits, until D stops
        stopped, stopped_token = await open_session(d, label="ended on a replica that then stops")
        assert (await b.chat(llm.url, stopped_token)).status_code == 200
        ended_on_d = await d.control.post(f"/v1/sessions/{stopped}/end")
        assert ended_on_d.status_code == 200, ended_on_d.text
        waiting = await b.control.get(f"/v1/sessions/{stopped}/record", params={"proof": "1"})
        assert waiting.status_code == 503 and waiting.json()["error"]["code"] == "proof_pending", waiting.text
        await d.stop()  # a graceful stop publishes what only its log can prove
        published = await c.control.get(f"/v1/sessions/{stopped}/record", params={"proof": "1"})
        assert published.status_code == 200, published.text
        # B asks its witnesses' quorum of any proof it serves: D has no witnesses, so not from B
        unwitnessed = await b.control.get(f"/v1/sessions/{stopped}/record", params={"proof": "1"})
        assert unwitnessed.status_code == 503, unwitnessed.text
        assert unwitnessed.json()["error"]["code"] == "not_witnessed", unwitnessed.text
        assert "0 of the required 1 witness cosignatures" in unwitnessed.json()["error"]["message"]
        assert published.json()["record"] == ended_on_d.json()
        verify_proof(tmp_path, published, d.data_dir / "log" / "log.vkey", capsys)
        os.kill(redis_process.process.pid, signal.SIGSTOP)
        try:
            frozen = await b.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})
            assert frozen.status_code == 503, frozen.text
            assert frozen.json()["error"]["code"] == "store_unavailable" and frozen.headers["Retry-After"], frozen.text
            own = await a.control.get(f"/v1/sessions/{session}/record", params={"proof": "1"})
            assert own.status_code == 200, own.text
            assert own.json()["record"] == end.json()
        finally:
            os.kill(redis_process.process.pid, signal.SIGCONT)
    finally:
        await asyncio.gather(*[r.stop() for r in replicas])
        witness.stop()


async def test_an_unknown_token_is_refused_on_every_replica(tmp_path, redis_url, llm):
    replicas = await start_three(tmp_path, redis_url)
    try:
        # garbage in the shared book's log (not JSON, not an entry, an op nobody knows) is skipped
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        server.rpush("governor:book", "not json {", '["a", "list"]', '{"op": "teleport", "id": "x"}',
                     '{"op": "end", "id": "no-such-session", "at": 1}')
        server.close()
        session, token = await open_session(replicas[0])  # principals open sessions here: no default one
        for replica in replicas:  # the book goes on after the garbage: the real token works everywhere
            assert (await replica.chat(llm.url, token)).status_code == 200, replica.name
        for replica in replicas:
            for value in ("adls_" + "A" * 32, "adls_short", "someone-elses-session"):
                answer = await replica.chat(llm.url, value)
                assert answer.status_code == 403, (replica.name, value, answer.text)
                assert answer.json()["error"]["governor"]["refusal"] in ("session_unknown", "session_token_malformed")
    finally:
        await asyncio.gather(*[r.stop() for r in replicas])


async def test_an_entry_edited_in_redis_is_found_and_the_session_fails_closed(tmp_path, redis_url, llm):
    # an exhausted budget locks the agent here: a lock made on A is listed and lifted on the others
    a, b, c = replicas = await start_three(tmp_path, redis_url, extra={"lock_on": ["on_budget_exhausted"]})
    try:
        session, token = await open_session(a)
        assert (await b.chat(llm.url, token)).status_code == 200
        assert (await a.chat(llm.url, token, **UNFITTABLE)).status_code in (403, 429)  # an event on the chain
        locks = (await c.control.get("/v1/locks")).json()  # made on A a moment ago: listed on C at once
        assert locks["locked"] and [lock["session"] for lock in locks["locks"]] == [session], locks
        lifted = await b.control.post(f"/v1/locks/{locks['locks'][0]['id']}/lift", json={"by": "ops on B"})
        assert lifted.status_code == 200, lifted.text
        assert (await c.control.get("/v1/locks")).json()["locked"] is False  # lifted on B: lifted on C at once
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        key = f"governor:ch:{session}"
        lines = server.lrange(key, 0, -1)
        assert len(lines) >= 2, lines
        event = json.loads(lines[1])
        event["body"]["action"] = "continue" if event["body"]["action"] != "continue" else "deny"  # forged
        server.lset(key, 1, json.dumps(event, separators=(",", ":")))
        # C reads the chain whole when it first serves the session: the edit fails the step closed
        refused = await c.chat(llm.url, token)
        assert refused.status_code in (403, 503), refused.text
        assert refused.json()["error"]["governor"]["cause"] == "on_governor_error"
        assert "checksum mismatch" in refused.json()["error"]["governor"]["reason"]
        # recorded where it can be: C's audit journal (the chain itself cannot take it)
        audit = await c.control.get("/v1/audit/record")
        assert audit.status_code == 200, audit.text
        damage = [e for e in audit.json()["events"] if e["cause"] == "on_governor_session_integrity"]
        assert damage and damage[0]["detail"]["session"] == session, audit.json()["events"]
        assert damage[0]["detail"]["reason"] == "shared_chain_damaged"
        # and no replica signs a record over the edited chain: not C, reading it whole for a record
        unreadable = await c.control.get(f"/v1/sessions/{session}/record")
        assert unreadable.status_code == 500, unreadable.text
        assert unreadable.json()["error"]["code"] == "record_unreadable"
        assert "checksum mismatch" in unreadable.json()["error"]["message"]
        end = await a.control.post(f"/v1/sessions/{session}/end")
        assert end.status_code >= 400, end.text
        server.close()
    finally:
        await asyncio.gather(*[r.stop() for r in replicas])


async def test_a_replica_killed_9_under_load_loses_nothing_another_cannot_finalize(tmp_path, redis_url, llm, capsys):
    # what an ended session leaves in Redis is kept 8 s (?ended_ttl=): then removed (longer than a
    # racing replica takes to add its own end entry to the book, which the compaction then drops too)
    a, b, c = replicas = await start_three(tmp_path, redis_url + "?ended_ttl=8", tick=0.3, idle=2.0)
    try:
        # two sessions served by B and C, two that only C ever knew (opened and served there):
        # no other replica has those live, so only the look for abandoned sessions finds them
        shared = [await open_session(a, label=f"load {n}") for n in range(2)]
        only_c = [await open_session(c, label=f"c only {n}") for n in range(2)]
        sessions = shared + only_c

        async def load(replica: Replica, token: str, calls: int) -> list[int]:
            statuses = []
            for _ in range(calls):
                try:
                    statuses.append((await replica.chat(llm.url, token, **(UNFITTABLE if _ == 3 else {})))
                                    .status_code)
                except Exception:  # the killed replica's connections break
                    statuses.append(0)
            return statuses

        work = [asyncio.ensure_future(load(replica, token, 40)) for _, token in shared for replica in (b, c)]
        on_c = [asyncio.ensure_future(load(c, token, 40)) for _, token in only_c]
        await asyncio.sleep(0.3)
        await c.kill()  # under load: its sessions are A's and B's to finalize
        await asyncio.gather(*work)
        assert any(0 in statuses for statuses in await asyncio.gather(*on_c)), "C was killed mid-load"
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        chained = {session: server.lrange(f"governor:ch:{session}", 0, -1) for session, _ in sessions}
        # no replica ends them by hand: idle past 2 s on every replica, a sweeper ends each one once
        deadline = time.monotonic() + 40
        records: dict[str, dict] = {}
        while time.monotonic() < deadline and len(records) < len(sessions):
            for session, _ in sessions:
                raw = server.get(f"governor:rec:{session}")
                if raw:
                    records[session] = json.loads(raw)
            await asyncio.sleep(0.5)
        assert len(records) == len(sessions), (sorted(records), [s for s, _ in sessions])
        for session, _ in sessions:
            record = records[session]
            verify(tmp_path, record, capsys)
            events = chained[session][1:]  # the header, then every event that was chained before
            recorded = [(e["cause"], e["action"]) for e in record["events"]]
            before = [(json.loads(line)["body"]["cause"], json.loads(line)["body"]["action"])
                      for line in events if json.loads(line)["kind"] == "event"]
            assert recorded[:len(before)] == before, "nothing chained before the kill is missing"
        await nothing_left_of_ended_sessions(server, [session for session, _ in sessions], a, b, llm)
        server.close()
    finally:
        await asyncio.gather(*[r.stop() for r in replicas])


async def nothing_left_of_ended_sessions(server: redis.Redis, ended: list[str], a: Replica, b: Replica, llm) -> None:
    """Past the retention, nothing of the ended sessions is left in Redis (keys, index members,
    book entries), the book's log compacted (an open entry forged long ago, with no chain, goes
    too, never listed); and the replicas read the compacted log: a session opened on A works on B."""
    server.rpush("governor:book", json.dumps({"op": "open", "id": "forged-in-book", "by": "principal", "at": 1,
                                              "token_sha256": "0" * 64}))

    def left(session: str) -> list[str]:
        found = list(server.scan_iter(f"governor:*{session}*"))
        found += [name for name in ("ids", "ended") if server.zscore(f"governor:{name}", session) is not None]
        found += ["chains"] if server.sismember("governor:chains", session) else []
        found += ["act"] if server.hexists("governor:act", session) else []
        found += ["book"] if any(session in line for line in server.lrange("governor:book", 0, -1)) else []
        return found

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(left(session) for session in ended + ["forged-in-book"]):
        await asyncio.sleep(0.3)
    assert {session: left(session) for session in ended + ["forged-in-book"]} == {
        session: [] for session in ended + ["forged-in-book"]}
    assert int(server.get("governor:bookgen") or 0) >= 1, "the book's log was compacted"
    later, token = await open_session(a, label="opened after the compaction")
    assert (await b.chat(llm.url, token)).status_code == 200, "B read the compacted log and what followed"
    listed = [view["session"] for view in (await b.control.get("/v1/sessions")).json()["sessions"]]
    assert later in listed and not set(ended) & set(listed), listed


async def test_a_step_held_on_b_is_approved_through_c_and_the_session_ended_on_a_holds_every_event(
        tmp_path, redis_url, llm, capsys):
    from tests.oversight_world import TOOLS, ToolThenText

    tools = ToolThenText()  # a model that asks for delete_note, which needs a reviewer's confirmation
    await tools.start()
    a, b, c = replicas = await start_three(tmp_path, redis_url)
    try:
        session, token = await open_session(a, label="held across replicas")
        assert (await c.chat(llm.url, token)).status_code == 200
        body = {"model": "gpt-4o-mini", "max_tokens": 100, "tools": TOOLS,
                "messages": [{"role": "user", "content": "tidy the notes"}]}
        held = asyncio.ensure_future(b.agent.post(f"{tools.base_url}/v1/chat/completions",
                                                  headers={"ADL-Session": token}, json=body))
        listed: list = []
        for _ in range(100):  # C lists the step B holds
            answer = await c.control.get("/v1/approvals")
            assert answer.status_code == 200, answer.text
            listed = [v for v in answer.json()["approvals"] if v["session"] == session]
            if listed or held.done():
                break
            await asyncio.sleep(0.1)
        assert listed and not held.done(), (listed, held.done() and held.result().text)
        assert listed[0]["tool"] == "delete_note"
        approved = await c.reviewer.post(f"/v1/approvals/{listed[0]['id']}",
                                         json={"decision": "approve", "reviewer": "lab lead on C"})
        assert approved.status_code == 200, approved.text
        answer = await asyncio.wait_for(held, 30)  # B's waiting request learns it and goes on
        assert answer.status_code == 200, answer.text
        calls = answer.json()["choices"][0]["message"]["tool_calls"]
        assert calls[0]["function"]["name"] == "delete_note"
        # answered once: a second answer, on any replica, is refused
        again = await a.reviewer.post(f"/v1/approvals/{listed[0]['id']}",
                                      json={"decision": "reject", "reviewer": "someone else"})
        assert again.status_code in (404, 409), again.text
        assert (await a.chat(llm.url, token)).status_code == 200
        end = await a.control.post(f"/v1/sessions/{session}/end")
        assert end.status_code == 200, end.text
        record = end.json()
        verify(tmp_path, record, capsys)
        pairs = [(e["cause"], e["action"]) for e in record["events"]]
        assert any(action == "pause" for _, action in pairs), pairs  # held on B
        assert any(e.get("detail", {}).get("reviewer") == "lab lead on C" for e in record["events"]), record["events"]
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        chain = [json.loads(line) for line in server.lrange(f"governor:ch:{session}", 0, -1)]
        assert server.hlen("governor:holds") == 0  # nothing listed as waiting any more
        server.close()
        assert [(e["seq"], e["cause"], e["action"]) for e in record["events"]] == [
            (line["body"]["seq"], line["body"]["cause"], line["body"]["action"]) for line in chain[1:-1]]
    finally:
        await asyncio.gather(*[r.stop() for r in replicas])
        await tools.stop()


async def test_a_replica_killed_9_and_restarted_finalizes_the_sessions_it_left(tmp_path, redis_url, llm, capsys):
    keys = shared_keys(tmp_path)
    alone = await Replica.start("a", tmp_path, keys, redis_url + "?timeout=0.5", tick=0.3, idle=2.0)
    restarted = None
    try:
        session, token = await open_session(alone)
        assert (await alone.chat(llm.url, token)).status_code == 200
        assert (await alone.chat(llm.url, token, **UNFITTABLE)).status_code in (403, 429)
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        chained = [json.loads(line) for line in server.lrange(f"governor:ch:{session}", 0, -1)]
        # Redis stops answering (0.5 s timeouts): a step is refused as retryable, its event kept on
        # disk, not chained (the chain is in Redis), and the replica is killed before Redis answers
        server.execute_command("CLIENT", "PAUSE", 3000, "ALL")
        deferred = await alone.chat(llm.url, token)
        assert deferred.status_code == 503, deferred.text
        refusal = deferred.json()["error"]["governor"]
        spooled = list((alone.data_dir / "sessions" / "deferred").glob("*.jsonl"))
        assert len(spooled) == 1 and session in spooled[0].read_text(), spooled
        await alone.kill()  # no other replica: its restart finds the session abandoned
        server.execute_command("CLIENT", "UNPAUSE")
        assert len(server.lrange(f"governor:ch:{session}", 0, -1)) == len(chained), "the refusal is not chained"
        assert server.get(f"governor:rec:{session}") is None
        restarted = await Replica.start("a", tmp_path, keys, redis_url + "?timeout=0.5", tick=0.3, idle=2.0)
        record = None
        deadline = time.monotonic() + 30
        while record is None and time.monotonic() < deadline:
            raw = server.get(f"governor:rec:{session}")
            record = json.loads(raw) if raw else None
            await asyncio.sleep(0.3)
        server.close()
        assert record is not None, "the restarted replica ended the session its predecessor left"
        verify(tmp_path, record, capsys)
        assert [(e["seq"], e["cause"], e["action"]) for e in record["events"]][:len(chained) - 1] == [
            (line["body"]["seq"], line["body"]["cause"], line["body"]["action"]) for line in chained[1:]]
        assert (await restarted.chat(llm.url, token)).status_code == 403  # ended: its token is refused
        # the refusal the killed process deferred is in the record, after what was chained before it
        assert len(record["events"]) == len(chained), record["events"]  # one more: the deferred refusal's event
        late = record["events"][-1]
        assert late["cause"] == refusal["cause"] == "on_governor_error", (refusal, late)
        assert "unreachable" in json.dumps(late.get("detail")).lower() or "timeout" in json.dumps(late).lower(), late
        assert not list((alone.data_dir / "sessions" / "deferred").glob("*.jsonl")), "chained: the spool is empty"
        # while Redis does not answer, an open session's record cannot be known to be current:
        # refused as retryable, never a stale copy signed (the pause runs out by itself)
        opened, _ = await open_session(restarted)
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        server.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        server.close()
        unknown = await restarted.control.get(f"/v1/sessions/{opened}/record")
        assert unknown.status_code == 503, unknown.text
        assert unknown.json()["error"]["code"] == "store_unavailable" and unknown.headers["Retry-After"] == "1"
    finally:
        await alone.stop()
        if restarted is not None:
            await restarted.stop()


async def test_three_replicas_at_once_on_one_session_hold_its_caps_chain_every_event_and_find_an_edited_state(
        tmp_path, redis_url, capsys):
    """The one-round-trip steps of shared sessions (runtime/shared_fast.py: optimistic
    concurrency on the session's saved state): calls racing on one session through three
    replicas never exceed its max_concurrent (4) at the upstream and leave its state as the
    calls left it (nothing in flight: no update lost); a storm of calls on one session ends
    with answers, never a hang, and every refusal is in the one chain that verifies; a
    state edited by hand in Redis fails the step closed and is recorded."""
    from tests.upstreams import Behaviour, MockLLM as Upstream

    class Counting(Upstream):
        in_flight = peak = 0

        async def _chat(self, request):
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                return await super()._chat(request)
            finally:
                self.in_flight -= 1

    upstream = Counting()
    await upstream.start()
    upstream.default = Behaviour(hang=0.5)  # calls overlap at the upstream
    replicas = await start_three(tmp_path, redis_url)
    server = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async def racing(token: str, per_replica: int) -> list[int]:
            calls = [replica.chat(upstream.base_url, token) for replica in replicas for _ in range(per_replica)]
            answers = await asyncio.wait_for(asyncio.gather(*calls), 60)
            return [answer.status_code for answer in answers]

        # one round trip each way for the usual call: 9 calls round robin (each replica's first
        # reply brings it the state another saved) take a fraction of the rounds' 8 scripts a call
        upstream.default = Behaviour()
        _, plain_token = await open_session(replicas[0], label="round trips")
        assert (await replicas[0].chat(upstream.base_url, plain_token)).status_code == 200

        # the step scripts counted by their SHA on MONITOR: the replicas' background scripts
        # (book reads, sweeps) run meanwhile, more of them the slower the host
        with MonitoredScripts(redis_url) as scripts:
            for replica in replicas * 3:
                assert (await replica.chat(upstream.base_url, plain_token)).status_code == 200
        one_trip = scripts.count(PRELUDE + SHARED_ADMIT) + scripts.count(PRELUDE + SHARED_SETTLE)
        rounds = scripts.count(BEGIN_ROUND)
        assert 2 * 9 <= one_trip <= 4 * 9 and rounds <= 3, (one_trip, rounds)
        upstream.default = Behaviour(hang=0.5)

        session, token = await open_session(replicas[0], label="at the concurrency cap")
        statuses = await racing(token, 4)  # 12 at once: the session allows 4 in flight (the rest wait or are refused)
        assert statuses.count(200) >= 1 and upstream.peak <= 4, (statuses, upstream.peak)
        assert set(statuses) <= {200, 429, 403, 503}, statuses
        state = json.loads(server.get(f"governor:st:{session}"))
        assert state["in_flight"] == 0, state  # every admission and settlement of every replica is in it

        upstream.default = Behaviour()
        storm, storm_token = await open_session(replicas[1], label="storm")
        answers = []
        for _ in range(2):  # waves of 18 calls at once on one session
            calls = [replica.chat(upstream.base_url, storm_token) for replica in replicas for _ in range(6)]
            answers += await asyncio.wait_for(asyncio.gather(*calls), 60)
        assert {a.status_code for a in answers} <= {200, 429, 403, 503}, [a.status_code for a in answers]
        assert any(a.status_code == 200 for a in answers)
        refusals = [a.json()["error"]["governor"]["cause"] for a in answers if a.status_code != 200]
        end = await replicas[2].control.post(f"/v1/sessions/{storm}/end")
        assert end.status_code == 200, end.text
        record = end.json()
        verify(tmp_path, record, capsys)
        causes = [event["cause"] for event in record["events"]]
        for cause in set(refusals):
            assert cause in causes, (cause, causes)
        chain = [json.loads(line) for line in server.lrange(f"governor:ch:{storm}", 0, -1)]
        assert [(e["seq"], e["cause"], e["action"]) for e in record["events"]] == [
            (line["body"]["seq"], line["body"]["cause"], line["body"]["action"]) for line in chain[1:-1]]

        # hostile: a saved state edited by hand in Redis (not a state: any replica finds it)
        edited, edited_token = await open_session(replicas[0], label="edited")
        for replica in replicas[:2]:  # served on A and B: B has it open, with the state it last saw
            assert (await replica.chat(upstream.base_url, edited_token)).status_code == 200
        for forged in ("{not json", json.dumps({"in_flight": -5})):
            server.set(f"governor:st:{edited}", forged)
            refused = await replicas[1].chat(upstream.base_url, edited_token)
            assert refused.status_code in (403, 503), refused.text
            assert refused.json()["error"]["governor"]["cause"] == "on_governor_error", refused.text
        audit = await replicas[1].control.get("/v1/audit/record")
        assert audit.status_code == 200, audit.text
        damage = [e for e in audit.json()["events"] if e["cause"] == "on_governor_session_integrity"]
        assert damage and damage[0]["detail"]["session"] == edited, audit.json()["events"]
        assert damage[0]["detail"]["reason"] == "shared_state_damaged"
    finally:
        server.close()
        await asyncio.gather(*[r.stop() for r in replicas])
        await upstream.stop()
