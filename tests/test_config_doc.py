"""docs/reference/configuration.md's table of `governor run` options is generated from the
argument parser (governor/cli/config_doc.py): the page, the parser, the environment variables
and the config keys `resolve` accepts must agree."""

from __future__ import annotations

import argparse
import ast
import inspect
from pathlib import Path

import pytest

from governor.cli import UsageError, config_doc
from governor.cli import run as cli_run

ROOT = Path(__file__).resolve().parents[1]


def test_the_page_is_what_the_parser_generates() -> None:
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8")
    assert page == config_doc.page(page), (
        "docs/reference/configuration.md is stale: python -m governor.cli.config_doc --write")


def test_every_run_option_is_documented_with_its_variable_and_key() -> None:
    rows = {key: (flag, env) for flag, env, key, _, _ in config_doc.options()}
    assert set(rows) == set(cli_run.OPTIONS)  # nothing the parser has is missing, nothing extra
    for name, (env, _) in cli_run.OPTIONS.items():
        flag, documented_env = rows[name]
        assert flag.split()[0] == "--" + name.replace("_", "-")
        assert documented_env == "$" + env
    block = config_doc.markdown_block()
    for name, (env, _) in cli_run.OPTIONS.items():
        assert f"`${env}`" in block and f"`{name}`" in block


def _accepted_file_keys() -> set[str]:
    """The keys `resolve` accepts beyond the options: the string literals of its `known` sets."""
    tree = ast.parse(inspect.getsource(cli_run))
    keys: set[str] = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "known" for t in targets):
            keys |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return keys | set(cli_run.WEBHOOK_FILE_SETTINGS)


def test_the_file_only_keys_documented_are_the_ones_resolve_accepts(tmp_path: Path) -> None:
    assert _accepted_file_keys() == set(config_doc.FILE_KEYS)
    args = argparse.Namespace(**{**{name: None for name in cli_run.OPTIONS}, "config": str(tmp_path / "g.yaml")})
    for key in config_doc.FILE_KEYS:  # each is known: whatever else is said of its value, not "unknown"
        (tmp_path / "g.yaml").write_text(f"{key}: {{}}\n")
        try:
            cli_run.resolve(args, {})
        except UsageError as exc:
            assert "unknown settings" not in str(exc), key
    (tmp_path / "g.yaml").write_text("max_body_byte: 10\n")
    with pytest.raises(UsageError, match="unknown settings max_body_byte"):
        cli_run.resolve(args, {})


HOSTILE_VALUES = ("{}", "[1, 2]", "'junk value'", "-1", ".nan", ".inf", "true", "'²'", "''")


@pytest.mark.parametrize("bad", HOSTILE_VALUES)
def test_any_value_of_any_key_is_taken_or_refused_with_its_key_never_a_crash(tmp_path: Path, bad: str) -> None:
    """Every option and file key given a hostile value in the config file: resolve returns, or
    raises a UsageError naming the config key; no other exception escapes."""
    config = tmp_path / "g.yaml"
    args = argparse.Namespace(**{**{name: None for name in cli_run.OPTIONS}, "config": str(config)})
    for key in [*cli_run.OPTIONS, *config_doc.FILE_KEYS]:
        if key == "config":
            continue
        config.write_text(f"{key}: {bad}\n")
        try:
            cli_run.resolve(args, {})
        except UsageError as exc:
            assert f"config {config}: {key}" in str(exc) or f"config {config}: " in str(exc) and key in str(exc), (key, str(exc))


@pytest.mark.parametrize("bad", ["junk value", "-1", "nan", "inf", "²", "0", "R9", "::"])
def test_any_variable_is_taken_or_refused_naming_the_variable(bad: str) -> None:
    args = argparse.Namespace(**{name: None for name in cli_run.OPTIONS})
    for name, (env, _) in cli_run.OPTIONS.items():
        if name in ("config", "log_level", "log_format"):
            continue
        try:
            cli_run.resolve(args, {env: bad})
        except UsageError as exc:
            assert str(exc).startswith(f"${env}") or f"${env}" in str(exc), (name, str(exc))
