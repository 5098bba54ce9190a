"""The reviewer console in a real headless Chromium (Debian's, driven by Playwright) against
the real governor: an MCP agent's requires_confirmation step held by the real proxy is
approved, rejected or edited through the page; agent-controlled strings stay inert; a
wrong token is refused. See tests/console_harness.py for the world. Chromium is launched once
for the module (its start is the slow part); each test has its own context (cookies, storage,
pages) and its own governor."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import pytest_asyncio
from mcp.shared.exceptions import McpError

from governor.common.canonical import digest_of
from governor.control.reviewer_console import CONTENT_SECURITY_POLICY
from tests.console_harness import (
    CONTROL_TOKEN, REVIEWER_TOKEN, chromium_browser, chromium_missing, console_world, fresh_context, sign_in,
)

pytestmark = [pytest.mark.skipif(chromium_missing() is not None, reason=chromium_missing() or ""),
              pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def launched():
    async with chromium_browser() as browser:
        yield browser


@pytest_asyncio.fixture(loop_scope="module")
async def browser(launched):
    async with fresh_context(launched) as context:
        yield context

CARD = "article.approval"


def _step_digest(tool: str, arguments: dict) -> str:
    return digest_of({"tool": tool, "arguments": arguments})


async def _events(world, session: str) -> list[dict]:
    return (await world.get(f"/v1/sessions/{session}/record"))["events"]


async def test_a_held_step_is_approved_through_the_page_and_the_agent_continues(tmp_path, browser):
    async with console_world(tmp_path) as world:
        token = await world.open_session("approve me")
        page = await browser.new_page()
        await sign_in(page, world)
        await page.locator("#console").wait_for()
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("delete_note", {"path": "/notes/old.md"}))
            card = page.locator(CARD)
            await card.wait_for(timeout=15_000)
            assert await card.locator(".tool").text_content() == "delete_note"
            assert '"path": "/notes/old.md"' in await card.locator("pre.arguments").text_content()
            assert "left" in await card.locator(".timeleft").text_content()
            assert not call.done() and world.server.calls == []  # held: the tool has not run
            await card.locator("button.approve").click()
            result = await asyncio.wait_for(call, 30)
            after = await agent.call_tool("read_note", {"path": "/notes/next.md"})  # the agent goes on
            await card.wait_for(state="detached", timeout=10_000)
        assert result.content[0].text == "deleted /notes/old.md" and not after.isError
        assert world.server.calls == [("delete_note", {"path": "/notes/old.md"}),
                                      ("read_note", {"path": "/notes/next.md"})]
        session = (await world.get("/v1/sessions"))["sessions"][0]["session"]
        approved = [e for e in await _events(world, session) if e["detail"].get("review") == "approved"]
        assert [e["detail"]["reviewer"] for e in approved] == ["Dana Reviewer"]


async def test_a_rejection_through_the_page_refuses_the_step_and_the_tool_never_runs(tmp_path, browser):
    async with console_world(tmp_path) as world:
        token = await world.open_session("reject me")
        page = await browser.new_page()
        await sign_in(page, world, name="Rui Reviewer")
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("send_email", {"to": "all@example.org", "subject": "s",
                                                                      "body": "b"}))
            await page.locator(CARD).wait_for(timeout=15_000)
            await page.locator(f"{CARD} input.note").fill("no mass mail <b>today</b>")
            await page.locator(f"{CARD} button.reject").click()
            with pytest.raises(McpError) as refused:
                await asyncio.wait_for(call, 30)
            assert (await agent.call_tool("read_note", {"path": "/notes/a.md"})).isError is False
        assert refused.value.error.data["governor"]["action"] == "deny"
        assert not any(name == "send_email" for name, _ in world.server.calls)
        session = (await world.get("/v1/sessions"))["sessions"][0]["session"]
        rejected = [e for e in await _events(world, session) if e["detail"].get("review") == "rejected"]
        assert rejected and rejected[0]["detail"]["reviewer"] == "Rui Reviewer"
        assert rejected[0]["detail"]["reason"] == "no mass mail <b>today</b>"


async def test_a_plan_edit_sends_the_edited_arguments_upstream_and_records_both_digests(tmp_path, browser):
    original, edited = {"path": "/notes/important.md"}, {"path": "/notes/scratch.md"}
    async with console_world(tmp_path) as world:
        token = await world.open_session("edit me")
        page = await browser.new_page()
        await sign_in(page, world)
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("delete_note", original))
            card = page.locator(CARD)
            await card.wait_for(timeout=15_000)
            await card.locator("button.edit").click()
            await card.locator("textarea.edited").fill('{"path": "/notes/scratch.md"}')
            await card.get_by_role("button", name="Approve edited step").click()
            result = await asyncio.wait_for(call, 30)
        # the upstream tool server received the reviewer's arguments, never the agent's
        assert world.server.calls == [("delete_note", edited)]
        assert result.content[0].text == "deleted /notes/scratch.md"
        session = (await world.get("/v1/sessions"))["sessions"][0]["session"]
        events = await _events(world, session)
        approval = next(e for e in events if e["detail"].get("review") == "approved")
        assert approval["detail"]["edited"] is True
        assert approval["detail"]["original_step_digest"] == _step_digest("delete_note", original)
        assert approval["detail"]["step_digest"] == _step_digest("delete_note", edited)
        # the record verifies, shown on the page, its passport binding checked against the pinned passport
        await page.locator("tr[data-session]", has_text="edit me").locator("button.open-record").click()
        verdict = await page.locator("#verdict").text_content()
        assert verdict.startswith("No step failed; not every step ran in full (step 2)"), verdict
        binding = page.locator("#verification li", has_text="passport binding")
        assert await binding.get_attribute("class") == "pass"
        assert (await binding.text_content()).startswith("4. passport binding: pass — subject.passport_digest matches")


XSS_ARGUMENTS = {
    "to": "<script>window.__pwned = 'script'; alert('script')</script>",
    "subject": "<img src=x onerror=\"window.__pwned='img'; alert('img')\">",
    "body": "</pre><svg onload=\"window.__pwned='svg'\"><iframe src=\"javascript:window.__pwned='iframe'\">",
}
XSS_LABEL = "<img src=x onerror=\"window.__pwned='label'\"><script>window.__pwned='label-script'</script>"


async def test_agent_controlled_strings_are_rendered_inert(tmp_path, browser):
    async with console_world(tmp_path) as world:
        token = await world.open_session(XSS_LABEL)
        page = await browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), asyncio.ensure_future(dialog.dismiss())))
        response = await page.goto(world.console)
        headers = response.headers
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
        await sign_in(page, world)
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("send_email", XSS_ARGUMENTS))
            card = page.locator(CARD)
            await card.wait_for(timeout=15_000)
            await page.locator("tr[data-session] .label").wait_for()
            shown = await card.locator("pre.arguments").text_content()
            for value in XSS_ARGUMENTS.values():  # shown as the text it is
                assert value.replace('"', '\\"') in shown
            assert await page.locator("tr[data-session] .label").text_content() == XSS_LABEL
            # nothing was parsed as markup, nothing ran
            assert await page.locator("main img, main script, main svg, main iframe").count() == 0
            await page.locator("tr[data-session] button.open-record").click()
            await page.locator("#verdict").wait_for()
            await asyncio.sleep(0.5)  # an onerror/onload would have fired by now
            assert await page.evaluate("window.__pwned") is None
            assert dialogs == []
            await card.locator("button.reject").click()
            with pytest.raises(McpError):
                await asyncio.wait_for(call, 30)
        assert await page.evaluate("window.__pwned") is None and dialogs == []


async def test_a_wrong_token_is_refused_and_the_token_never_reaches_a_url_or_cookie(tmp_path, browser):
    async with console_world(tmp_path) as world:
        page = await browser.new_page()
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        await sign_in(page, world, token="not-a-token-of-this-governor-0000")
        await page.locator("#sign-in-error").filter(has_text="Token refused").wait_for(timeout=10_000)
        assert await page.locator("#console").is_hidden()
        assert await page.evaluate("sessionStorage.getItem('governor.token')") is None
        # the control token reads but cannot answer: the page says so and offers no answer
        await sign_in(page, world, token=CONTROL_TOKEN)
        await page.locator("#whoami").filter(has_text="read only").wait_for(timeout=10_000)
        await page.click("#sign-out")
        await sign_in(page, world)
        await page.locator("#whoami").filter(has_text="(reviewer)").wait_for(timeout=10_000)
        assert await page.evaluate("document.cookie") == ""
        assert not any(REVIEWER_TOKEN in url or CONTROL_TOKEN in url for url in requests)
        assert (await browser.cookies()) == []


async def test_an_agent_lock_is_shown_and_lifted_through_the_page(tmp_path, browser):
    async with console_world(tmp_path) as world:
        token = await world.open_session("swaps its passport")
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "read_note", "arguments": {"path": "/notes/l.md"}}}
        async with httpx.AsyncClient(proxy=world.governor.proxy_url, trust_env=False, timeout=30) as agent:
            # a passport other than the pinned one: a session-integrity halt, which locks the agent
            swapped = await agent.post(world.server.url, json=call, headers={
                "ADL-Session": token, "ADL-Passport": "sha256=" + "A" * 43,
                "Accept": "application/json, text/event-stream"})
        assert swapped.status_code == 403
        page = await browser.new_page()
        # a reviewer answers held steps but cannot lift the barrier (#32 item 7): the page says why
        await sign_in(page, world, name="Rita Reviewer")
        row = page.locator("tr[data-lock]")
        await row.locator("button.lift").wait_for(timeout=15_000)
        assert "on_governor_session_integrity" in await row.text_content()
        await row.locator("button.lift").click()
        await row.locator(".error").filter(has_text="lifted only by the principal").wait_for(timeout=10_000)
        assert (await world.get("/v1/locks"))["locked"] is True
        await page.click("#sign-out")
        await sign_in(page, world, token=CONTROL_TOKEN, name="Lee Lifter")  # the principal
        await row.locator("button.lift").wait_for(timeout=15_000)
        await row.locator("button.lift").click()
        await row.filter(has_text="lifted by Lee Lifter as principal").wait_for(timeout=10_000)
        locks = await world.get("/v1/locks")
        assert locks["locked"] is False and locks["locks"][0]["lifted_by"] == "Lee Lifter as principal"
