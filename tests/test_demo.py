"""`governor demo`: the real command, in a subprocess, on loopback; and its terminal rendering."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from governor.demo.render import Meter, Terminal, bar
from governor.passport import example_passport_path, load_passport, passport_digest

REPO = Path(__file__).resolve().parent.parent
MAIN = "import sys; from governor.cli import main; sys.exit(main(sys.argv[1:]))"
HANG_GUARD_SEC = 180  # not a timing assertion: only stops a hung demo from hanging the suite


def governor(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", MAIN, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def demo():
    """One `governor demo --fast --keep` run: (completed process, kept directory)."""
    done = governor("demo", "--fast", "--keep", timeout=HANG_GUARD_SEC)
    kept = re.search(r"^Kept the demo's files in (\S+)$", done.stdout, re.MULTILINE)
    workdir = Path(kept.group(1)) if kept else None
    yield done, workdir
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def test_demo_exits_0(demo):
    done, _ = demo
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "demo FAILED" not in done.stdout


def test_demo_shows_the_admission_and_the_passport_digest(demo):
    out = demo[0].stdout
    assert "ADMITTED" in out
    expected = passport_digest(load_passport(example_passport_path()))
    assert f"digest: {expected}" in out


def test_demo_shows_the_token_budget_rising_to_its_cap(demo):
    out = demo[0].stdout
    used = [int(n.replace(",", "")) for n in re.findall(r"tokens \S+ ([\d,]+) / 20,000", out)]
    assert len(used) >= 4, out
    assert used == sorted(used) and len(set(used)) == len(used), f"not strictly rising: {used}"
    assert used[0] == 2500 and used[-1] == 20000, used
    costs = [float(c) for c in re.findall(r"cost_usd \S+ \$([\d.]+) / \$0\.50", out)]
    assert len(costs) == len(used) and costs[-1] > costs[0] > 0, costs


def test_demo_holds_delete_note_until_the_reviewer_approves(demo):
    out = demo[0].stdout
    held = out.index("delete_note is held for a reviewer")
    listed = out.index("trigger      tools.delete_note.requires_confirmation", held)
    approved = out.index("answer       approve by demo reviewer: approved", listed)
    ran = out.index("→ deleted /workspace/notes/old-draft.md", approved)
    assert held < listed < approved < ran


def test_demo_is_halted_by_the_token_budget(demo):
    out = demo[0].stdout
    assert re.search(r"model #9\s+refused: HTTP 429, ADL-Governor-Action: halt", out), out
    assert 'cause        "on_budget_exhausted"' in out
    assert 'dimension    "tokens"' in out
    assert 'scope        "per_session"' in out
    assert "limit        20000" in out
    assert "The mock LLM served 8 calls" in out
    assert "halted (on_budget_exhausted)" in out


def test_demo_verifies_the_record_offline(demo):
    out = demo[0].stdout
    assert re.search(r"PASS\s+3 signature", out)
    assert re.search(r"PASS\s+4 passport binding", out)
    assert re.search(r"PASS\s+5 nonce", out) and re.search(r"PARTIAL\s+2 governor key", out)
    assert re.search(r"PASS\s+6 hash chain", out)
    # everything ran but the key's resolution: the demo publishes no did:web
    assert "\n     INCOMPLETE: not every step ran in full: 2 (governor key) partial\n" in out
    assert "the record verified" in out
    assert "does NOT prove completeness" in out


def test_kept_record_verifies_with_governor_verify(demo):
    done, workdir = demo
    assert workdir is not None, f"--keep did not print the kept directory:\n{done.stdout}"
    record_file, public_key = workdir / "record.json", workdir / "governor-public.pem"
    record = json.loads(record_file.read_text())
    assert record["outcome"] == "halted"
    assert [(e["cause"], e["action"]) for e in record["events"] if e["cause"] != "on_anomaly"] == [
        ("on_governor_oversight_trigger", "pause"), ("on_governor_oversight_trigger", "pause"),
        ("on_governor_budget_warning", "continue"), ("on_budget_exhausted", "halt")]  # the warning, then the cap

    checked = governor("verify", str(record_file), "--offline", "--key", str(public_key))
    assert checked.returncode == 3, checked.stdout + checked.stderr  # pinned key, no passport, no nonce decision
    assert "INCOMPLETE" in checked.stdout and "FAIL" not in checked.stdout
    assert "Events (" not in checked.stdout

    # --events lists every event of the real record, one a line, in order
    listed = governor("verify", str(record_file), "--offline", "--key", str(public_key), "--events")
    assert listed.returncode == 3, listed.stdout + listed.stderr
    lines = listed.stdout[listed.stdout.index(f"Events ({len(record['events'])})"):].splitlines()[1:]
    assert len(lines) == len(record["events"])
    for line, event in zip(lines, record["events"]):
        assert line.split()[:4] == [str(event["seq"]), event["at"], event["cause"], event["action"]], line
    assert '"dimension":"tokens"' in lines[-1] and record["events"][-1]["detail"]["limit"] == 20000

    # the verdict is real: the same record with one event changed is rejected
    record["events"][-1]["action"] = "continue"
    tampered = workdir / "tampered.json"
    tampered.write_text(json.dumps(record))
    rejected = governor("verify", str(tampered), "--offline", "--key", str(public_key))
    assert rejected.returncode == 1, rejected.stdout + rejected.stderr
    assert "INVALID" in rejected.stdout


def test_demo_without_keep_removes_its_temporary_directory():
    done = governor("demo", "--fast", timeout=HANG_GUARD_SEC)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    data_dir = re.search(r"^   data dir   (\S+)  \(temporary", done.stdout, re.MULTILINE)
    assert data_dir is not None, done.stdout
    assert not Path(data_dir.group(1)).parent.exists()
    assert "Kept the demo's files" not in done.stdout


# --- rendering -----------------------------------------------------------------------


def test_bar_fills_in_eighths():
    assert bar(0, 4) == "░░░░"
    assert bar(1, 4) == "████"
    assert bar(2.5, 4) == "████"  # over the limit: full, never longer
    assert bar(0.5, 4) == "██░░"
    assert bar(1 / 32, 4) == "▏░░░"
    assert all(len(bar(i / 100, 7)) == 7 for i in range(101))


async def test_meters_off_a_terminal_are_one_plain_line_per_update():
    out = io.StringIO()
    term = Terminal(out, live=False, pace=False)
    for used in (2500, 5000):
        await term.meters([Meter("tokens", used, 20000), Meter("cost_usd", used / 1e6, 0.5)])
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in out.getvalue()
    assert "2,500 / 20,000" in lines[0] and "5,000 / 20,000" in lines[1]


async def test_meters_on_a_terminal_are_redrawn_in_place_below_new_lines():
    out = io.StringIO()
    term = Terminal(out, live=True, color=False, pace=False)
    await term.meters([Meter("tokens", 2500, 20000)])
    term.say("model #2")
    await term.meters([Meter("tokens", 5000, 20000)])
    text = out.getvalue()
    # the one-line footer is erased (cursor up 1, clear) before the new line and before each redraw
    assert text.count("\x1b[1F\x1b[J") == 2
    first = f"   tokens     {bar(0.125, 28)}  2,500 / 20,000   12%\n"
    second = f"   tokens     {bar(0.25, 28)}  5,000 / 20,000   25%\n"
    assert text == first + "\x1b[1F\x1b[J" + "model #2\n" + first + "\x1b[1F\x1b[J" + second
