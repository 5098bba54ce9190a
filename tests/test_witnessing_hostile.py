"""The governor reads its witnesses' answers (governor/evidence/witnessing.py): hostile or
broken ones, from a loopback aiohttp witness, each give a proof refused with a specific
reason (fail closed), never a crash or a hang; a refusal as a fork is the alarm."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.evidence.tlog.note import CosignatureSigner, Signature, parse_note
from governor.evidence.translog import TransparencyLog
from governor.evidence.witnessing import NotWitnessed, WitnessEndpoint, Witnessing

pytestmark = pytest.mark.asyncio

WITNESS_NAME = "hostile.test/witness"


def record(n: int) -> dict:
    return {"subject": {"passport_digest": "sha256:" + "a" * 64}, "session": f"s{n}", "tier": "R1",
            "window": {"start": 1, "end": 2}, "signature": f"sig{n}"}


async def serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/add-checkpoint", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def cosign_with(signer: CosignatureSigner, body: bytes) -> bytes:
    note = parse_note(body.partition(b"\n\n")[2])
    return Signature(signer.name, signer.key_id, signer.sign(note.text)).line().encode()


THEIRS = CosignatureSigner(WITNESS_NAME, Ed25519PrivateKey.generate())
IMPOSTOR = CosignatureSigner(WITNESS_NAME, Ed25519PrivateKey.generate())


async def garbage(request):
    await request.read()
    return web.Response(text="not a signature line\n")


async def impostor(request):
    return web.Response(body=cosign_with(IMPOSTOR, await request.read()))


async def oversize(request):
    await request.read()
    return web.Response(body=b"\xff" * (1024 * 1024))


async def conflict_without_size(request):
    await request.read()
    return web.Response(status=409, text="a lot\n")


async def server_error(request):
    await request.read()
    return web.Response(status=500, text="boom\n")


async def slow(request):
    await request.read()
    await asyncio.sleep(5)
    return web.Response(text="late\n")


async def fork(request):
    await request.read()
    return web.Response(status=422, text="not consistent with the checkpoint last cosigned\n")


async def rollback(request):
    await request.read()
    return web.Response(status=409, text="1000000\n", headers={"Content-Type": "text/x.tlog.size"})


async def honest(request):
    return web.Response(body=cosign_with(THEIRS, await request.read()))


@pytest.mark.parametrize("handler, why", [
    (garbage, "not a signature line"),
    (impostor, "no cosignature that verifies under its key"),
    (oversize, "not a signature line"),
    (conflict_without_size, "a 409 without a size"),
    (server_error, "HTTP 500"),
    (slow, "unreachable"),
])
async def test_a_broken_witness_answer_withholds_the_proof_saying_why(tmp_path, handler, why):
    runner, url = await serve(handler)
    log = TransparencyLog(tmp_path, Ed25519PrivateKey.generate(), "hostile.test/log", sync=False)
    log.append(record(0))
    # a loaded machine must not turn a broken answer into a timeout: only the slow one times out
    timeout = 0.5 if handler is slow else 3
    witnessing = Witnessing(log, [WitnessEndpoint(url, THEIRS.verifier())], wait_seconds=2.5, request_timeout=timeout)
    witnessing.start()
    try:
        started = time.monotonic()
        with pytest.raises(NotWitnessed) as refused:
            await asyncio.to_thread(witnessing.prove, record(0))
        assert time.monotonic() - started < 8
        assert "have not cosigned" in str(refused.value) and why in str(refused.value)
        assert witnessing.compromised is None  # a broken witness is not evidence against the log
    finally:
        await asyncio.to_thread(witnessing.stop)
        await runner.cleanup()


@pytest.mark.parametrize("handler, why", [(fork, "HTTP 422"), (rollback, "a rollback")])
async def test_a_fork_or_rollback_refusal_is_the_alarm_and_no_proof_follows(tmp_path, handler, why):
    runner, url = await serve(handler)
    log = TransparencyLog(tmp_path, Ed25519PrivateKey.generate(), "hostile.test/log", sync=False)
    log.append(record(0))
    alarms = []
    witnessing = Witnessing(log, [WitnessEndpoint(url, THEIRS.verifier())], wait_seconds=10, request_timeout=3,
                            on_alarm=alarms.append)
    witnessing.start()
    try:
        with pytest.raises(NotWitnessed) as refused:
            await asyncio.to_thread(witnessing.prove, record(0))
        assert "refused this log" in str(refused.value) and why in str(refused.value)
        assert len(alarms) == 1 and why in alarms[0]
    finally:
        await asyncio.to_thread(witnessing.stop)
        await runner.cleanup()


async def test_an_honest_witness_gives_a_cosigned_proof_and_its_size_is_kept(tmp_path):
    runner, url = await serve(honest)
    key = Ed25519PrivateKey.generate()
    log = TransparencyLog(tmp_path, key, "hostile.test/log", sync=False)
    for n in range(3):
        log.append(record(n))
    witnessing = Witnessing(log, [WitnessEndpoint(url, THEIRS.verifier())], wait_seconds=5, request_timeout=2)
    witnessing.start()
    try:
        proof = await asyncio.to_thread(witnessing.prove, record(2))
        assert WITNESS_NAME.encode() in proof
        assert witnessing.sizes == {WITNESS_NAME: 3}
        assert (tmp_path / "log" / "witnesses.json").read_text().count('"hostile.test/witness": 3') == 1
    finally:
        await asyncio.to_thread(witnessing.stop)
        await runner.cleanup()


async def test_a_quorum_outside_the_witnesses_is_refused(tmp_path):
    log = TransparencyLog(tmp_path, Ed25519PrivateKey.generate(), "hostile.test/log", sync=False)
    endpoint = WitnessEndpoint("http://127.0.0.1:9", THEIRS.verifier())
    for quorum in (0, 2):
        with pytest.raises(ValueError, match="quorum"):
            Witnessing(log, [endpoint], quorum=quorum)
    with pytest.raises(ValueError, match="at least one"):
        Witnessing(log, [])
