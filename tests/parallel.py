"""The order in which the suite's files reach xdist's workers (`.ci/dev test` runs them with
-n N --dist loadfile --no-loadscope-reorder; docs/test-suite.md).

--dist loadfile keeps each file on one worker, so its module-scoped set-ups (one governor, one
redis-server, one browser for many checks) start once, as in a serial run. (Not loadgroup: with
pytest 9.2 its xdist_group marks are silently ignored, xdist 3.8 renaming a nodeid attribute
pytest no longer reads, and every test went to any worker.) Everything the files share across
workers (ports, data directories, tool installs, the podman image) is ephemeral, per-test or
built under a lock.

The files are handed out in collection order, so the slowest are collected first: a slow file
that started last would run alone at the end while the other workers idle. SLOWEST_FIRST is
measured (`pytest -p no:randomly --junitxml`, the files' total time in a serial run); a file not
in it keeps its place after them. tests/conftest.py installs this hook.
"""

from __future__ import annotations

import os

import pytest

SLOWEST_FIRST: tuple[str, ...] = (  # 2026-11, each 27 s to 100 s of a 2,100 s serial run
    "test_shared_sessions.py",  # 150-200 s after session 19's additions
    "test_many_sessions.py",
    "test_image.py",
    "test_bench.py",
    "test_restart.py",
    "test_approvals_cli.py",
    "test_sdk_async.py",
    "test_store_properties.py",
    "test_oversight_frameworks.py",
    "test_sdk_media.py",
    "test_realtime_sdk.py",
    "test_oversight_holds.py",
    "test_oversight_request_holds.py",
    "test_protocols_next.py",
    "test_chart_checkov.py",
    "test_store_redis_ha.py",
    "test_store_cluster_failover.py",
    "test_store_cluster_proxy.py",
    "test_store_redis_tls.py",  # ~30 s serial: three TLS topologies
    "test_chart_gateway.py",
    "test_metrics_cardinality.py",
    "test_soak.py",
    "test_workers.py",
    "test_transparency_log_crash.py",
    "test_budget_warning_events.py",
    "test_stream_cuts.py",
    "test_policy_properties.py",
    "test_signals.py",
    "test_proxy_connections.py",
    "test_ci_components.py",
    "test_console_browser.py",
    "test_stream_budget_replicas.py",
    "test_audit.py",
    "test_fitting_proxy.py",
)

_RANK = {name: rank for rank, name in enumerate(SLOWEST_FIRST)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a serial run keeps pytest's order
        # a stable sort: a file's tests keep their order and stay together
        items.sort(key=lambda item: _RANK.get(item.path.name, len(_RANK)))
