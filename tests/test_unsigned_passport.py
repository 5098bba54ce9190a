"""`governor run` refuses an unsigned passport unless --allow-unsigned-passport (#32 item 5).

With the opt-in, every record of the governor says so in its header (limits.passport_signature
= "unsigned"), under the signature. The bundled example passport is signed and starts as before.
"""

from __future__ import annotations

import argparse
import ssl
import subprocess
import sys

import httpx
import pytest

from governor.cli import UsageError
from governor.cli.run import register, resolve
from governor.evidence import verify_record
from governor.proxy.server import Settings, StartupError, serve
from tests.conftest import REPO
from tests.proxy_harness import real_governor
from tests.restartable_governor import write_passport

GUARD_SEC = 120  # not a timing assertion: only stops a hung process from hanging the suite


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_the_option_from_the_command_line_the_environment_and_the_config_file(tmp_path):
    assert resolve(_args(), environ={}).allow_unsigned_passport is False
    assert resolve(_args("--allow-unsigned-passport"), environ={}).allow_unsigned_passport is True
    assert resolve(_args("--allow-unsigned-passport", "no"), environ={}).allow_unsigned_passport is False
    assert resolve(_args(), environ={"GOVERNOR_ALLOW_UNSIGNED_PASSPORT": "yes"}).allow_unsigned_passport is True
    config = tmp_path / "governor.yaml"
    config.write_text("allow_unsigned_passport: true\n")
    assert resolve(_args("--config", str(config)), environ={}).allow_unsigned_passport is True
    with pytest.raises(UsageError, match="--allow-unsigned-passport: expected yes or no"):
        resolve(_args("--allow-unsigned-passport", "perhaps"), environ={})


async def test_an_unsigned_passport_is_refused_by_default(tmp_path):
    unsigned = write_passport(tmp_path / "unsigned.json", signed=False)
    with pytest.raises(StartupError) as refused:
        await serve(Settings(passport=unsigned, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path / "data"))
    assert refused.value.report.blocked_at_section == "1.1.5"
    assert "signatures are required" in refused.value.report.step("1.1.5").message
    assert "--allow-unsigned-passport" in str(refused.value)


async def test_an_edited_passport_is_refused_even_with_the_opt_in(tmp_path):
    """An edit under an intact signature is not 'unsigned': the signature fails, and that is never overridden."""
    import json

    signed = json.loads(write_passport(tmp_path / "p.json", scale=2).read_text())
    tokens = signed["permissions"]["resource_limits"]["budget"]["tokens"]
    tokens.update(per_session=tokens["per_session"] * 100, per_day=tokens["per_day"] * 100)  # the x100 edit
    (tmp_path / "edited.json").write_text(json.dumps(signed))
    with pytest.raises(StartupError) as refused:
        await serve(Settings(passport=tmp_path / "edited.json", listen=("127.0.0.1", 0), control=None,
                             data_dir=tmp_path / "data", allow_unsigned_passport=True))
    assert refused.value.report.blocked_at_section == "1.1.5"


def test_governor_run_refuses_an_unsigned_passport_and_says_how_to_proceed(tmp_path):
    unsigned = write_passport(tmp_path / "unsigned.json", signed=False)
    done = subprocess.run([sys.executable, "-m", "governor", "run", "--passport", str(unsigned), "--listen",
                           "127.0.0.1:0", "--control", "off", "--data-dir", str(tmp_path / "data")],
                          cwd=REPO, capture_output=True, text=True, timeout=GUARD_SEC)
    assert done.returncode != 0
    assert "refused at admission" in done.stderr and "--allow-unsigned-passport" in done.stderr, done.stderr


async def _one_record(running, mock, session: str) -> dict:
    async with httpx.AsyncClient(proxy=running.proxy_url, verify=ssl.create_default_context(cafile=str(running.ca_file)),
                                 trust_env=False,
                                 timeout=30) as agent:
        answer = await agent.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": session},
                                  json={"model": "gpt-4o-mini", "max_tokens": 16,
                                        "messages": [{"role": "user", "content": "hello"}]})
        assert answer.status_code == 200, answer.text
    return await running.runtime.end_session(session)


async def test_with_the_opt_in_every_record_names_the_unsigned_passport(tmp_path):
    unsigned = write_passport(tmp_path / "unsigned.json", signed=False)
    async with real_governor(tmp_path / "u", passport=unsigned, allow_unsigned_passport=True) as (running, mock):
        record = await _one_record(running, mock, "unsigned-1")
        key = running.runtime.key.public_key()
    assert record["limits"]["passport_signature"] == "unsigned"
    assert verify_record(record, public_key=key).ok  # under the signature: removing it breaks the record
    del record["limits"]["passport_signature"]
    assert verify_record(record, public_key=key).first_failure.number == 3


async def test_the_bundled_signed_passport_starts_without_the_opt_in_and_says_nothing(tmp_path):
    async with real_governor(tmp_path) as (running, mock):
        record = await _one_record(running, mock, "signed-1")
    assert "passport_signature" not in record["limits"]
