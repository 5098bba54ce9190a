"""The reviewer console's HTTP surface without a browser: its headers, the token check,
the verification read, and hostile plan edits against a real held step (the approval
stays pending through every refusal)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

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
    async with console_world(tmp_path) as world, aiohttp.ClientSession() as http:
        async def kind(headers):
            async with http.get(f"{world.url}/v1/token", headers=headers) as resp:
                return resp.status, await resp.json()
        assert (await kind({}))[0] == 401
        for wrong in ("Bearer wrong-token-0000000000", f"Basic {REVIEWER_TOKEN}", f"Bearer {REVIEWER_TOKEN}x",
                      "Bearer ", f"Bearer {REVIEWER_TOKEN[:-1]}"):
            status, body = await kind({"Authorization": wrong})
            assert status == 401 and body["error"]["code"] in ("token_invalid", "token_required"), wrong
        assert await kind({"Authorization": f"Bearer {REVIEWER_TOKEN}"}) == (200, {"reviewer": True, "control": False})
        assert await kind({"Authorization": f"Bearer {CONTROL_TOKEN}"}) == (200, {"reviewer": False, "control": True})


async def test_the_verification_read_verifies_a_live_record_and_needs_a_token(tmp_path):
    async with console_world(tmp_path) as world:
        token = await world.open_session("verify me")
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("delete_note", {"path": "/notes/v.md"}))
            [approval] = await world.pending()
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{world.url}/v1/approvals/{approval['id']}",
                                     json={"decision": "approve", "reviewer": "v"},
                                     headers={"Authorization": f"Bearer {REVIEWER_TOKEN}"}) as resp:
                    assert resp.status == 200
            await asyncio.wait_for(call, 30)
        session = approval["session"]
        answer = await world.get(f"/v1/sessions/{session}/verification")
        assert answer["verification"]["valid"] is True and answer["record"]["events"]
        assert [s["status"] for s in answer["verification"]["steps"]][:3] == ["pass", "pass", "pass"]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{world.url}/v1/sessions/{session}/verification") as resp:
                assert resp.status == 401
            async with http.get(f"{world.url}/v1/sessions/no-such-session/verification",
                                headers={"Authorization": f"Bearer {REVIEWER_TOKEN}"}) as resp:
                assert resp.status == 404


async def test_hostile_edits_are_refused_and_the_approval_stays_pending(tmp_path):
    async with console_world(tmp_path) as world:
        token = await world.open_session("hostile edits")
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("delete_note", {"path": "/notes/h.md"}))
            [approval] = await world.pending()
            assert approval["plan_editing"] is True
            url = f"{world.url}/v1/approvals/{approval['id']}"
            auth = {"Authorization": f"Bearer {REVIEWER_TOKEN}"}
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
            async with aiohttp.ClientSession() as http:
                for body, status in cases:
                    async with http.post(url, json=body, headers=auth) as resp:
                        assert resp.status == status, (str(body)[:80], await resp.text())
                        assert (await resp.json())["error"]["code"]
                async with http.post(url, json={"decision": "approve", "reviewer": "r",
                                                "edited_arguments": {"path": "/x"}},
                                     headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}) as resp:
                    assert resp.status == 401  # the control token reads; only a reviewer answers
                assert [a["id"] for a in world.runtime.approvals()] == [approval["id"]]
                assert world.server.calls == []
                async with http.post(url, json={"decision": "approve", "reviewer": "r",
                                                "edited_arguments": {"path": "/notes/h-copy.md"}},
                                     headers=auth) as resp:
                    answer = await resp.json()
                    assert resp.status == 200 and answer["edited"] is True
                    assert answer["original_step_digest"] == approval["step_digest"] != answer["step_digest"]
            result = await asyncio.wait_for(call, 30)
        assert world.server.calls == [("delete_note", {"path": "/notes/h-copy.md"})]
        assert result.content[0].text == "deleted /notes/h-copy.md"


async def test_an_edit_is_refused_where_the_passport_says_approve_reject(tmp_path):
    async with console_world(tmp_path, intervention_model="approve_reject") as world:
        token = await world.open_session("no edits")
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("delete_note", {"path": "/notes/x.md"}))
            [approval] = await world.pending()
            assert approval["plan_editing"] is False
            async with aiohttp.ClientSession() as http:
                url = f"{world.url}/v1/approvals/{approval['id']}"
                headers = {"Authorization": f"Bearer {REVIEWER_TOKEN}"}
                async with http.post(url, headers=headers, json={"decision": "approve", "reviewer": "r",
                                                                 "edited_arguments": {"path": "/x"}}) as resp:
                    assert resp.status == 409 and (await resp.json())["error"]["code"] == "plan_editing_not_declared"
                async with http.post(url, headers=headers, json={"decision": "reject", "reviewer": "r",
                                                                 "edited_arguments": {"path": "/x"}}) as resp:
                    assert resp.status == 400
                assert world.runtime.approvals()  # still pending: approve it as it is
                async with http.post(url, headers=headers, json={"decision": "approve", "reviewer": "r"}) as resp:
                    assert resp.status == 200
            await asyncio.wait_for(call, 30)
        assert world.server.calls == [("delete_note", {"path": "/notes/x.md"})]


async def test_the_guard_still_refuses_other_origins_and_non_json_for_the_console_api(tmp_path):
    async with console_world(tmp_path) as world:
        token = await world.open_session("guarded")
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("delete_note", {"path": "/notes/g.md"}))
            [approval] = await world.pending()
            url = f"{world.url}/v1/approvals/{approval['id']}"
            auth = {"Authorization": f"Bearer {REVIEWER_TOKEN}"}
            async with aiohttp.ClientSession() as http:
                async with http.post(url, json={"decision": "approve", "reviewer": "r"},
                                     headers={**auth, "Origin": "http://evil.example"}) as resp:
                    assert resp.status == 403
                async with http.post(url, data="decision=approve&reviewer=r",
                                     headers={**auth, "Content-Type": "application/x-www-form-urlencoded"}) as resp:
                    assert resp.status == 415
                async with http.get(f"{world.url}/console/", headers={"Host": "evil.example"}) as resp:
                    assert resp.status == 421
                async with http.get(f"{world.url}/v1/token", headers={"Authorization": "Bearer wrong-token-000000"}) as resp:
                    assert resp.status == 401
                async with http.get(f"{world.url}/console/%2e%2e%2fauth.py") as resp:
                    assert resp.status == 404
                assert world.runtime.approvals()  # none of that answered it
                origin = world.url  # the page's own origin is let through
                async with http.post(url, json={"decision": "approve", "reviewer": "r"},
                                     headers={**auth, "Origin": origin, "Sec-Fetch-Site": "same-origin"}) as resp:
                    assert resp.status == 200
            await asyncio.wait_for(call, 30)
