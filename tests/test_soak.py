"""The short variant of the bounded soak (bench/soak.py): honest traffic through a real
`governor run` under nofile=1024 beside half-open, dribbling, oversized, bad-header and
control-plane-flood clients. No honest request fails; the open files and memory the
governor holds come back to about where they started (issue 20)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_short_soak(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(BENCH / "soak.py"), "--duration", "15", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    honest, governor, hostile = result["honest"], result["governor"], result["hostile"]
    assert honest["errors"] == 0, honest["error_samples"]
    assert honest["answered"] >= 0.5 * result["rate_per_s"] * result["duration_s"] * 0.5, honest
    # the hostile clients really ran, and the governor closed their connections itself
    assert hostile["half_open"]["closed_by_governor"] >= 300
    assert hostile["dribbler"]["closed_by_governor"] >= 100
    assert sum(hostile["listing_flood"].values()) > 10 and set(hostile["listing_flood"]) == {"200"}
    # bounded: never near the descriptor limit, and back to the start once the deadlines passed
    assert governor["max_open_files"] < result["nofile"] - 64, governor
    assert governor["end"]["open_files"] <= governor["start"]["open_files"] + 16, governor
    assert governor["end"]["rss_mb"] <= governor["start"]["rss_mb"] + 64, governor
    print(done.stdout)
