"""The embedded state store across governor restarts, end to end: the rolling day's budget
used before a stop still counts after a start on the same data directory, and one data
directory has one governor (a second one is refused with a message saying why and what
to do)."""

from __future__ import annotations

import httpx
import pytest

from governor.policy import Tier
from governor.proxy.server import Settings, StartupError, serve
from tests.proxy_harness import AGENT_NAMED


def used(view: dict, dimension: str, scope: str) -> float:
    [budget] = [b for b in view["budgets"] if (b["dimension"], b["scope"], b["persona"]) == (dimension, scope, None)]
    return budget["used"]


async def chat(running, llm, session: str) -> httpx.Response:
    async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as agent:
        return await agent.post(f"{llm.url}/chat/completions", headers={"ADL-Session": session},
                                json={"model": "gpt-4o-mini", "max_tokens": 100,
                                      "messages": [{"role": "user", "content": "find papers on governance"}]})


async def session_view(running, session: str) -> dict:
    async with httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30) as control:
        answer = await control.get(f"/v1/sessions/{session}")
        assert answer.status_code == 200, answer.text
        return answer.json()


async def test_budgets_survive_a_restart_and_a_data_directory_has_one_governor(tmp_path, llm):
    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path / "data", tier=Tier.R3)
    running = await serve(settings)
    try:
        for _ in range(3):
            assert (await chat(running, llm, "carried")).status_code == 200
        before = await session_view(running, "carried")
        assert used(before, "tokens", "per_session") == 3 * 150
        assert used(before, "tokens", "per_day") == 3 * 150

        with pytest.raises(StartupError) as refused:  # a second governor on the same state
            await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=settings.data_dir))
        message = str(refused.value)
        assert "state.db" in message and "one governor process owns" in message and "redis" in message.lower()
    finally:
        await running.stop()

    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=settings.data_dir,
                                   tier=Tier.R3))
    try:
        ended = await chat(running, llm, "carried")  # stopping the governor ended its sessions
        assert ended.status_code != 200 and "session_ended" in ended.text
        assert (await chat(running, llm, "fresh")).status_code == 200
        fresh = await session_view(running, "fresh")
        assert used(fresh, "tokens", "per_session") == 150
        assert used(fresh, "tokens", "per_day") == 4 * 150  # the agent's day still holds the three before
        assert llm.served == 4
    finally:
        await running.stop()
