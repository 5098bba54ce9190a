"""Under CI=true a skipped test is a failed one (#33 item 9).

Tests skip, saying why, when a component they drive (redis-server, Prometheus, Chromium, helm,
podman, ...) is missing on a developer's machine. On CI `.ci/dev test` installs those: a skip
there means the run did not test what it claims, so it fails, with the skip's reason. An
expected failure (xfail) is not a skip and is left alone. tests/conftest.py installs these hooks.
"""

from __future__ import annotations

import os

import pytest

PREFIX = "CI=true: a skip is a failure (a component the tests need is missing or cannot start): "


def ci_strict() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _reason(report: pytest.BaseReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail(report: pytest.BaseReport) -> None:
    report.outcome = "failed"
    report.longrepr = PREFIX + _reason(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if ci_strict() and report.skipped and not hasattr(report, "wasxfail"):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    """A module skipped whole (pytest.importorskip, pytest.skip(allow_module_level=True))."""
    outcome = yield
    report = outcome.get_result()
    if ci_strict() and report.skipped:
        _fail(report)
