"""`governor witness` as a real process on a loopback port (c2sp.org/tlog-witness): a log
built with the library submits checkpoints; each answer is checked against the spec, the
cosignature verified by the library and by aics-tlog (an independent implementation), and
the state it keeps is checked across a restart and a kill -9. Hostile bodies next to the
happy ones."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import signal
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from governor.evidence.tlog.note import cosignature_timestamp, open_note, parse_note, parse_vkey
from governor.evidence.tlog.witness import AddCheckpoint, parse_add_checkpoint
from governor.witness.state import load_or_create_signer
from tests.tlog_fixtures import TestLog

try:
    import aics_tlog
except ImportError:  # pragma: no cover - .ci/dev installs it
    aics_tlog = None

REPO = Path(__file__).resolve().parent.parent


class WitnessProcess:
    def __init__(self, data_dir: Path, *log_keys: str) -> None:
        self.data_dir = data_dir
        self.log_keys = log_keys
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> "WitnessProcess":
        args = [sys.executable, "-m", "governor", "witness", "--listen", "127.0.0.1:0", "--data-dir", str(self.data_dir)]
        for key in self.log_keys:
            args += ["--log-key", key]
        self.proc = subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        seen = []
        for _ in range(200):
            line = self.proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if found:
                self.url = found.group(1)
                return self
        self.proc.kill()
        raise AssertionError("the witness did not start:\n" + "".join(seen))

    def stop(self, sig=signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=20)
        self.proc.stderr.close()
        return code

    def post(self, body: bytes, content_type: str = "text/plain") -> tuple[int, str, bytes]:
        request = urllib.request.Request(self.url + "/add-checkpoint", data=body, method="POST",
                                         headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=20) as answer:
                return answer.status, answer.headers.get("Content-Type", ""), answer.read()
        except urllib.error.HTTPError as answer:
            return answer.code, answer.headers.get("Content-Type", ""), answer.read()

    def vkey(self) -> str:
        return (self.data_dir / "witness.vkey").read_text().strip()


def add_body(old: int, proof, note: bytes) -> bytes:
    lines = [f"old {old}"] + [base64.b64encode(h).decode() for h in proof]
    body = ("\n".join(lines) + "\n\n").encode() + note
    assert AddCheckpoint(old, tuple(proof), note).encode() == body  # the library's client side agrees
    assert parse_add_checkpoint(body) == AddCheckpoint(old, tuple(proof), note)
    return body


@pytest.fixture
def log():
    return TestLog()


@pytest.fixture
def witness(tmp_path, log):
    process = WitnessProcess(tmp_path / "witness", log.signer.vkey()).start()
    yield process
    if process.proc.poll() is None:
        process.stop(signal.SIGKILL)


def submit(witness, log, old: int):
    note = log.checkpoint()
    proof = log.levels.consistency_proof(old, log.levels.size)
    return witness.post(add_body(old, proof, note)), note


def test_first_checkpoint_then_growth_are_cosigned_and_verify_with_both_implementations(witness, log):
    log.grow(5)
    (status, ctype, body), note = submit(witness, log, 0)
    assert status == 200, body
    assert ctype.startswith("text/plain")
    assert body.startswith("\u2014 ".encode()) and body.endswith(b"\n") and body.count(b"\n") == 1
    vkey = parse_vkey(witness.vkey())
    assert vkey.signature_type == 0x04 and vkey.name == "governor-witness"
    cosigned = note + body
    opened = open_note(cosigned, [log.signer.verifier(), vkey])
    assert len(opened.verified) == 2
    assert cosignature_timestamp(opened.verified[1]) > 1_700_000_000  # a real, non-zero time
    log.grow(300)  # past a full tile
    (status, _, body2), note2 = submit(witness, log, 5)
    assert status == 200, body2
    assert len(open_note(note2 + body2, [log.signer.verifier(), vkey]).verified) == 2
    # the monitoring endpoint serves the checkpoint last cosigned, with both signatures
    origin_hash = hashlib.sha256(log.origin.encode()).hexdigest()
    with urllib.request.urlopen(f"{witness.url}/{origin_hash}/checkpoint", timeout=10) as answer:
        served = answer.read()
    assert parse_note(served).text == parse_note(note2).text
    assert len(open_note(served, [log.signer.verifier(), vkey]).verified) == 2
    if aics_tlog is None:
        pytest.skip("aics-tlog (the independent C2SP implementation) is not installed: .ci/dev installs it")
    result = aics_tlog.verify_checkpoint(aics_tlog.parse_note(note2 + body2), aics_tlog.parse_vkey(log.signer.vkey()),
                                         [aics_tlog.parse_vkey(witness.vkey())], quorum=1)
    assert result.ok, result.error
    assert result.size == 305


def test_key_files_are_private_and_the_vkey_is_the_signed_note_form(witness):
    key = witness.data_dir / "witness.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert re.fullmatch(r"governor-witness\+[0-9a-f]{8}\+[A-Za-z0-9+/]+=*", witness.vkey())


def test_stale_old_size_is_409_with_the_latest_size(witness, log):
    log.grow(4)
    assert submit(witness, log, 0)[0][0] == 200
    log.grow(4)
    status, ctype, body = submit(witness, log, 2)[0]
    assert (status, ctype, body) == (409, "text/x.tlog.size", b"4\n")
    # a client that does not know the state learns it with old 0
    status, ctype, body = witness.post(add_body(0, [], log.checkpoint()))
    assert (status, ctype, body) == (409, "text/x.tlog.size", b"4\n")


def test_a_bad_consistency_proof_is_422_and_nothing_is_cosigned(witness, log):
    log.grow(6)
    assert submit(witness, log, 0)[0][0] == 200
    log.grow(5)
    proof = log.levels.consistency_proof(6, 11)
    proof[0] = bytes(32)
    status, _, body = witness.post(add_body(6, proof, log.checkpoint()))
    assert status == 422 and b"consistent" in body
    assert submit(witness, log, 6)[0][0] == 200  # the right proof still works: state unchanged


def test_a_fork_same_size_other_root_is_refused(witness, log):
    log.grow(8)
    assert submit(witness, log, 0)[0][0] == 200
    forked = log.checkpoint(root=hashlib.sha256(b"another tree").digest())
    status, _, body = witness.post(add_body(8, [], forked))
    assert status == 422, body
    # a fork that grew: a tree of 10 whose first 8 are not the cosigned ones
    other = TestLog(key=log.signer.private_key)  # another tree under the same key and origin
    for i in range(10):
        other.append(f"forged {i}".encode())
    status, _, _ = witness.post(add_body(8, other.levels.consistency_proof(8, 10), other.checkpoint()))
    assert status == 422


def test_a_rollback_is_refused(witness, log):
    log.grow(10)
    assert submit(witness, log, 0)[0][0] == 200
    smaller = log.checkpoint(size=7)
    status, ctype, body = witness.post(add_body(7, [], smaller))
    assert (status, ctype, body) == (409, "text/x.tlog.size", b"10\n")
    status, _, _ = witness.post(add_body(10, [], smaller))  # old above the checkpoint's size
    assert status == 400


def test_restart_and_kill_9_keep_the_cosigned_state(tmp_path, log):
    first = WitnessProcess(tmp_path / "w", log.signer.vkey()).start()
    vkey = first.vkey()
    log.grow(3)
    assert submit(first, log, 0)[0][0] == 200
    assert first.stop() == 0
    second = WitnessProcess(tmp_path / "w", log.signer.vkey()).start()
    assert second.vkey() == vkey
    log.grow(3)
    assert submit(second, log, 0)[0][0:3:2] == (409, b"3\n")
    (status, _, answer), note = submit(second, log, 3)
    assert status == 200
    second.proc.kill()  # kill -9 right after the answer
    second.proc.wait(timeout=10)
    second.proc.stderr.close()
    third = WitnessProcess(tmp_path / "w", log.signer.vkey()).start()
    try:
        assert third.post(add_body(3, [], log.checkpoint(size=3)))[0:3:2] == (409, b"6\n")
        state = json.loads((tmp_path / "w" / "state.json").read_text())["logs"][log.origin]
        assert state["size"] == 6
        assert base64.b64decode(state["checkpoint"]) == note + answer
    finally:
        third.stop(signal.SIGKILL)


def test_unknown_log_is_404_and_bad_signatures_are_403(witness, log):
    stranger = TestLog(origin="elsewhere.test/log")
    stranger.grow(2)
    assert witness.post(add_body(0, [], stranger.checkpoint()))[0] == 404
    impostor = TestLog(origin=log.origin)  # the right origin, another key: no trusted signature
    impostor.grow(2)
    assert witness.post(add_body(0, [], impostor.checkpoint()))[0] == 403
    log.grow(2)
    good = log.checkpoint()
    text, sigs = good.split(b"\n\n", 1)
    blob = bytearray(base64.b64decode(sigs.split(b" ")[2]))
    blob[10] ^= 1  # the trusted key's line, its signature broken
    broken = text + b"\n\n" + sigs.split(b" ")[0] + b" " + sigs.split(b" ")[1] + b" " + base64.b64encode(bytes(blob)) + b"\n"
    assert witness.post(add_body(0, [], broken))[0] == 403
    assert submit(witness, log, 0)[0][0] == 200  # nothing was recorded by the refusals


def test_size_zero_needs_the_empty_root(witness, log):
    status, _, _ = witness.post(add_body(0, [], log.checkpoint(size=0, root=hashlib.sha256(b"x").digest())))
    assert status == 422
    status, _, body = witness.post(add_body(0, [], log.checkpoint(size=0)))
    assert status == 200, body


def test_a_proof_from_old_size_zero_is_422(witness, log):
    log.grow(4)
    status, _, _ = witness.post(add_body(0, [hashlib.sha256(b"x").digest()], log.checkpoint()))
    assert status == 422


@pytest.mark.parametrize("body, why", [
    (b"", "empty"),
    (b"old 0\n", "no blank line"),
    (b"old 01\n\n", "leading zero"),
    (b"old -1\n\n", "negative"),
    (b"new 0\n\n", "no old line"),
    (b"old 0\n%%%%\n\n", "bad base64"),
    (b"old 0\nAAAA\n\n", "a proof line that is not 32 bytes"),
    (b"old 0\n" + b"\n".join([base64.b64encode(bytes(32))] * 64) + b"\n\n", "64 proof lines"),
    (b"old \xff\n\n", "not ASCII"),
    (b"old 0\n\nnot a note", "a checkpoint that is not a signed note"),
    (b"old 0\n\norigin\n1\nAAAA\n\n\xe2\x80\x94 origin AAAAAAA=\n", "a checkpoint with a short root"),
])
def test_hostile_bodies_are_400(witness, log, body, why):
    status, _, answer = witness.post(body)
    assert status == 400, (why, answer)
    assert answer  # the reason is said


def test_an_oversize_body_is_refused_without_reading_it(witness, log):
    status, _, answer = witness.post(b"old 0\n\n" + b"x" * 300_000)
    assert status == 413 and b"over" in answer
    log.grow(1)
    assert submit(witness, log, 0)[0][0] == 200  # the witness is still serving


def test_a_chunked_oversize_body_is_cut_at_the_limit(witness, log):
    connection = http.client.HTTPConnection(witness.url.removeprefix("http://"), timeout=20)
    try:
        connection.request("POST", "/add-checkpoint", body=iter([b"old 0\n\n"] + [b"y" * 65536] * 8),
                            encode_chunked=True, headers={"Content-Type": "text/plain"})
        answer = connection.getresponse()
        assert answer.status == 413 and b"over" in answer.read()
    finally:
        connection.close()
    log.grow(1)
    assert submit(witness, log, 0)[0][0] == 200


def test_concurrent_submissions_from_the_same_old_size_cosign_once(witness, log):
    log.grow(3)
    assert submit(witness, log, 0)[0][0] == 200
    log.grow(4)
    body = add_body(3, log.levels.consistency_proof(3, 7), log.checkpoint())
    statuses = []
    threads = [threading.Thread(target=lambda: statuses.append(witness.post(body)[0])) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(statuses) == [200] + [409] * 7


def test_a_wrong_content_type_is_read_as_the_body_it_is(witness, log):
    log.grow(2)
    # the protocol names no request content type; the body decides
    assert witness.post(add_body(0, [], log.checkpoint()), content_type="application/json")[0] == 200
    assert witness.post(b"{\"old\": 2}", content_type="application/json")[0] == 400


def test_a_get_on_add_checkpoint_is_refused(witness):
    try:
        urllib.request.urlopen(witness.url + "/add-checkpoint", timeout=10)
        raise AssertionError("a GET was answered")
    except urllib.error.HTTPError as answer:
        assert answer.code == 405


def test_usage_errors_exit_2(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "governor", "witness", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
    done = run("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path), "--log-key", "not+a+vkey")
    assert done.returncode == 2 and "--log-key" in done.stderr
    witness_type = TestLog()
    from governor.evidence.tlog.note import CosignatureSigner
    cosigner = CosignatureSigner("log.test", witness_type.signer.private_key)
    done = run("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path), "--log-key", cosigner.vkey())
    assert done.returncode == 2 and "Ed25519 (type 0x01)" in done.stderr
    done = run("--listen", "nowhere", "--data-dir", str(tmp_path), "--log-key", TestLog().signer.vkey())
    assert done.returncode == 2 and "HOST:PORT" in done.stderr
    load_or_create_signer(tmp_path / "named", None)
    done = run("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "named"), "--name", "other.example/w",
               "--log-key", TestLog().signer.vkey())
    assert done.returncode == 2 and "is named 'governor-witness'" in done.stderr
    (tmp_path / "state.json").write_text("{broken")
    done = run("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path), "--log-key", TestLog().signer.vkey())
    assert done.returncode == 2 and "state.json" in done.stderr
