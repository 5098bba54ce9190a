"""The reviewer console's HTTP surface without a browser: its headers, the token check,
the verification read, and hostile plan edits against a real held step (the approval
stays pending through every refusal)."""

from __future__ import annotations

import asyncio

import aiohttp

from governor.control.reviewer_console import CONTENT_SECURITY_POLICY
from tests.console_harness import CONTROL_TOKEN, REVIEWER_TOKEN, console_world


async def test_the_page_is_served_with_a_strict_policy_and_no_secret(tmp_path):
    async with console_world(tmp_path) as world, aiohttp.ClientSession() as http:
        async with http.get(f"{world.url}/", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/console/"
        for name, kind in (("", "text/html"), ("console.js", "text/javascript"), ("console.css", "text/css")):
            async with http.get(f"{world.url}/console/{name}") as resp:
                assert resp.status == 200 and resp.content_type == kind
                assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
                assert resp.headers["Referrer-Policy"] == "no-referrer"
                body = await resp.text()
                assert REVIEWER_TOKEN not in body and CONTROL_TOKEN not in body
        assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY
        async with http.get(f"{world.url}/console/index.html") as resp:
            assert "<script src=\"/console/console.js\"" in await resp.text()
            assert "<script>" not in await resp.text()  # no inline script for the policy to allow
        for missing in ("nope.js", "..%2fapp.py", "%2e%2e%2f%2e%2e%2fauth.py"):
            async with http.get(f"{world.url}/console/{missing}") as resp:
                assert resp.status == 404


async def test_the_token_check_tells_reviewer_from_control_and_refuses_others(tmp_path):
    async with console_world(tmp_path) as world:
        assert (await world.request("GET", "/v1/token", token=None))[0] == 401
        for wrong in ("wrong-token-0000000000", f"{REVIEWER_TOKEN}x", "", REVIEWER_TOKEN[:-1]):
            status, body = await world.request("GET", "/v1/token", token=wrong)
            assert status == 401 and body["error"]["code"] in ("token_invalid", "token_required"), wrong
        status, body = await world.request("GET", "/v1/token", token=None,
                                           headers={"Authorization": f"Basic {REVIEWER_TOKEN}"})
        assert status == 401 and body["error"]["code"] in ("token_invalid", "token_required")
        assert await world.request("GET", "/v1/token") == (200, {"reviewer": True, "control": False})
        assert await world.request("GET", "/v1/token", token=CONTROL_TOKEN) == (200, {"reviewer": False,
                                                                                     "control": True})


async def test_the_verification_read_verifies_a_live_record_and_needs_a_token(tmp_path):
    async with console_world(tmp_path) as world:
        async with world.held("verify me", "delete_note", {"path": "/notes/v.md"}) as (approval, call):
            status, _ = await world.request("POST", f"/v1/approvals/{approval['id']}",
                                            json={"decision": "approve", "reviewer": "v"})
            assert status == 200
            await asyncio.wait_for(call, 30)
        session = approval["session"]
        answer = await world.get(f"/v1/sessions/{session}/verification")
        # no step failed; the governor's own key is pinned, not resolved from its did:web: INCOMPLETE, not VALID
        assert answer["verification"]["verdict"] == "INCOMPLETE" and answer["record"]["events"]
        assert answer["verification"]["valid"] is False and answer["verification"]["not_checked"] == [2]
        # schema, key, signature, and the passport binding: the record's passport digest is the pinned passport's
        assert [s["status"] for s in answer["verification"]["steps"]] == ["pass", "partial", "pass", "pass", "pass", "pass"]
        assert answer["verification"]["steps"][3]["name"] == "passport binding"
        assert (await world.request("GET", f"/v1/sessions/{session}/verification", token=None))[0] == 401
        assert (await world.request("GET", "/v1/sessions/no-such-session/verification"))[0] == 404


async def test_hostile_edits_are_refused_and_the_approval_stays_pending(tmp_path):
    async with console_world(tmp_path) as world:
        async with world.held("hostile edits", "delete_note", {"path": "/notes/h.md"}) as (approval, call):
            assert approval["plan_editing"] is True
            path = f"/v1/approvals/{approval['id']}"
            deep: object = {"path": "/x"}
            for _ in range(80):
                deep = {"a": deep}
            cases = [
                ({"decision": "approve", "reviewer": "r", "edited_arguments": ["/x"]}, 400),
                ({"decision": "approve", "reviewer": "r", "edited_arguments": "/x"}, 400),
                ({"decision": "approve", "reviewer": "r", "edited_arguments": 7}, 400),
                ({"decision": "reject", "reviewer": "r", "edited_arguments": {"path": "/x"}}, 400),
                ({"decision": "approve", "reviewer": "r", "edited_arguments": deep}, 400),
                ({"decision": "approve", "reviewer": "r", "edited_arguments": {"path": "y" * 40_000}}, 409),
                ({"decision": "approve", "reviewer": "r", "edited_arguments": {"path": "y" * 70_000}}, 413),
                ({"decision": "approve", "reviewer": "", "edited_arguments": {"path": "/x"}}, 400),
            ]
            for body, expected in cases:
                status, answer = await world.request("POST", path, json=body)
                assert status == expected, (str(body)[:80], answer)
                assert answer["error"]["code"]
            status, _ = await world.request("POST", path, token=CONTROL_TOKEN, json={
                "decision": "approve", "reviewer": "r", "edited_arguments": {"path": "/x"}})
            assert status == 401  # the control token reads; only a reviewer answers
            assert [a["id"] for a in world.runtime.approvals()] == [approval["id"]]
            assert world.server.calls == []
            status, answer = await world.request("POST", path, json={
                "decision": "approve", "reviewer": "r", "edited_arguments": {"path": "/notes/h-copy.md"}})
            assert status == 200 and answer["edited"] is True
            assert answer["original_step_digest"] == approval["step_digest"] != answer["step_digest"]
            result = await asyncio.wait_for(call, 30)
        assert world.server.calls == [("delete_note", {"path": "/notes/h-copy.md"})]
        assert result.content[0].text == "deleted /notes/h-copy.md"


async def test_an_edit_is_refused_where_the_passport_says_approve_reject(tmp_path):
    async with console_world(tmp_path, intervention_model="approve_reject") as world:
        async with world.held("no edits", "delete_note", {"path": "/notes/x.md"}) as (approval, call):
            assert approval["plan_editing"] is False
            path = f"/v1/approvals/{approval['id']}"
            status, answer = await world.request("POST", path, json={
                "decision": "approve", "reviewer": "r", "edited_arguments": {"path": "/x"}})
            assert status == 409 and answer["error"]["code"] == "plan_editing_not_declared"
            status, _ = await world.request("POST", path, json={
                "decision": "reject", "reviewer": "r", "edited_arguments": {"path": "/x"}})
            assert status == 400
            assert world.runtime.approvals()  # still pending: approve it as it is
            assert (await world.request("POST", path, json={"decision": "approve", "reviewer": "r"}))[0] == 200
            await asyncio.wait_for(call, 30)
        assert world.server.calls == [("delete_note", {"path": "/notes/x.md"})]


async def test_the_guard_still_refuses_other_origins_and_non_json_for_the_console_api(tmp_path):
    async with console_world(tmp_path) as world:
        async with world.held("guarded", "delete_note", {"path": "/notes/g.md"}) as (approval, call):
            path = f"/v1/approvals/{approval['id']}"
            answer = {"decision": "approve", "reviewer": "r"}
            refused = [
                await world.request("POST", path, json=answer, headers={"Origin": "http://evil.example"}),
                await world.request("POST", path, data="decision=approve&reviewer=r",
                                    headers={"Content-Type": "application/x-www-form-urlencoded"}),
                await world.request("GET", "/console/", token=None, headers={"Host": "evil.example"}),
                await world.request("GET", "/v1/token", token="wrong-token-000000"),
                await world.request("GET", "/console/%2e%2e%2fauth.py", token=None),
            ]
            assert [status for status, _ in refused] == [403, 415, 421, 401, 404]
            assert world.runtime.approvals()  # none of that answered it
            # the page's own origin is let through
            status, _ = await world.request("POST", path, json=answer,
                                            headers={"Origin": world.url, "Sec-Fetch-Site": "same-origin"})
            assert status == 200
            await asyncio.wait_for(call, 30)
