"""Every `governor run` option is validated, and a bad value is refused naming where it came
from: the flag, the environment variable or the config file's key (#33 item 8)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from governor.cli import UsageError
from governor.cli.run import OPTIONS, resolve


def args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**{**{name: None for name in OPTIONS}, **values})


def refused(namespace: argparse.Namespace, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(UsageError) as caught:
        resolve(namespace, environ or {})
    return str(caught.value)


def test_the_same_bad_value_is_named_by_its_flag_its_variable_or_its_key(tmp_path: Path) -> None:
    config = tmp_path / "gov.yaml"
    config.write_text("tier: R9\n")
    assert refused(args(tier="R9")) == "--tier: expected R1, R2 or R3, got 'R9'"
    assert refused(args(), {"GOVERNOR_TIER": "R9"}) == "$GOVERNOR_TIER: expected R1, R2 or R3, got 'R9'"
    assert refused(args(config=str(config))) == f"config {config}: tier: expected R1, R2 or R3, got 'R9'"
    # the flag wins over the variable, which wins over the file: the error names the one used
    assert refused(args(config=str(config)), {"GOVERNOR_TIER": "R7"}).startswith("$GOVERNOR_TIER: ")
    assert resolve(args(config=str(config), tier="R1"), {}).tier.value == "R1"


def test_option_modules_raising_their_flag_are_named_by_source_too(tmp_path: Path) -> None:
    """log_options.py raises "--log-access: ..."; from the environment it reads as the variable."""
    assert refused(args(), {"GOVERNOR_LOG_ACCESS": "everyone"}).startswith("$GOVERNOR_LOG_ACCESS: expected open or token")
    config = tmp_path / "gov.yaml"
    config.write_text("log_checkpoint_entries: 0\n")
    assert refused(args(config=str(config))).startswith(f"config {config}: log_checkpoint_entries: expected a whole")


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "0", "-1", "soon", "1e999"])
def test_durations_must_be_positive_finite_numbers(bad: str) -> None:
    for name in ("session_idle", "upstream_timeout", "client_body_timeout", "drain_timeout", "persona_idle",
                 "review_hold_seconds", "log_checkpoint_seconds", "witness_wait"):
        message = refused(args(**{name: bad}))
        assert message.startswith("--" + name.replace("_", "-") + ":"), message


@pytest.mark.parametrize("bad", ["²", "１２", "-3", "1.5", "ten", "0x10", " "])
def test_whole_numbers_refuse_what_int_would_crash_on_or_misread(bad: str) -> None:
    for name in ("max_client_connections", "metrics_per_session", "agent_sessions_per_day", "fit_floor",
                 "log_checkpoint_entries"):
        message = refused(args(**{name: bad}))
        assert message.startswith("--" + name.replace("_", "-") + ": expected a whole number"), message


def test_a_typo_in_lock_on_from_each_source_is_refused(tmp_path: Path) -> None:
    assert "not on_session_integirty" in refused(args(lock_on="on_session_integirty"))
    assert refused(args(), {"GOVERNOR_LOCK_ON": "on_budget_exausted"}).startswith("$GOVERNOR_LOCK_ON: lock causes")
    config = tmp_path / "gov.yaml"
    config.write_text("lock_on: [on_anomaly, on_anomoly]\n")
    assert refused(args(config=str(config))).startswith(f"config {config}: lock_on: ")


def test_config_file_values_of_the_wrong_shape_are_refused_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "gov.yaml"
    cases = {
        "data_dir: [a, b]\n": "data_dir: expected a single value, got a list",
        "listen: {host: x}\n": "listen: expected a single value, got a mapping",
        'upstream_insecure: "no"\n': "upstream_insecure: expected true or false, got 'no'",  # bool("no") is True
        'inject_stream_usage: "false"\n': "inject_stream_usage: expected true or false",
        "bytes_per_token: -4\n": "bytes_per_token: expected a positive number",
        "default_output_tokens: 0\n": "default_output_tokens: expected a whole number >= 1",
        "control_token: 12345678901234567890\n": "control_token: expected a string, got int",
        "governor_id: [did:web:x]\n": "governor_id: expected a string, got list",
        "routes: /v1/x\n": "routes: expected a list of routes",
        "store: ftp://host/db\n": "store: unknown scheme",
        "session: two words\n": "session: a name without spaces",
        "passport: 7\n": "passport: no such file 7",
    }
    for text, expected in cases.items():
        config.write_text(text)
        message = refused(args(config=str(config)))
        assert message.startswith(f"config {config}: ") and expected in message, (text, message)


def test_a_config_file_that_is_not_a_mapping_of_names_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "gov.yaml"
    for text, expected in (("- tier\n", "expected a mapping of settings, got list"),
                           ("1: R1\n", "setting names are words, got 1"),
                           ("tier: [R1\n", "while parsing"),
                           ("tier: R1\nbogus_key: 1\n", "unknown settings bogus_key")):
        config.write_text(text)
        assert expected in refused(args(config=str(config))), text
    assert "No such file" in refused(args(config=str(tmp_path / "missing.yaml")))


def test_paths_are_checked(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    assert refused(args(data_dir=str(tmp_path / "afile"))).startswith("--data-dir: not a directory")
    assert refused(args(), {"GOVERNOR_PRICING": str(tmp_path / "none.yaml")}).startswith("$GOVERNOR_PRICING: no such file")
    assert refused(args(passport=str(tmp_path / "none.yaml"))).startswith("--passport: no such file")


def test_governor_run_exits_2_naming_the_variable() -> None:
    import os

    done = subprocess.run([sys.executable, "-m", "governor", "run"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GOVERNOR_TIER": "R9"})
    assert done.returncode == 2
    assert "governor run: $GOVERNOR_TIER: expected R1, R2 or R3, got 'R9'" in done.stderr
