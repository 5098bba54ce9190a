"""`governor run` option handling: the log level (mitmproxy quiet by default)."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from governor.cli import UsageError
from governor.cli.run import configure_logging, log_level


def _args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**{"log_level": None, "config": None, **values})


def test_log_level_from_command_line_environment_and_config_file(tmp_path: Path) -> None:
    config = tmp_path / "governor.yaml"
    config.write_text("log_level: error\n")
    assert log_level(_args(), {}) is None
    assert log_level(_args(log_level="debug"), {"GOVERNOR_LOG_LEVEL": "ERROR"}) == "DEBUG"
    assert log_level(_args(), {"GOVERNOR_LOG_LEVEL": "warning"}) == "WARNING"
    assert log_level(_args(config=str(config)), {}) == "ERROR"
    assert log_level(_args(config=str(config)), {"GOVERNOR_LOG_LEVEL": "info"}) == "INFO"


def test_an_unknown_log_level_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--log-level: expected one of DEBUG, INFO"):
        log_level(_args(log_level="chatty"), {})


@pytest.fixture
def restored_levels():
    loggers = [logging.getLogger(), logging.getLogger("mitmproxy")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


def test_mitmproxy_logs_warnings_only_unless_a_level_is_set(restored_levels) -> None:
    configure_logging(None)
    assert logging.getLogger("mitmproxy.proxy.server").getEffectiveLevel() == logging.WARNING
    configure_logging("DEBUG")
    assert logging.getLogger("mitmproxy.proxy.server").getEffectiveLevel() == logging.DEBUG


def test_governor_run_refuses_an_unknown_log_level() -> None:
    done = subprocess.run([sys.executable, "-m", "governor", "run", "--log-level", "chatty"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--log-level: expected one of" in done.stderr


def test_governor_run_freezes_what_start_up_made_out_of_the_cyclic_gc() -> None:
    """`governor run` moves its start-up objects to the GC's permanent generation once it
    serves, so full collections under load no longer walk them (a measured cost)."""
    import gc

    from governor.cli import run as cli

    before = gc.get_freeze_count()
    made_at_start_up = [[] for _ in range(1000)]  # tracked containers, alive before the freeze
    try:
        cli._freeze_startup_objects()
        assert gc.get_freeze_count() >= before + len(made_at_start_up)
        assert gc.get_count()[0] == 0  # nothing left young: the next collections see only new objects
    finally:
        gc.unfreeze()  # the test process goes on collecting as before


def test_governor_run_refuses_a_bad_transparent_address() -> None:
    done = subprocess.run([sys.executable, "-m", "governor", "run", "--transparent", "everywhere"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--transparent: expected HOST:PORT, got 'everywhere'" in done.stderr


def test_transparent_adds_a_second_mitmproxy_listener() -> None:
    from governor.proxy.mitm_master import master_options
    from governor.proxy.server import Settings

    assert master_options(Settings())["mode"] == ["regular"]
    assert master_options(Settings(transparent=("127.0.0.1", 15001)))["mode"] == ["regular", "transparent@127.0.0.1:15001"]


def test_the_bounds_of_compressed_bodies_come_from_the_config_file(tmp_path: Path) -> None:
    from governor.cli.run import OPTIONS, resolve

    config = tmp_path / "governor.yaml"
    config.write_text("max_response_bytes: 1048576\nmax_decoded_ratio: 50\n")
    settings = resolve(argparse.Namespace(**{**{name: None for name in OPTIONS}, "config": str(config)}), {})
    assert (settings.max_response_bytes, settings.max_decoded_ratio) == (1048576, 50.0)
    config.write_text("max_decoded_ratio: 0.5\n")
    with pytest.raises(UsageError, match="max_decoded_ratio must be a number >= 1"):
        resolve(argparse.Namespace(**{**{name: None for name in OPTIONS}, "config": str(config)}), {})


def test_the_bound_of_a_held_stream_comes_from_the_config_file(tmp_path: Path) -> None:
    from governor.cli.run import OPTIONS, resolve
    from governor.proxy.server import build_chain

    config = tmp_path / "governor.yaml"
    args = argparse.Namespace(**{**{name: None for name in OPTIONS}, "config": str(config)})
    config.write_text("max_held_stream_bytes: 262144\n")
    settings = resolve(args, {})
    assert settings.max_held_stream_bytes == 262144
    chain, _ = build_chain(settings, object())
    assert chain.policy.max_held_stream_bytes == 262144
    for bad in ("0", "1.5", "true", "lots"):
        config.write_text(f"max_held_stream_bytes: {bad}\n")
        with pytest.raises(UsageError, match="max_held_stream_bytes must be a whole number of bytes >= 1"):
            resolve(args, {})


def test_body_bounds_and_the_tick_interval_from_the_config_file_are_checked(tmp_path: Path) -> None:
    """A bound of -1 or 0 (or not a whole number) would refuse, or pass unread, every body: refused,
    naming the key."""
    from governor.cli.run import OPTIONS, resolve

    config = tmp_path / "governor.yaml"
    args = argparse.Namespace(**{**{name: None for name in OPTIONS}, "config": str(config)})
    config.write_text("max_body_bytes: 1048576\nmax_response_bytes: 2097152\ntick_interval: 0\n")
    settings = resolve(args, {})
    assert (settings.max_body_bytes, settings.max_response_bytes, settings.tick_interval) == (1048576, 2097152, 0.0)
    for key in ("max_body_bytes", "max_response_bytes"):
        for bad in ("-1", "0", "1.5", "true", "lots"):
            config.write_text(f"{key}: {bad}\n")
            with pytest.raises(UsageError, match=f"{key} must be a whole number of bytes >= 1"):
                resolve(args, {})
    for bad in ("-1", "true", ".inf", "soon"):
        config.write_text(f"tick_interval: {bad}\n")
        with pytest.raises(UsageError, match="tick_interval must be a number of seconds >= 0"):
            resolve(args, {})


def test_the_persona_idle_time_from_flag_environment_and_config_file(tmp_path: Path) -> None:
    from governor.cli.run import OPTIONS, resolve

    def args(**values: object) -> argparse.Namespace:
        return argparse.Namespace(**{**{name: None for name in OPTIONS}, **values})

    config = tmp_path / "governor.yaml"
    config.write_text("persona_idle: 15\n")
    assert resolve(args(), {}).persona_idle == 60.0
    assert resolve(args(), {"GOVERNOR_PERSONA_IDLE": "5"}).persona_idle == 5.0
    assert resolve(args(persona_idle="2.5"), {"GOVERNOR_PERSONA_IDLE": "5"}).persona_idle == 2.5
    assert resolve(args(config=str(config)), {}).persona_idle == 15.0
    with pytest.raises(UsageError, match="--persona-idle: must be positive"):
        resolve(args(persona_idle="0"), {})
