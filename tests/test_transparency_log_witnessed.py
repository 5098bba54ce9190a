"""The governor uses its witnesses (issue #31): `governor witness` ×2 as real processes on
loopback, the real governor in front of the mock upstream. Every proof is at a checkpoint
the quorum cosigned and verifies offline with the witness keys; a witness down makes
proofs wait then fail closed (503) under quorum 2 and succeed under quorum 1; and the
operator's lies are each detected: a log directory replaced by a shorter copy (the
witnesses refuse, the governor says so and serves no proof), a record deleted from
DATA_DIR/records/ (`governor audit --records`), a fork shown to a second auditor
(`governor audit --since` with the first auditor's checkpoint)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from governor.evidence import ensure_governor_key
from governor.evidence.logproof import verify_logged_record
from governor.evidence.tlog.merkle import ProofError
from governor.evidence.tlog.note import Ed25519Signer, open_note, parse_note, parse_vkey
from governor.evidence.translog import default_origin
from tests.proxy_harness import real_governor
from tests.test_proxy_runtime import chat, send
from tests.test_witness import WitnessProcess

pytestmark = pytest.mark.asyncio
REPO = Path(__file__).resolve().parent.parent
SESSIONS = 50


def log_vkey(data_dir: Path) -> str:
    """The governor's log key before its first start (its key is made the same way then)."""
    key, governor_id = ensure_governor_key(data_dir, None)
    return Ed25519Signer(default_origin(governor_id), key).vkey()


def witnesses_for(tmp: Path, vkey: str, count: int = 2) -> list[WitnessProcess]:
    return [WitnessProcess(tmp / f"witness{i}", vkey).start() for i in range(count)]


def witness_settings(witnesses, **more):
    return dict(control=("127.0.0.1", 0), witnesses=tuple((w.url, w.vkey()) for w in witnesses),
                log_checkpoint_entries=1000, log_checkpoint_seconds=3600, **more)


async def end_with_proof(http, session: str) -> tuple[int, dict]:
    async with http.post(f"/v1/sessions/{session}/end?proof=1") as answer:
        return answer.status, await answer.json()


async def run_session(running, mock, session: str) -> None:
    status, _, _ = await send(running, mock, "/v1/chat/completions", chat(), session)
    assert status == 200


def governor_cli(*args, timeout=120) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "governor", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def stop_all(witnesses) -> None:
    for w in witnesses:
        if w.proc is not None and w.proc.poll() is None:
            w.stop()


async def test_fifty_sessions_every_proof_is_quorum_cosigned_and_verifies_offline(tmp_path):
    data = tmp_path / "data"
    vkey = log_vkey(data)
    witnesses = witnesses_for(tmp_path, vkey)
    keys = [parse_vkey(w.vkey()) for w in witnesses]
    try:
        async with real_governor(tmp_path / "run1", data_dir=data, **witness_settings(witnesses, witness_quorum=2)) as (running, mock):
            async with aiohttp.ClientSession(base_url=running.control_url,
                                             timeout=aiohttp.ClientTimeout(total=60)) as http:
                proofs = []
                for i in range(SESSIONS):
                    await run_session(running, mock, f"witnessed-{i}")
                    status, body = await end_with_proof(http, f"witnessed-{i}")
                    assert status == 200, body
                    proofs.append((body["record"], body["tlog_proof"].encode()))
                log_key = parse_vkey(vkey)
                for record, proof in proofs:
                    logged = verify_logged_record(record, proof, log_key, witnesses=keys, quorum=2)
                    assert sorted(logged.witnesses) == sorted(k.name for k in keys)
                # without the witnesses' keys a quorum of 2 is not met: the check is real
                with pytest.raises(ProofError):
                    verify_logged_record(proofs[0][0], proofs[0][1], log_key, witnesses=keys[:1], quorum=2)
                # the checkpoint served carries both cosignatures (the latest is cosigned in the background)
                deadline = time.monotonic() + 20
                while True:
                    async with http.get("/log/checkpoint") as answer:
                        served = await answer.read()
                    names = {s.name for s in parse_note(served).signatures}
                    if {k.name for k in keys} <= names or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                opened = open_note(served, [log_key, *keys])
                assert {k.name for k in keys} <= {s.name for s in opened.signatures}
                # witness state is persisted under DATA_DIR/log/
                sizes = json.loads((data / "log" / "witnesses.json").read_text())["sizes"]
                assert set(sizes) == {k.name for k in keys} and min(sizes.values()) >= 1
                async with http.get("/metrics") as answer:
                    assert "governor_witness_refusals_total 0.0" in await answer.text()
        # `governor verify` offline, as a counterparty runs it, on a few of them
        for n in (0, 31, SESSIONS - 1):
            record, proof = proofs[n]
            (tmp_path / f"r{n}.json").write_text(json.dumps(record))
            (tmp_path / f"r{n}.tlog-proof").write_bytes(proof)
            code, out = governor_cli("verify", tmp_path / f"r{n}.json", "--offline", "--key", data / "keys" / "governor-pub.pem",
                                     "--proof", tmp_path / f"r{n}.tlog-proof", "--log-key", vkey,
                                     "--witness-key", witnesses[0].vkey(), "--witness-key", witnesses[1].vkey(),
                                     "--quorum", "2")
            assert code == 3 and "LOG PROOF VALID" in out and "\nINCOMPLETE" in out, out  # pinned key, no passport
    finally:
        stop_all(witnesses)


async def test_a_witness_down_proofs_wait_then_503_under_quorum_2_and_succeed_under_quorum_1(tmp_path):
    data = tmp_path / "data"
    vkey = log_vkey(data)
    witnesses = witnesses_for(tmp_path, vkey)
    keys = [parse_vkey(w.vkey()) for w in witnesses]
    try:
        witnesses[1].stop()
        settings = witness_settings(witnesses, witness_quorum=2, witness_wait=2)
        async with real_governor(tmp_path / "run2", data_dir=data, **settings) as (running, mock):
            async with aiohttp.ClientSession(base_url=running.control_url,
                                             timeout=aiohttp.ClientTimeout(total=60)) as http:
                await run_session(running, mock, "one-witness-down")
                started = time.monotonic()
                status, body = await end_with_proof(http, "one-witness-down")
                waited = time.monotonic() - started
                assert status == 503, body
                assert body["error"]["code"] == "not_witnessed" and "have not cosigned" in body["error"]["message"]
                assert 1.5 <= waited < 15
                # `governor sessions end --proof` says so, and writes no proof
                await run_session(running, mock, "ended-by-cli")
                done = await asyncio.to_thread(
                    subprocess.run, [sys.executable, "-m", "governor", "sessions", "end", "ended-by-cli", "--proof",
                                     str(tmp_path / "cli.tlog-proof"), "--control-url", running.control_url,
                                     "--data-dir", str(data)],
                    cwd=REPO, capture_output=True, text=True, timeout=60)
                assert done.returncode != 0 and "not_witnessed" in done.stdout + done.stderr, done
                assert not (tmp_path / "cli.tlog-proof").exists()
                # the record itself was written: a proof is what is withheld
                assert (data / "records").exists()
        settings = witness_settings(witnesses, witness_quorum=1, witness_wait=10)
        async with real_governor(tmp_path / "run3", data_dir=data, **settings) as (running, mock):
            async with aiohttp.ClientSession(base_url=running.control_url,
                                             timeout=aiohttp.ClientTimeout(total=60)) as http:
                async with http.get("/v1/sessions/one-witness-down/record?proof=1") as answer:
                    assert answer.status == 200, await answer.text()
                    body = await answer.json()
                logged = verify_logged_record(body["record"], body["tlog_proof"].encode(), parse_vkey(vkey),
                                              witnesses=keys, quorum=1)
                assert logged.witnesses == (keys[0].name,)
                with pytest.raises(ProofError):
                    verify_logged_record(body["record"], body["tlog_proof"].encode(), parse_vkey(vkey),
                                         witnesses=keys, quorum=2)
    finally:
        stop_all(witnesses)


async def test_the_operators_lies_are_each_detected(tmp_path, caplog):
    data = tmp_path / "data"
    vkey = log_vkey(data)
    witnesses = witnesses_for(tmp_path, vkey)
    keys = [parse_vkey(w.vkey()) for w in witnesses]
    settings = witness_settings(witnesses, witness_quorum=2, witness_wait=10)
    audit_keys = ["--log-key", vkey, "--witness-key", witnesses[0].vkey(), "--witness-key", witnesses[1].vkey()]
    try:
        async with real_governor(tmp_path / "run4", data_dir=data, **settings) as (running, mock):
            async with aiohttp.ClientSession(base_url=running.control_url,
                                             timeout=aiohttp.ClientTimeout(total=60)) as http:
                for i in range(3):
                    await run_session(running, mock, f"early-{i}")
                    assert (await end_with_proof(http, f"early-{i}"))[0] == 200
        saved_log = tmp_path / "log-copy"  # the operator keeps a copy of the log as it was
        shutil.copytree(data / "log", saved_log)
        async with real_governor(tmp_path / "run5", data_dir=data, **settings) as (running, mock):
            async with aiohttp.ClientSession(base_url=running.control_url,
                                             timeout=aiohttp.ClientTimeout(total=60)) as http:
                for i in range(3):
                    await run_session(running, mock, f"late-{i}")
                    assert (await end_with_proof(http, f"late-{i}"))[0] == 200
        # a first auditor audits the log, with the records, and saves its checkpoint
        code, out = governor_cli("audit", "--log", data / "log", *audit_keys, "--records", data / "records",
                                 "--save", tmp_path / "auditor1.checkpoint")
        assert code == 0 and "CLEAN" in out, out

        # lie 1: a record deleted from DATA_DIR/records/: the log still names it
        deleted = data / "records" / "late-1.json"
        kept = deleted.read_bytes()
        deleted.unlink()
        code, out = governor_cli("audit", "--log", data / "log", *audit_keys, "--records", data / "records")
        assert code == 1 and "MISSING" in out and "late-1" in out, out
        deleted.write_bytes(kept)

        # lie 2: the log directory replaced by the shorter copy, the governor restarted
        shutil.rmtree(data / "log")
        shutil.copytree(saved_log, data / "log")
        caplog.set_level(logging.ERROR, logger="governor.evidence.witnessing")
        async with real_governor(tmp_path / "run6", data_dir=data, **settings) as (running, mock):
            async with aiohttp.ClientSession(base_url=running.control_url,
                                             timeout=aiohttp.ClientTimeout(total=60)) as http:
                for i in range(4):
                    await run_session(running, mock, f"after-rollback-{i}")
                    status, body = await end_with_proof(http, f"after-rollback-{i}")
                    assert status == 503, body
                    assert body["error"]["code"] == "not_witnessed", body
                    assert "refused" in body["error"]["message"] and "rollback" in body["error"]["message"], body
                async with http.get("/metrics") as answer:
                    assert "governor_witness_refusals_total 1.0" in await answer.text()
                # readiness reports it (traffic is still governed: not a reason to stop it)
                async with http.get("/readyz") as answer:
                    ready = await answer.json()
                assert answer.status == 200 and "rollback" in ready["witnessing"]["refused"], ready
                # and the governor's audit journal holds the event
                async with http.get("/v1/audit/record") as answer:
                    assert answer.status == 200, await answer.text()
                    audit = await answer.text()
                assert "on_governor_log_refused" in audit and "rollback" in audit
                # the checkpoint served is the log's own, with no cosignature of the witnesses
                async with http.get("/log/checkpoint") as answer:
                    served = await answer.read()
                assert not {k.name for k in keys} & {s.name for s in parse_note(served).signatures}
        assert any("REFUSED BY A WITNESS" in r.getMessage() for r in caplog.records)

        # lie 3: the forked log (7 entries, its first 3 the old ones) shown to a second auditor
        # looks whole under the log key alone; the witnesses' keys and the first auditor's
        # saved checkpoint each find it out
        code, out = governor_cli("audit", "--log", data / "log", "--log-key", vkey)
        assert code == 0, out
        code, out = governor_cli("audit", "--log", data / "log", *audit_keys)
        assert code == 1 and "SIGNATURE" in out, out
        code, out = governor_cli("audit", "--log", data / "log", "--log-key", vkey, "--since",
                                 tmp_path / "auditor1.checkpoint")
        assert code == 1 and "FORK" in out, out
    finally:
        stop_all(witnesses)


async def test_the_witness_options_reach_the_settings_and_bad_values_are_refused(tmp_path):
    from governor.cli import UsageError, build_parser
    from governor.cli.run import resolve
    from governor.evidence.tlog.note import CosignatureSigner
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    keys = []
    for n in range(2):
        path = tmp_path / f"w{n}.vkey"
        path.write_text(CosignatureSigner(f"w{n}.test/witness", Ed25519PrivateKey.generate()).vkey() + "\n")
        keys.append(path)
    parse = build_parser().parse_args
    settings = resolve(parse(["run", "--witness", f"http://127.0.0.1:7001={keys[0]}", "--witness",
                              f"http://127.0.0.1:7002={keys[1]}", "--witness-quorum", "1", "--witness-wait", "4"]),
                       environ={})
    assert [url for url, _ in settings.witnesses] == ["http://127.0.0.1:7001", "http://127.0.0.1:7002"]
    assert settings.witnesses[1][1] == keys[1].read_text().strip()
    assert (settings.witness_quorum, settings.witness_wait) == (1, 4.0)
    from_env = resolve(parse(["run"]), environ={"GOVERNOR_WITNESSES": f"http://a:1={keys[0]},http://b:2={keys[1]}"})
    assert len(from_env.witnesses) == 2 and from_env.witness_quorum is None
    (tmp_path / "not.vkey").write_text("not a vkey\n")
    for bad in (["--witness", "127.0.0.1:7001"], ["--witness", f"ftp://x={keys[0]}"],
                ["--witness", f"http://x={tmp_path / 'absent.vkey'}"], ["--witness", f"http://x={tmp_path / 'not.vkey'}"],
                ["--witness", f"http://x={keys[0]}", "--witness-quorum", "2"],
                ["--witness", f"http://x={keys[0]}", "--witness-quorum", "0"], ["--witness-wait", "-1"]):
        with pytest.raises(UsageError):
            resolve(parse(["run", *bad]), environ={})
