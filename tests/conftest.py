"""Shared fixtures.

The official ADL test data (the ADL family's schemas, examples, verification vectors,
and the JCS test data) lives in ../shared beside the checkout (CI and the developers'
machines have it; a user's machine may not; GOVERNOR_SHARED_DIR points elsewhere).
Tests that need it read it through `shared_path` (or the `shared_dir` fixture) and are
skipped one by one, saying why, when it is absent. Tests parametrized over its files
take their case names from fixed lists, never from the folder at collection time, so
a missing folder skips each case by name instead of generating none of them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.ci_strict import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (CI=true: skips fail)
from tests.parallel import pytest_collection_modifyitems  # noqa: F401 (slowest files first under xdist)

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("GOVERNOR_SHARED_DIR", REPO.parent / "shared"))


SHARED_ABSENT = "../shared (the official ADL test data) is absent"


def shared_path(*parts: str) -> Path:
    """SHARED/parts, or skip the calling test saying the official test data is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{SHARED_ABSENT}: {path} not found (lay ../shared beside the checkout, "
                    "or set GOVERNOR_SHARED_DIR to where it is)")
    return path


@pytest.fixture
def shared_dir() -> Path:
    return shared_path()


@pytest.fixture
def repo_dir() -> Path:
    return REPO


# a module whose tests want other usage figures sets MOCK_LLM_USAGE = (prompt, completion)
MOCK_LLM_USAGE = (100, 50)


@pytest.fixture
async def llm(request):
    """The demo mock LLM (governor.demo.mock_llm) on loopback, charging MOCK_LLM_USAGE tokens
    a call (the module's, else 100 prompt and 50 completion). Modules that need another mock
    define their own `llm`."""
    from governor.demo.mock_llm import MockLLM

    prompt, completion = getattr(request.module, "MOCK_LLM_USAGE", MOCK_LLM_USAGE)
    mock = MockLLM(prompt_tokens=prompt, completion_tokens=completion)
    await mock.start()
    yield mock
    await mock.stop()
