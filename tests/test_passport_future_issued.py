"""A passport issued in the future beyond the allowed clock skew is refused (#20 finding 8):
at admission (1.1.6), by `passport verify` (exit 1) and by `governor run` (no start)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from governor.cli import main
from governor.passport import AdmissionConfig, admit, dump_passport, load_passport, sign_passport
from governor.passport.admission import DEFAULT_CLOCK_SKEW
from governor.passport.resources import example_passport_path
from governor.proxy.server import Settings, StartupError, serve

NOW = datetime(2027, 6, 1, tzinfo=timezone.utc)


def issued(at: str) -> dict:
    """The example passport issued at `at`, signed again (with a fresh key) so 1.1.5 passes."""
    document = copy.deepcopy(load_passport(example_passport_path()))
    document["security"]["attestation"]["issued_at"] = at
    document["security"]["attestation"]["expires_at"] = "2100-01-01T00:00:00Z"
    del document["cryptographic_identity"]["public_key"]
    return sign_passport(document, ed25519.Ed25519PrivateKey.generate())


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_passport_issued_in_2099_is_refused_at_1_1_6():
    report = admit(issued("2099-01-01T00:00:00Z"), AdmissionConfig(now=NOW))
    assert not report.verified and report.blocked_at_section == "1.1.6"
    message = report.step("1.1.6").message
    assert "issued in the future" in message and "beyond the allowed clock skew of 300 s" in message
    assert report.step("1.1.5").passed  # the signature itself is fine


def test_the_skew_bound_is_inclusive_and_configurable():
    assert DEFAULT_CLOCK_SKEW == timedelta(seconds=300)
    at_bound = issued(rfc3339(NOW + timedelta(seconds=300)))
    past_bound = issued(rfc3339(NOW + timedelta(seconds=301)))
    assert admit(at_bound, AdmissionConfig(now=NOW)).verified
    assert admit(past_bound, AdmissionConfig(now=NOW)).blocked_at_section == "1.1.6"
    assert admit(past_bound, AdmissionConfig(now=NOW, max_clock_skew=timedelta(minutes=10))).verified
    assert not admit(at_bound, AdmissionConfig(now=NOW, max_clock_skew=timedelta(0))).verified
    with pytest.raises(ValueError, match="max_clock_skew"):
        AdmissionConfig(now=NOW, max_clock_skew=timedelta(seconds=-1))


def test_an_unparseable_issued_at_is_refused():
    report = admit(issued("next tuesday"), AdmissionConfig(now=NOW))
    assert not report.verified
    assert any("issued_at" in str(step.to_dict()) for step in report.steps)


def test_passport_verify_exits_1_and_takes_the_skew_as_an_option(tmp_path, capsys):
    path = tmp_path / "future.yaml"
    path.write_bytes(dump_passport(issued(rfc3339(NOW + timedelta(hours=1))), "yaml"))
    assert main(["passport", "verify", str(path), "--now", rfc3339(NOW)]) == 1
    out, _ = capsys.readouterr()
    assert "REJECTED at 1.1.6" in out and "issued in the future" in out
    assert main(["passport", "verify", str(path), "--now", rfc3339(NOW), "--max-clock-skew", "7200"]) == 0
    capsys.readouterr()
    assert main(["passport", "verify", str(path), "--max-clock-skew", "-1"]) == 2
    assert "--max-clock-skew" in capsys.readouterr().err


async def test_governor_run_refuses_to_start_on_a_future_passport(tmp_path):
    path = tmp_path / "future.json"
    path.write_bytes(dump_passport(issued("2099-01-01T00:00:00Z")))
    with pytest.raises(StartupError) as refused:
        await serve(Settings(passport=path, listen=("127.0.0.1", 0), control=("127.0.0.1", 0),
                             data_dir=tmp_path / "data"))
    report = refused.value.report
    assert report.blocked_at_section == "1.1.6" and "issued in the future" in report.step("1.1.6").message
