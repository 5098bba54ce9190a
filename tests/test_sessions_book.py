"""The session book by itself (governor/sessions/book.py): resolving tokens and names, the agent-named
cap over a rolling day, the default session, persistence across a restart (a torn last line
set aside, damage refused), and the `governor run` settings that configure it."""

from __future__ import annotations

import argparse
import os

import pytest

from governor.cli import UsageError
from governor.cli.run import ensure_control_token, resolve
from governor.proxy.server import Settings, StartupError, serve
from governor.sessions.book import SessionBook
from governor.sessions.entries import DAY, Refusal, SessionBookError
from governor.sessions.lock_causes import parse_lock_causes


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def codes(*results) -> list[str]:
    return [r.code if isinstance(r, Refusal) else "ok" for r in results]


def test_tokens_resolve_and_everything_else_is_refused(tmp_path):
    book = SessionBook(tmp_path)
    entry, token = book.open(label="job 7")
    assert book.resolve(token) == entry.id
    assert codes(book.resolve(entry.id), book.resolve("adls_" + "x" * 32), book.resolve(token[:-1]),
                 book.resolve("adls_" + "x" * 33), book.resolve("\x00" * 40)) == [
        "session_token_malformed", "session_unknown", "session_token_malformed", "session_token_malformed",
        "session_token_malformed"]
    assert book.resolve(None).code == "session_token_required"  # auto: a principal opened one
    book.ended(entry.id, "on_budget_exhausted")
    ended = book.resolve(token)
    assert ended.code == "session_ended" and ended.cause == "on_budget_exhausted" and "halted" in ended.message
    assert book.refusals["session_token_malformed"] == 4


def test_the_book_survives_a_restart_and_sets_a_torn_line_aside(tmp_path):
    book = SessionBook(tmp_path)
    live, live_token = book.open()
    gone, gone_token = book.open(nonce="n" * 22)
    book.ended(gone.id, None)
    lock = book.lock(live.id, "on_governor_session_integrity")
    with open(tmp_path / "sessions" / "book.jsonl", "ab") as fh:
        fh.write(b'{"op": "open", "id": "half')  # the write a crash cut short
    again = SessionBook(tmp_path)
    assert again.resolve(live_token).code == "agent_locked" and again.locked
    assert again.locks[lock.id].session == live.id
    assert again.nonce(gone.id) == "n" * 22
    assert not (tmp_path / "sessions" / "book.jsonl").read_text().count(live_token)  # tokens kept only hashed
    assert [p.read_bytes() for p in (tmp_path / "sessions").glob("book.jsonl.torn-*")] == [b'{"op": "open", "id": "half']
    third, _ = again.open()  # appends after the cut line: the book still reads
    later = SessionBook(tmp_path)
    assert later.get(third.id) is not None and later.locked


def test_a_book_of_many_ended_sessions_is_compacted_and_keeps_what_holds(tmp_path):
    """The log is rewritten at start-up without what no longer matters (sessions ended past
    the retention, opening/ending pairs merged), crash-safe, and a restart from the compacted
    log restores the open sessions, the locks (in force and lifted) and the halted default."""
    clock = Clock()
    book = SessionBook(tmp_path, mode="agent-named", default="on", clock=clock, lock_causes=("on_loop_detected",))
    for _ in range(300):
        entry, _ = book.open(label="batch job")
        book.ended(entry.id, None)
    for i in range(100):
        book.ended(book.resolve(f"agent-run-{i}"), "on_budget_exhausted")
    default = book.resolve(None)
    book.ended(default, "on_loop_detected")
    lifted = book.lock(default, "on_loop_detected")
    lifted.lifted_by, lifted.lifted_at = "alice", clock.now  # (lift() records through the runtime)
    book._active.clear()
    book._append({"op": "lift", "id": lifted.id, "by": "alice", "at": clock.now})
    clock.now += 2 * DAY  # all of the above ended two days ago
    live, live_token = book.open(label="still running", nonce="n" * 22)
    recent, recent_token = book.open()
    book.ended(recent.id, "on_budget_exhausted")
    kept_agent = book.resolve("agent-today")
    lock = book.lock(live.id, "on_loop_detected")
    log = tmp_path / "sessions" / "book.jsonl"
    before = log.stat().st_size
    (tmp_path / "sessions" / ".book.jsonl.x1y2.tmp").write_bytes(b'{"op": "open", "id": "a compaction cut sh')

    again = SessionBook(tmp_path, mode="agent-named", default="on", clock=clock)
    after = log.stat().st_size
    assert after < before / 10, (before, after)
    assert [p.name for p in (tmp_path / "sessions").iterdir()] == ["book.jsonl"]  # the cut compaction: gone
    # what holds is restored: the open session, its nonce and label, the lock in force
    assert again.locked and again.locks[lock.id].session == live.id
    assert again.resolve(live_token).code == "agent_locked"
    again._active.clear()
    assert again.resolve(live_token) == live.id and again.nonce(live.id) == "n" * 22
    assert again.get(live.id).label == "still running"
    # the lifted lock and who lifted it; the halted default session
    assert again.locks[lifted.id].lifted_by == "alice" and not again.locks[lifted.id].active
    assert again.resolve(None).code == "default_session_halted"
    # a session ended within the retention is still refused as ended; one long gone as unknown
    assert again.resolve(recent_token).code == "session_ended"
    assert again.get(kept_agent).by == "agent" and again.get("agent-run-7") is None
    # the agent-named cap still counts today's opening
    assert len(again._agent_openings) == 1
    # a second start finds nothing to compact, and the compacted log reads like any other
    third = SessionBook(tmp_path, mode="agent-named", default="on", clock=clock)
    assert log.stat().st_size == after and third.locked and third.nonce(live.id) == "n" * 22


def test_a_running_book_compacts_itself_past_a_size(tmp_path):
    """A long-running governor's log does not grow without bound: past `compact_min_lines`
    (then past double its last compacted size) the book is rewritten, the line being
    appended included, and nothing it holds is lost."""
    clock = Clock()
    book = SessionBook(tmp_path, clock=clock, compact_min_lines=50, ended_retention=60)
    tokens = []
    for i in range(400):
        entry, token = book.open(label=f"job {i}")
        clock.now += 1
        if i % 10:
            book.ended(entry.id, None)
        else:
            tokens.append((entry.id, token))  # every tenth stays open
    lines = (tmp_path / "sessions" / "book.jsonl").read_bytes().count(b"\n")
    assert lines < 250, lines  # 400 openings and 360 ends were appended
    again = SessionBook(tmp_path, clock=clock)
    assert all(again.resolve(token) == session for session, token in tokens)
    assert again.get(tokens[0][0]).label == "job 0"


async def test_a_damaged_book_refuses_to_start(tmp_path):
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "book.jsonl").write_text('{"op": "open"}\n{"op": "lock"}\n')
    with pytest.raises(SessionBookError, match="line 1"):
        SessionBook(tmp_path)
    with pytest.raises(StartupError, match="sessions: .*book.jsonl line 1"):
        await serve(Settings(listen=("127.0.0.1", 0), control=None, data_dir=tmp_path))


def test_agent_named_cap_is_a_rolling_day_and_its_hit_is_recorded_once():
    clock = Clock()
    book = SessionBook(None, mode="agent-named", agent_sessions_per_day=3, clock=clock)
    assert [book.resolve(f"n{i}") for i in range(3)] == ["n0", "n1", "n2"]
    first, second = book.resolve("n3"), book.resolve("n4")
    assert first.code == second.code == "session_cap"
    assert first.audit is not None and first.audit["limit"] == 3 and second.audit is None
    assert book.resolve("n0") == "n0"  # an opened name goes on
    clock.now += DAY - 1
    assert book.resolve("n5").code == "session_cap"
    clock.now += 2
    assert book.resolve("n5") == "n5"  # the first three left the window
    assert book.resolve("n6") == "n6" and book.resolve("n7") == "n7"
    assert book.resolve("n8").audit is not None  # a new saturation: recorded again
    assert book.resolve("x" * 201).code == "session_name_malformed"
    assert book.resolve("tab\there").code == "session_name_malformed"
    # no agent-named session reaches a process-local session's space in Redis (store/redis.py LOCAL_SESSIONS)
    assert book.resolve("local\x1fn0").code == "session_name_malformed"


def test_an_agent_name_cannot_claim_a_principal_or_default_session():
    book = SessionBook(None, mode="agent-named", default="on")
    entry, _ = book.open()
    default = book.resolve(None)
    assert book.resolve(entry.id).code == "session_name_taken"
    assert book.resolve(default).code == "session_name_taken"


def test_the_default_session_name_and_its_renewal(tmp_path):
    book = SessionBook(tmp_path, default="on", default_name="bench")
    assert book.resolve(None) == "bench"
    book.ended("bench", None)
    assert book.resolve(None) == "bench-2"
    book.ended("bench-2", "on_loop_detected")
    assert book.resolve(None).code == "default_session_halted"
    restarted = SessionBook(tmp_path, default="on", default_name="bench")
    assert restarted.resolve(None).code == "default_session_halted"  # a restart frees nothing
    restarted.ended_by_principal("bench-2")
    assert restarted.resolve(None) == "bench-3"  # names used before are never reopened
    assert SessionBook(tmp_path, default="on", default_name="bench").resolve(None) == "bench-4"
    assert SessionBook(None, default="off").resolve(None).code == "session_token_required"


def test_lock_causes_setting():
    assert parse_lock_causes("none") == ()
    assert parse_lock_causes("on_governor_session_integrity, on_anomaly") == ("on_governor_session_integrity", "on_anomaly")
    with pytest.raises(ValueError):
        parse_lock_causes("halt-everything")
    # a typo of a real cause is refused, naming the known ones (it would disable the lock)
    with pytest.raises(ValueError, match="on_governor_session_integrity"):
        parse_lock_causes("on_session_integirty")
    assert parse_lock_causes(["on_budget_exhausted", "on_governor_tool_denied"]) == ("on_budget_exhausted", "on_governor_tool_denied")
    book = SessionBook(None, lock_causes=("on_anomaly",))
    assert book.lock("s", "on_budget_exhausted") is None and not book.locked
    assert book.lock("s", "on_anomaly") is not None and book.lock("s", "on_anomaly") is None


def _args(**values) -> argparse.Namespace:
    from governor.cli.run import OPTIONS

    return argparse.Namespace(**{name: values.get(name) for name in OPTIONS})


def test_governor_run_session_settings(tmp_path):
    config = tmp_path / "governor.yaml"
    config.write_text("default_session: off\nlock_on: [on_anomaly]\nagent_sessions_per_day: 5\n")
    settings = resolve(_args(config=str(config), sessions="agent-named"), environ={})
    assert (settings.sessions, settings.default_session, settings.lock_on, settings.agent_sessions_per_day) == (
        "agent-named", "off", ("on_anomaly",), 5)
    for bad in ({"sessions": "anyone"}, {"default_session": "maybe"}, {"agent_sessions_per_day": "-1"},
                {"agent_sessions_per_day": "many"}, {"lock_on": "everything"}):
        with pytest.raises(UsageError):
            resolve(_args(**bad), environ={})


def test_governor_run_writes_a_control_token_file_once(tmp_path):
    settings = Settings(data_dir=tmp_path / "d")
    path = ensure_control_token(settings)
    assert path == tmp_path / "d" / "control-token" and os.stat(path).st_mode & 0o777 == 0o600
    token = settings.control_token
    assert token and len(token) >= 32
    again = Settings(data_dir=tmp_path / "d")
    assert ensure_control_token(again) == path and again.control_token == token
    configured = Settings(data_dir=tmp_path / "e", control_token="x" * 20)
    assert ensure_control_token(configured) is None and not (tmp_path / "e").exists()
    assert ensure_control_token(Settings(data_dir=tmp_path / "f", control=None)) is None
