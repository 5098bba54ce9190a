"""How the suite's files share xdist workers (`.ci/dev test` runs them with -n N --dist loadgroup).

Each file is one unit of work, kept on one worker, so its module-scoped set-ups (one governor,
one redis-server, one browser for many checks) start once, as they do in a serial run. A file
that must share a worker with another marks itself `pytest.mark.xdist_group("NAME")`; that mark
wins over the file's own group. Everything the files share across workers (ports, data
directories, tool installs, the podman image) is ephemeral, per-test or built under a lock.
tests/conftest.py installs this hook.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marks into the units
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
