"""The reviewer's card (#33 item 6), in a real headless Chromium against the real governor: the
card names the agent, the session's label, the step and its arguments, and says what Approve,
Reject and the review's timeout will each do, and who else is reviewing now; answering leaves
a confirmation; sessions come a page at a time. Agent- and reviewer-controlled strings stay
inert. Screenshots go to docs/images/ (console-card.png, console-confirmation.png)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import pytest_asyncio

from governor.control.review_cards import MAX_REVIEWERS, ON_APPROVE_EDITED, ON_REJECT, Presence
from tests.console_harness import chromium_browser, chromium_missing, console_world, fresh_context, sign_in

IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
CARD = "article.approval"
HOSTILE_LABEL = "<img src=x onerror=\"window.__pwned='label'\">nightly <b>cleanup</b>"
HOSTILE_REVIEWER = "<script>window.__pwned='reviewer'</script>Mallory"
HOSTILE_ARGUMENTS = {"path": "/notes/<svg onload=\"window.__pwned='args'\">.md"}

@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def launched():
    async with chromium_browser() as browser:
        yield browser


@pytest_asyncio.fixture(loop_scope="module")
async def browser(launched):
    async with fresh_context(launched, viewport={"width": 1100, "height": 900}) as context:
        yield context


@pytest.mark.asyncio(loop_scope="module")
async def test_the_approvals_list_carries_the_card(tmp_path) -> None:
    async with console_world(tmp_path) as world:
        async with world.held("nightly cleanup", "delete_note", {"path": "/notes/old.md"}) as (_, call):
            status, listed = await world.request("GET", "/v1/approvals?reviewer=Dana")
            assert status == 200
            [card] = listed["approvals"]
            assert card["agent"] == world.runtime.agent_id and card["agent"]
            assert card["session_label"] == "nightly cleanup" and card["tool"] == "delete_note"
            assert card["on_approve"] == ON_APPROVE_EDITED  # the harness's passport allows plan editing
            assert card["on_reject"] == ON_REJECT
            # the passport declares no on_oversight_timeout: the fail-closed default, a halt
            assert card["on_timeout"].startswith("the step never runs and the session halts (on_oversight_timeout)")
            assert listed["reviewers"] == ["Dana"]
            status, listed = await world.request("GET", "/v1/approvals?reviewer=Eve")
            assert listed["reviewers"] == ["Dana", "Eve"]
            await world.request("POST", f"/v1/approvals/{card['id']}", json={"decision": "reject", "reviewer": "Eve"})
            with pytest.raises(Exception):
                await asyncio.wait_for(call, 30)


def test_presence_is_bounded_and_forgets() -> None:
    now = [1000.0]
    presence = Presence(clock=lambda: now[0])
    for n in range(500):  # a page polling with a new name each time cannot grow the table
        presence.note(f"name-{n}")
    assert len(presence.seen) == MAX_REVIEWERS and presence.now_reviewing()[-1] == "name-499"
    presence.note("\x1b[31mred")  # not printable: not shown
    presence.note("x" * 10_000)
    assert all(name.isprintable() and len(name) <= 200 for name in presence.now_reviewing())
    now[0] += 11
    assert presence.now_reviewing() == []


@pytest.mark.skipif(chromium_missing() is not None, reason=chromium_missing() or "")
@pytest.mark.asyncio(loop_scope="module")
async def test_the_card_says_what_each_answer_does_and_who_else_reviews(tmp_path, browser) -> None:
    async with console_world(tmp_path) as world:
        token = await world.open_session("nightly notes cleanup")
        page = await browser.new_page()
        other = await browser.new_page()
        await sign_in(page, world)
        await sign_in(other, world, name="Sam Second")
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("delete_note", {"path": "/notes/2024/q3.md"}))
            card = page.locator(CARD)
            await card.wait_for(timeout=15_000)
            text = await card.text_content()
            assert world.runtime.agent_id in text and "nightly notes cleanup" in text
            assert "tool call delete_note" in text and '"path": "/notes/2024/q3.md"' in text
            assert ON_APPROVE_EDITED in await card.locator(".on-approve").text_content()
            assert ON_REJECT in await card.locator(".on-reject").text_content()
            assert "the session halts (on_oversight_timeout)" in await card.locator(".on-timeout").text_content()
            await page.locator("#reviewers").filter(has_text="Also reviewing now: Sam Second").wait_for(timeout=10_000)
            IMAGES.mkdir(parents=True, exist_ok=True)
            await page.locator("section.panel", has=page.locator("#approvals")).screenshot(
                path=str(IMAGES / "console-card.png"))
            await card.locator("button.approve").click()
            result = await asyncio.wait_for(call, 30)
            assert result.content[0].text == "deleted /notes/2024/q3.md"
            confirmation = page.locator("#answered .confirmation")
            await confirmation.wait_for(timeout=10_000)
            await card.wait_for(state="detached", timeout=10_000)  # gone from the pending list ...
            confirmed = await confirmation.text_content()  # ... and the answer stays confirmed
            assert confirmed.startswith("Approved delete_note in session ") and "nightly notes cleanup" in confirmed
            assert ON_APPROVE_EDITED in confirmed
            await page.locator("#answered-panel").screenshot(path=str(IMAGES / "console-confirmation.png"))
            # the other reviewer's page drops the card: it was answered
            await other.locator(CARD).wait_for(state="detached", timeout=10_000)


@pytest.mark.skipif(chromium_missing() is not None, reason=chromium_missing() or "")
@pytest.mark.asyncio(loop_scope="module")
async def test_sessions_come_a_page_at_a_time(tmp_path, browser) -> None:
    async with console_world(tmp_path) as world:
        for n in range(12):
            await world.open_session(f"session {n:02d}")
        async with world.agent(await world.open_session("busy")) as agent:
            for n in range(12):  # every session shows its bars: the rows are tall
                await agent.call_tool("read_note", {"path": f"/notes/{n}.md"})
        page = await browser.new_page()
        await sign_in(page, world)
        rows = page.locator("tr[data-session]")
        await rows.first.wait_for(timeout=15_000)
        assert await rows.count() == 8
        first_page = set(await rows.evaluate_all("rows => rows.map(r => r.dataset.session)"))
        height = await page.evaluate("document.documentElement.scrollHeight")
        await page.click("#sessions-next")
        await page.locator("#sessions-page").filter(has_text="page 2 (last)").wait_for(timeout=10_000)
        second_page = set(await rows.evaluate_all("rows => rows.map(r => r.dataset.session)"))
        assert len(second_page) == 5 and not first_page & second_page  # 13 sessions, each once
        assert await page.locator("#sessions-next").is_disabled()
        await page.click("#sessions-prev")
        await page.locator("#sessions-page").filter(has_text="page 1").wait_for(timeout=10_000)
        assert await page.locator("#sessions-prev").is_disabled()
        assert height < 3500, height  # twelve sessions on one page made 5,864 pixels


@pytest.mark.skipif(chromium_missing() is not None, reason=chromium_missing() or "")
@pytest.mark.asyncio(loop_scope="module")
async def test_hostile_labels_arguments_and_reviewer_names_are_shown_inert(tmp_path, browser) -> None:
    async with console_world(tmp_path) as world:
        token = await world.open_session(HOSTILE_LABEL)
        page = await browser.new_page()
        other = await browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), asyncio.ensure_future(dialog.dismiss())))
        await sign_in(page, world)
        await sign_in(other, world, name=HOSTILE_REVIEWER)
        async with world.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool("delete_note", HOSTILE_ARGUMENTS))
            card = page.locator(CARD)
            await card.wait_for(timeout=15_000)
            await page.locator("#reviewers").filter(has_text="Mallory").wait_for(timeout=10_000)
            assert HOSTILE_LABEL in await card.text_content()
            assert HOSTILE_REVIEWER in await page.locator("#reviewers").text_content()
            assert HOSTILE_ARGUMENTS["path"].replace('"', '\\"') in await card.locator("pre.arguments").text_content()
            assert await page.locator("main img, main script, main svg, main b").count() == 0
            await card.locator("button.reject").click()
            await page.locator("#answered .confirmation").wait_for(timeout=10_000)
            assert HOSTILE_LABEL in await page.locator("#answered .confirmation").text_content()
            with pytest.raises(Exception):
                await asyncio.wait_for(call, 30)
            await asyncio.sleep(0.5)  # an onerror/onload would have fired by now
        assert await page.evaluate("window.__pwned") is None and dialogs == []
        assert await page.locator("main img, main script, main svg, main b").count() == 0
