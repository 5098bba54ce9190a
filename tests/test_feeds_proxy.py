"""R3 feeds through the real proxy (#32 item 1): the official `mcp` SDK calls a tool in a loop
the passport lets go on (`on_iteration_limit: continue`); at R3 the loop events feed the anomaly
substrate and the third one in five actions is a material deviation (on_anomaly, undeclared:
halt). The signed record names the deviation and lists what R3 monitored. On main the loop
went on for ever at R3, recorded as continues, and the record claimed monitoring that did not
happen."""

from __future__ import annotations

import copy

import pytest
from mcp.shared.exceptions import McpError

from governor.evidence.verify import verify_record
from tests.test_mcp_sdk import mcp_session
from tests.test_mcp_sdk_runtime import PASSPORT, notes_world, session_record

LOOPING = copy.deepcopy(PASSPORT)
LOOPING["runtime"]["tool_invocation"] = {"loop_detection": {"window": 10}}
LOOPING["runtime"]["degradation"]["on_iteration_limit"] = {"action": "continue"}


@pytest.mark.parametrize("tier", ["R2", "R3"])
async def test_a_tolerated_loop_is_a_material_deviation_at_r3_only(tmp_path, tier):
    async with notes_world(tmp_path, LOOPING, tier=tier) as (server, runtime, governor, _):
        async with mcp_session(server.url, governor.proxy_url) as session:
            results = []
            for _ in range(6):
                try:
                    results.append(await session.call_tool("read_note", {"path": "/notes/same.md"}))
                except McpError as exc:
                    results.append(exc.error.data["governor"])
        record = await session_record(governor)
        key = runtime.key.public_key()
    assert verify_record(record, public_key=key).ok
    anomalies = [e for e in record["events"] if e["cause"] == "on_anomaly"]
    if tier == "R2":
        assert all(not isinstance(r, dict) for r in results) and not anomalies
        assert "anomaly_monitoring" not in record["limits"]
        return
    assert [isinstance(r, dict) for r in results] == [False] * 4 + [True, True]
    assert results[4]["cause"] == "on_anomaly" and results[4]["action"] == "halt"
    (anomaly,) = anomalies
    assert anomaly["detail"]["deviations"][0]["key"] == "feed:iteration"
    assert [p for name, p in server.calls if name == "read_note"] == [{"path": "/notes/same.md"}] * 4
    monitored = record["limits"]["anomaly_monitoring"]
    assert set(monitored["feeds"]) == {"budget", "iteration", "agents", "oversight"}
    assert record["outcome"] == "halted"
