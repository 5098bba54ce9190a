"""Budget warnings as events in the signed record (#32 item 7): through the real proxy and
the real runtime (the bundled passport: 20,000 tokens a session, warned at 80 %), with the
official openai SDK in a subprocess. Before, a warning was a log line and a webhook only."""

from __future__ import annotations

import asyncio

from governor.evidence.verify import verify_record
from tests.proxy_harness import real_governor, run_python, sdk_environment
from tests.upstreams import Behaviour

CHATS = """
import json, openai
client = openai.OpenAI(timeout=30, max_retries=0)
out = []
for i in range({n}):
    try:
        r = client.chat.completions.create(model="gpt-4o-mini", max_tokens=64, extra_headers={{"ADL-Session": "{session}"}},
                                           messages=[{{"role": "user", "content": f"question {{i}}"}}])
        out.append(r.usage.total_tokens)
    except openai.APIStatusError as e:
        out.append(e.status_code)
print(json.dumps(out))
"""


def warnings_of(record: dict) -> list[dict]:
    return [e for e in record["events"] if e["cause"] == "on_governor_budget_warning"]


async def test_a_budget_warning_is_recorded_once_in_the_signed_record(tmp_path):
    async with real_governor(tmp_path) as (running, mock):
        # 9,000 tokens (45 %), then 8,000 (85 %: the warning), then 500 (still under the cap)
        mock.script(Behaviour(input_tokens=8000, output_tokens=1000), Behaviour(input_tokens=7000, output_tokens=1000),
                    Behaviour(input_tokens=400, output_tokens=100))
        out = await run_python(CHATS.format(n=3, session="spender"), sdk_environment(running, mock))
        assert out == [9000, 8000, 500]
        record = await running.runtime.end_session("spender")
        key = running.runtime.key.public_key()
    (warning,) = warnings_of(record)
    detail = warning["detail"]
    assert warning["action"] == "continue" and "overridden_cause" not in detail and detail["warning"] is True
    assert (detail["dimension"], detail["scope"], detail["limit"], detail["threshold"]) == ("tokens", "per_session", 20000, 0.8)
    assert detail["fraction"] >= 0.8 and detail["observed"] >= 16000
    assert record["outcome"] == "completed" and verify_record(record, public_key=key).ok


async def test_concurrent_calls_crossing_the_threshold_record_one_warning(tmp_path):
    """Hostile: four calls at once, each enough to cross 80 %; the session's lock orders them,
    so the warning is recorded once, not once per racing call. Four: the bundled passport's
    `max_concurrent` (a fifth call in flight at once is refused, which is not what this checks)."""
    async with real_governor(tmp_path) as (running, mock):
        mock.script(Behaviour(input_tokens=15000, output_tokens=1000))
        assert await run_python(CHATS.format(n=1, session="racer"), sdk_environment(running, mock)) == [16000]
        mock.script(*[Behaviour(input_tokens=100, output_tokens=50)] * 4)
        runs = [run_python(CHATS.format(n=1, session="racer"), sdk_environment(running, mock)) for _ in range(4)]
        outs = await asyncio.gather(*runs)
        assert all(out == [150] for out in outs), outs
        record = await running.runtime.end_session("racer")
    assert len(warnings_of(record)) == 1


async def test_an_answer_that_jumps_past_the_cap_records_the_boundary_and_no_late_warning(tmp_path):
    """Hostile: an upstream reporting far more than was reserved: the boundary is recorded,
    not a warning after the cap was already crossed."""
    async with real_governor(tmp_path) as (running, mock):
        mock.script(Behaviour(input_tokens=100, output_tokens=30000))
        await run_python(CHATS.format(n=1, session="jumper"), sdk_environment(running, mock))
        record = await running.runtime.end_session("jumper")
    causes = [e["cause"] for e in record["events"]]
    assert "on_budget_exhausted" in causes and "on_governor_budget_warning" not in causes
