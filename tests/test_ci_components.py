"""CI cannot pass hollow (#33 item 9): under CI=true a component the tests need that cannot be
installed fails `.ci/dev` naming it (apt waiting, bounded, for the dpkg lock), and a test that
skips fails (tests/ci_strict.py). Without CI=true both stay a warning and a skip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("dirname", "cat", "tail", "tr", "cut", "rm")  # what .ci/dev's component checks run besides apt-get

FAKE_APT = """#!/bin/sh
# apt-get while another process holds the dpkg lock: record the call, fail as apt does
echo "$@" >> "{calls}"
echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2
exit 100
"""


def sandbox(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH with the shell tools .ci/dev needs, a failing apt-get, and no redis-server."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "apt-calls"
    bin_dir.mkdir()
    for tool in TOOLS:
        os.symlink(shutil.which(tool), bin_dir / tool)
    (bin_dir / "apt-get").write_text(FAKE_APT.format(calls=calls))
    (bin_dir / "apt-get").chmod(0o755)
    return {"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
            "GOVERNOR_APT_LOCK_TIMEOUT": "7"}, calls


def components(env: dict[str, str], *names: str) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash"), str(ROOT / ".ci" / "dev"), "components", *names],
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_component_that_cannot_be_installed_fails_ci_naming_it(tmp_path: Path) -> None:
    env, calls = sandbox(tmp_path)
    done = components({**env, "CI": "true"}, "redis", "chromium")
    assert done.returncode == 1, done.stderr
    assert "could not install redis-server" in done.stderr and "could not install chromium" in done.stderr
    assert "Could not get lock" in done.stderr  # apt's own reason is shown
    assert "CI=true: the tests need redis-server chromium, which could not be installed" in done.stderr
    # apt waited for the lock (bounded) rather than giving up at once
    assert all("-o DPkg::Lock::Timeout=7" in line for line in calls.read_text().splitlines())
    assert "install -y -qq --no-install-recommends redis-server" in calls.read_text()


def test_without_ci_a_missing_component_is_a_warning(tmp_path: Path) -> None:
    env, _ = sandbox(tmp_path)
    done = components(env, "redis")
    assert done.returncode == 0, done.stderr
    assert "warning: could not install redis-server" in done.stderr and "Redis tests will be skipped" in done.stderr
    assert components({**env, "CI": "true"}, "no-such").returncode == 2


def test_an_installed_component_passes_under_ci() -> None:
    if shutil.which("redis-server") is None:  # tests/ci_strict.py: under CI=true this fails
        pytest.skip("redis-server is not installed")
    done = components({"PATH": os.environ["PATH"], "CI": "true", "HOME": os.environ.get("HOME", "/tmp")}, "redis")
    assert done.returncode == 0, done.stderr


SKIPPING = """
import pytest

def test_needs_a_server():
    pytest.skip("redis-server is not installed")

def test_plain():
    pass

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False
"""


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_skip_under_ci_is_a_failure(tmp_path: Path, ci: str) -> None:
    (tmp_path / "conftest.py").write_text("from tests.ci_strict import pytest_make_collect_report, "
                                          "pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    (tmp_path / "test_module_skip.py").write_text("import pytest\npytest.importorskip('no_such_module_here')\n")
    def pytest_run(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                               "-rA", str(tmp_path / name)], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env={**os.environ, "CI": ci, "PYTHONPATH": str(ROOT)})

    done, module = pytest_run("test_skipping.py"), pytest_run("test_module_skip.py")
    if ci:
        assert done.returncode == 1, done.stdout
        assert "CI=true: a skip is a failure" in done.stdout and "redis-server is not installed" in done.stdout
        assert "1 failed, 1 passed, 1 xfailed" in done.stdout
        assert module.returncode != 0 and "no_such_module_here" in module.stdout  # a module skipped whole fails too
    else:
        assert done.returncode == 0, done.stdout
        assert "1 passed, 1 skipped, 1 xfailed" in done.stdout
        assert module.returncode == 5 and "1 skipped" in module.stdout  # nothing ran: skipped, not failed
