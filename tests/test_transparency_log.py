"""The transparency log through the real governor (docs/transparency-log.md): every final
record is logged before it is written, served as C2SP tlog-tiles on the control plane and
under DATA_DIR/log/, and `?proof=1` gives a C2SP tlog-proof that verifies offline, with
the governor's library and with aics-tlog (an implementation it shares no code with).
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import jsonschema
import pytest
import pytest_asyncio

from governor.common.canonical import canonicalize
from governor.evidence.keys import KeyFiles
from governor.evidence.logproof import verify_logged_record
from governor.evidence.tlog import merkle, note, proof as tlog_proof
from governor.evidence.tlog.checkpoint import parse_checkpoint
from governor.evidence.tlog.merkle import ProofError
from governor.evidence.translog import record_sha256
from tests.proxy_harness import real_governor
from tests.test_proxy_runtime import chat, send

try:
    import aics_tlog
except ImportError:  # pragma: no cover - .ci/dev installs it
    aics_tlog = None

pytestmark = pytest.mark.asyncio(loop_scope="module")
REPO = Path(__file__).resolve().parent.parent
SESSIONS = 50


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tlog")
    async with real_governor(tmp, control=("127.0.0.1", 0), log_checkpoint_entries=1000,
                             log_checkpoint_seconds=3600) as (running, mock):
        async with aiohttp.ClientSession(base_url=running.control_url,
                                         timeout=aiohttp.ClientTimeout(total=30)) as http:
            yield running, mock, http


async def end_with_proof(http, session: str) -> tuple[dict, bytes]:
    async with http.post(f"/v1/sessions/{session}/end?proof=1") as answer:
        assert answer.status == 200, await answer.text()
        body = await answer.json()
    return body["record"], body["tlog_proof"].encode()


def log_key(running) -> note.Ed25519Verifier:
    return note.parse_vkey((running.settings.data_dir / "log" / "log.vkey").read_text())


async def test_fifty_sessions_every_record_proof_verifies_offline(env, tmp_path):
    running, mock, http = env
    proofs = []
    for i in range(SESSIONS):
        session = f"logged-{i}"
        status, _, _ = await send(running, mock, "/v1/chat/completions", chat(), session)
        assert status == 200
        proofs.append(await end_with_proof(http, session))
    key = log_key(running)
    seqs = []
    for record, data in proofs:
        logged = verify_logged_record(record, data, key)
        assert logged.entry["record_sha256"] == record_sha256(record)
        assert logged.entry["session"] == record["session"]
        seqs.append(logged.entry["seq"])
        # the record as written to DATA_DIR/records/ is the one logged
        on_disk = json.loads((running.settings.data_dir / "records" / f"{record['session']}.json").read_text())
        assert record_sha256(on_disk) == logged.entry["record_sha256"]
    # one agent (the example passport): its sequence numbers run 0, 1, 2, ... without a gap, each
    # entry naming the one before
    assert seqs == sorted(seqs) and seqs == list(range(seqs[0], seqs[0] + SESSIONS))
    entries = [json.loads(tlog_proof.parse_proof(d).extra) for _, d in proofs]
    for before, after in zip(entries, entries[1:]):
        assert after["prev"] is not None and after["seq"] == before["seq"] + 1
    # the whole chain of prev hashes checks against the served entry bundles below

    # `governor verify RECORD --proof --log-key` on one of them, as a counterparty would run it
    record, data = proofs[17]
    (tmp_path / "record.json").write_text(json.dumps(record))
    (tmp_path / "record.tlog-proof").write_bytes(data)
    public = KeyFiles(running.settings.data_dir / "keys").public_key
    command = [sys.executable, "-m", "governor", "verify", str(tmp_path / "record.json"), "--offline", "--key", str(public),
               "--proof", str(tmp_path / "record.tlog-proof"), "--log-key",
               str(running.settings.data_dir / "log" / "log.vkey")]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 3, done.stdout + done.stderr  # the proof is valid; the key pinned, not resolved
    assert "LOG PROOF VALID" in done.stdout

    # a record edited after it was logged: its proof fails, saying why; the CLI exits 1
    edited = json.loads(json.dumps(record))
    edited["outcome"] = "halted" if record["outcome"] != "halted" else "completed"
    with pytest.raises(ProofError, match="not the one logged"):
        verify_logged_record(edited, data, key)
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    command[4] = str(tmp_path / "edited.json")
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 1 and "LOG PROOF INVALID: the record is not the one logged" in done.stdout
    # another record's proof does not prove this one; nor does a proof under another log key
    with pytest.raises(ProofError):
        verify_logged_record(record, proofs[18][1], key)
    stranger = note.Ed25519Signer(key.name, __import__(
        "cryptography.hazmat.primitives.asymmetric.ed25519", fromlist=["x"]).Ed25519PrivateKey.generate())
    with pytest.raises(ProofError, match="known key"):
        verify_logged_record(record, data, stranger.verifier())


async def test_the_log_is_served_as_tiles_that_an_independent_client_checks(env):
    running, mock, http = env
    status, _, _ = await send(running, mock, "/v1/chat/completions", chat(), "tiles-check")
    assert status == 200
    record, data = await end_with_proof(http, "tiles-check")
    async with http.get("/log/checkpoint") as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        assert "max-age=31536000" not in answer.headers["Cache-Control"]
        checkpoint_note = await answer.read()
    key = log_key(running)
    opened = note.open_note(checkpoint_note, [key])
    checkpoint = parse_checkpoint(opened.text)
    assert checkpoint.size >= 1 and checkpoint.origin == key.name
    # fetch every tile the checkpoint needs, as a client of the tlog-tiles API
    from governor.evidence.tlog.tiles import tiles_for_size

    fetched = {}
    for tile in tiles_for_size(checkpoint.size):
        async with http.get("/log/" + tile.path()) as answer:
            assert answer.status == 200, tile.path()
            assert answer.headers["Cache-Control"] == "public, max-age=31536000, immutable"
            assert answer.headers["Content-Type"] == "application/octet-stream"
            fetched[tile.path()] = await answer.read()
        # the same bytes under DATA_DIR/log/, for a static web server
        assert (running.settings.data_dir / "log" / tile.path()).read_bytes() == fetched[tile.path()]
    from governor.evidence.tlog.tiles import iter_bundle

    entries = [e for path in sorted(p for p in fetched if p.startswith("tile/entries/"))
               for e in iter_bundle(fetched[path])]
    assert len(entries) == checkpoint.size
    assert merkle.tree_hash([merkle.leaf_hash(e) for e in entries]) == checkpoint.root
    # each agent's entries chain: seq 0, 1, ... and prev = SHA-256 of the agent's entry before
    last: dict = {}
    import hashlib

    schema = json.loads((REPO / "schemas" / "log-entry.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for raw in entries:
        entry = json.loads(raw)
        validator.validate(entry)
        assert canonicalize(entry) == raw  # the entry's bytes are its JCS form
        previous = last.get(entry["passport_digest"])
        assert entry["seq"] == (0 if previous is None else previous[0] + 1)
        assert entry["prev"] == (None if previous is None else previous[1])
        last[entry["passport_digest"]] = (entry["seq"], hashlib.sha256(raw).hexdigest())
    if aics_tlog is not None:
        reader = aics_tlog.MemoryTileReader(fetched)
        assert aics_tlog.tree_root_from_tiles(reader, checkpoint.size) == checkpoint.root
        parsed = tlog_proof.parse_proof(data)
        assert aics_tlog.verify_checkpoint(aics_tlog.parse_note(parsed.checkpoint_note),
                                           aics_tlog.parse_vkey(key.vkey())).ok
        their_proof = aics_tlog.inclusion_proof_from_tiles(reader, parsed.index, checkpoint.size)
        assert aics_tlog.verify_leaf_inclusion(parsed.extra, parsed.index, checkpoint.size, their_proof,
                                               checkpoint.root)
    # hostile tile paths: refused with a reason, never a file outside the log
    for bad in ("tile/0/1", "tile/../keys/governor.key", "tile/0/000.p/0", "tile/99/000", "tile/entries/x1/000"):
        async with http.get("/log/" + bad) as answer:
            assert answer.status in (400, 404), bad
            body = await answer.json()
            assert body["error"]["code"] in ("tile_path_malformed", "tile_not_found", "not_found"), (bad, body)
            assert b"PRIVATE" not in json.dumps(body).encode()
    async with http.get("/log/tile/5/000") as answer:
        assert answer.status == 404


async def test_a_running_session_has_no_proof_yet_and_an_unknown_one_none(env):
    running, mock, http = env
    status, _, _ = await send(running, mock, "/v1/chat/completions", chat(), "still-running")
    assert status == 200
    async with http.get("/v1/sessions/still-running/record?proof=1") as answer:
        assert answer.status == 409
        assert "has not ended" in await answer.text()
    async with http.get("/v1/sessions/never-was/record?proof=1") as answer:
        assert answer.status == 404
    async with http.post("/v1/sessions/still-running/end") as answer:
        assert answer.status == 200
    async with http.get("/v1/sessions/still-running/record?proof=1") as answer:
        assert answer.status == 200
        body = await answer.json()
    verify_logged_record(body["record"], body["tlog_proof"].encode(), log_key(running))


async def test_sessions_end_with_proof_writes_a_proof_that_governor_verify_accepts(env, tmp_path):
    running, mock, http = env
    status, _, _ = await send(running, mock, "/v1/chat/completions", chat(), "ended-by-cli")
    assert status == 200
    proof_file = tmp_path / "ended.tlog-proof"
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "governor", "sessions", "end", "ended-by-cli", "--proof", str(proof_file),
                         "--control-url", running.control_url, "--data-dir", str(running.settings.data_dir)],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "its log proof is in" in done.stdout
    record_file = tmp_path / "ended.tlog-proof.record.json"
    public = KeyFiles(running.settings.data_dir / "keys").public_key
    command = [sys.executable, "-m", "governor", "verify", str(record_file), "--offline", "--key", str(public), "--proof",
               str(proof_file), "--log-key", (running.settings.data_dir / "log" / "log.vkey").read_text().strip(),
               "--json"]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 3, done.stdout + done.stderr  # the proof is valid; the key pinned, not resolved
    report = json.loads(done.stdout)
    assert report["log_proof"]["valid"] and report["log_proof"]["entry"]["session"] == "ended-by-cli"
    # usage errors: a proof without a log key, a witness quorum above the keys given
    for extra in (["--proof", str(proof_file)], ["--proof", str(proof_file), "--log-key", "not-a-vkey"],
                  ["--log-key", "x"]):
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "governor", "verify", str(record_file),
                                                        "--offline", "--key", str(public), *extra],
                                       capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
    # a witness the checkpoint does not carry: a quorum of 1 fails, as the witness slice will rely on
    witness = note.CosignatureSigner("witness.example/w", __import__(
        "cryptography.hazmat.primitives.asymmetric.ed25519", fromlist=["x"]).Ed25519PrivateKey.generate())
    done = await asyncio.to_thread(subprocess.run, command[:-1] + ["--witness-key", witness.verifier().vkey()],
                                   capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 1 and "0 of the required 1 witness cosignatures" in done.stdout
