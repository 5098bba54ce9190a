"""The transparency log's flags, each on a governor of its own (docs/transparency-log.md):
`--log-require-token yes` puts /log/ behind the control token; `--log off` keeps no log."""

from __future__ import annotations

import aiohttp
import pytest

from tests.proxy_harness import real_governor

pytestmark = pytest.mark.asyncio


async def test_the_log_can_require_the_control_token(tmp_path):
    async with real_governor(tmp_path, control=("127.0.0.1", 0), control_token="transparency-log-token-31",
                             log_require_token=True) as (running, mock):
        async with aiohttp.ClientSession(base_url=running.control_url) as http:
            async with http.get("/log/checkpoint") as answer:
                assert answer.status == 401
            async with http.get("/log/checkpoint", headers={"Authorization": "Bearer transparency-log-token-31"}) as answer:
                assert answer.status == 200
                assert (await answer.read()).startswith(running.runtime.transparency_log.origin.encode())


async def test_with_the_log_off_there_is_no_log_and_no_proof(tmp_path):
    async with real_governor(tmp_path, control=("127.0.0.1", 0), log=False) as (running, mock):
        assert not (running.settings.data_dir / "log").exists()
        async with aiohttp.ClientSession(base_url=running.control_url) as http:
            async with http.get("/log/checkpoint") as answer:
                assert answer.status == 404
