"""kill -9 during appends under load (docs/transparency-log.md): every restart continues
the same log, consistent with every checkpoint saved before the kill, and every record
written as final is in it.

A real `governor run` (tests/restartable_governor.py) ends sessions from several clients at
once while the test saves each checkpoint it sees at /log/checkpoint; it is killed with
SIGKILL mid-load, restarted, and the restarted log is checked against every saved
checkpoint with consistency proofs computed from its tiles (by the governor's library and
by aics-tlog, which shares no code with it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
import time

import pytest
import requests

from governor.evidence.tlog import merkle, note
from governor.evidence.tlog.checkpoint import parse_checkpoint
from governor.evidence.tlog.merkle import HashLevels
from governor.evidence.translog import record_sha256
from tests.restartable_governor import CONTROL_HEADERS, GovernorProcess, write_passport

try:
    import aics_tlog
except ImportError:  # pragma: no cover - .ci/dev installs it
    aics_tlog = None

ROUNDS = 10  # the figure: ten kills during appends, each restart continuing the log
WORKERS = 4


def load(control_url: str, stop: threading.Event, saved: list[bytes], key) -> None:
    """Open and end sessions from WORKERS threads, and save every new checkpoint, until `stop`."""
    def worker() -> None:
        with requests.Session() as http:
            while not stop.is_set():
                try:
                    opened = http.post(f"{control_url}/v1/sessions", json={}, headers=CONTROL_HEADERS, timeout=10)
                    session = opened.json()["session"]
                    http.post(f"{control_url}/v1/sessions/{session}/end", headers=CONTROL_HEADERS, timeout=10)
                    seen = http.get(f"{control_url}/log/checkpoint", timeout=10).content
                except (requests.RequestException, ValueError, KeyError):
                    return  # the governor was killed
                note.open_note(seen, [key])  # a checkpoint served is always signed
                if not saved or saved[-1] != seen:
                    saved.append(seen)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)


def log_levels(log_dir) -> tuple[HashLevels, list[bytes]]:
    entries = (log_dir / "entries").read_bytes().split(b"\n")[:-1]
    levels = HashLevels()
    for entry in entries:
        levels.append(merkle.leaf_hash(entry))
    return levels, entries


def test_kill_9_during_appends_leaves_a_log_every_restart_continues(tmp_path):
    passport = write_passport(tmp_path / "passport.json")
    data = tmp_path / "data"
    extra = ("--log-checkpoint-entries", "3", "--log-checkpoint-seconds", "0.2")
    saved: list[bytes] = []
    rng = random.Random(31)
    key = None
    sizes = []
    gov = GovernorProcess(data, passport, extra=extra).start()
    try:
        for round_ in range(ROUNDS):
            key = note.parse_vkey((data / "log" / "log.vkey").read_text())
            stop = threading.Event()
            runner = threading.Thread(target=load, args=(gov.control_url, stop, saved, key), daemon=True)
            runner.start()
            time.sleep(rng.uniform(0.4, 1.5))
            gov.kill()  # SIGKILL mid-load: appends, renames and tile writes cut anywhere
            stop.set()
            runner.join(timeout=60)
            # restart (the next round's governor): the log continues, consistent with every
            # checkpoint saved so far
            gov = GovernorProcess(data, passport, extra=extra).start()
            current = requests.get(f"{gov.control_url}/log/checkpoint", timeout=10).content
            check_after_restart(data, key, current, saved, sizes)
    finally:
        gov.stop()
    print("log sizes after each restart", sizes, "checkpoints saved", len(saved))
    assert sizes == sorted(sizes) and sizes[-1] > 0
    assert len(saved) >= ROUNDS


def check_after_restart(data, key, current: bytes, saved: list[bytes], sizes: list[int]) -> None:
    head = parse_checkpoint(note.open_note(current, [key]).text)
    levels, entries = log_levels(data / "log")
    assert head.size == levels.size and head.root == levels.root()
    sizes.append(head.size)
    for seen in saved:
        old = parse_checkpoint(note.open_note(seen, [key]).text)
        assert old.size <= head.size, "a checkpoint saved before the kill is ahead of the restarted log"
        proof = levels.consistency_proof(old.size, head.size)
        merkle.verify_consistency(old.size, head.size, proof, old.root, head.root)
        if aics_tlog is not None:
            reader = aics_tlog.FileSystemTileReader(data / "log")
            theirs = aics_tlog.consistency_proof_from_tiles(reader, old.size, head.size)
            assert aics_tlog.verify_consistency(old.size, head.size, old.root, head.root, theirs)
    # every record written as final is logged, nothing waits in pending/, and each agent's
    # entries chain without a gap
    logged = {json.loads(e)["record_sha256"] for e in entries}
    for path in (data / "records").glob("*.json"):
        assert record_sha256(json.loads(path.read_bytes())) in logged, f"{path.name} is final but not logged"
    assert not list((data / "log" / "pending").iterdir())
    last: dict = {}
    for raw in entries:
        entry = json.loads(raw)
        previous = last.get(entry["passport_digest"])
        assert entry["seq"] == (0 if previous is None else previous[0] + 1)
        assert entry["prev"] == (None if previous is None else previous[1])
        last[entry["passport_digest"]] = (entry["seq"], hashlib.sha256(raw).hexdigest())
