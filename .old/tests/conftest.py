"""Shared fixtures.

The official ADL test data lives in ../shared beside the checkout (CI and the
developers' machines have it; a user's machine does not). Tests that need it use
the `shared_dir` fixture and are skipped, with the reason, when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("GOVERNOR_SHARED_DIR", REPO.parent / "shared"))


def shared_path(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"official ADL test data not found at {path} (set GOVERNOR_SHARED_DIR); "
                    "it sits beside the checkout on CI and developer machines only")
    return path


@pytest.fixture
def shared_dir() -> Path:
    return shared_path()


@pytest.fixture
def repo_dir() -> Path:
    return REPO
