"""`governor --version`: the installed distribution's version, exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version

from tests.conftest import REPO


def test_version_prints_the_installed_distribution_version():
    done = subprocess.run([sys.executable, "-m", "governor", "--version"], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"governor {version('adl-governor')}\n"
    assert done.stderr == ""


def test_a_command_is_still_required_without_version(capsys):
    from governor.cli import main

    try:
        main([])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("no command must be a usage error")
    assert "COMMAND" in capsys.readouterr().err
