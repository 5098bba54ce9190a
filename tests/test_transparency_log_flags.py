"""The transparency log's flags, each on a governor of its own (docs/transparency-log.md):
`--log-access token` puts /log/ behind the control token; `--log off` keeps no log."""

from __future__ import annotations

import aiohttp
import pytest

from tests.proxy_harness import real_governor


@pytest.mark.asyncio
async def test_the_log_can_require_the_control_token(tmp_path):
    async with real_governor(tmp_path, control=("127.0.0.1", 0), control_token="transparency-log-token-31",
                             log_require_token=True) as (running, mock):
        async with aiohttp.ClientSession(base_url=running.control_url) as http:
            async with http.get("/log/checkpoint") as answer:
                assert answer.status == 401
            async with http.get("/log/checkpoint", headers={"Authorization": "Bearer transparency-log-token-31"}) as answer:
                assert answer.status == 200
                assert (await answer.read()).startswith(running.runtime.transparency_log.origin.encode())


@pytest.mark.asyncio
async def test_with_the_log_off_there_is_no_log_and_no_proof(tmp_path):
    async with real_governor(tmp_path, control=("127.0.0.1", 0), log=False) as (running, mock):
        assert not (running.settings.data_dir / "log").exists()
        async with aiohttp.ClientSession(base_url=running.control_url) as http:
            async with http.get("/log/checkpoint") as answer:
                assert answer.status == 404


def test_the_log_options_reach_the_settings_and_bad_values_are_refused():
    from governor.cli import UsageError, build_parser
    from governor.cli.run import resolve

    parse = build_parser().parse_args
    settings = resolve(parse(["run", "--log-origin", "gov.example/log", "--log-checkpoint-entries", "16",
                              "--log-checkpoint-seconds", "2.5", "--log-access", "token"]), environ={})
    assert (settings.log, settings.log_origin, settings.log_checkpoint_entries, settings.log_checkpoint_seconds,
            settings.log_require_token) == (True, "gov.example/log", 16, 2.5, True)
    assert resolve(parse(["run"]), environ={"GOVERNOR_LOG": "off"}).log is False
    defaults = resolve(parse(["run"]), environ={})
    assert defaults.log is True and defaults.log_origin is None and defaults.log_require_token is False
    for bad in (["--log", "maybe"], ["--log-origin", "a b"], ["--log-origin", "a+b"], ["--log-checkpoint-entries", "0"],
                ["--log-checkpoint-seconds", "-1"], ["--log-access", "closed"]):
        with pytest.raises(UsageError):
            resolve(parse(["run", *bad]), environ={})
