"""The reviewer console's world: the real governor (real runtime, policy, SQLite store,
journal, proxy and control plane) in front of the notes MCP server, sessions opened by a
principal, and a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright;
nothing is downloaded: `playwright install` is never run).

Used by tests/test_console_browser.py and by `python -m tests.console_harness DIR`, which
takes the screenshots in docs/images/.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from governor.adapters.base import AdapterConfig
from governor.runtime.metrics import Metrics
from governor.proxy.server import Settings, serve
from tests.control_harness import real_runtime
from tests.test_mcp_sdk import NotesServer, mcp_session

CHROMIUM = os.environ.get("GOVERNOR_TEST_CHROMIUM", "/usr/bin/chromium")
REVIEWER_TOKEN = "console-reviewer-token-0123456789"
CONTROL_TOKEN = "console-control-token-0123456789"


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return (f"no Chromium at {CHROMIUM}: `.ci/dev test` installs Debian's (apt-get install chromium); "
                "the console's browser tests need it")
    return None


def _tool(name: str, *, confirm: bool = False, **properties: str) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": name, "description": f"the {name} tool",
                            "parameters": {"type": "object",
                                           "properties": {k: {"type": v} for k, v in properties.items()}}}
    if confirm:
        tool["requires_confirmation"] = True
    return tool


def passport(intervention_model: str = "plan_editing") -> dict[str, Any]:
    return {
        "adl_spec": "0.4.0", "name": "notes-agent", "description": "keeps research notes", "version": "1.0.0",
        "id": "https://example.com/agents/notes-agent", "data_classification": {"sensitivity": "internal"},
        "lifecycle": {"status": "active"},
        "tools": [
            _tool("read_note", path="string"),
            _tool("delete_note", confirm=True, path="string"),
            _tool("send_email", confirm=True, to="string", subject="string", body="string"),
        ],
        "permissions": {"resource_limits": {"max_concurrent": 8, "budget": {"tokens": {"per_session": 200000}, "cost_usd": {"per_session": 5}}}},
        "runtime": {"tool_invocation": {"max_iterations": 50, "max_tool_calls_per_session": 20}},
        "human_oversight": {"triggers": ["a reviewer confirms every deletion and email"],
                            "intervention_model": intervention_model, "response_time_minutes": 10},
    }


class ConsoleWorld:
    def __init__(self, server: NotesServer, runtime: Any, governor: Any) -> None:
        self.server, self.runtime, self.governor = server, runtime, governor
        self.url = governor.control_url
        self.console = f"{governor.control_url}/console/"

    async def open_session(self, label: str) -> str:
        """A session a principal opens (the default mode); returns the agent's ADL-Session token."""
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{self.url}/v1/sessions", json={"label": label},
                                 headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}) as resp:
                assert resp.status == 201, await resp.text()
                return (await resp.json())["token"]

    @contextlib.asynccontextmanager
    async def agent(self, token: str):
        async with mcp_session(self.server.url, self.governor.proxy_url, headers={"ADL-Session": token}) as session:
            yield session

    async def pending(self, timeout: float = 20.0) -> list[dict[str, Any]]:
        for _ in range(int(timeout / 0.05)):
            if approvals := self.runtime.approvals():
                return approvals
            await asyncio.sleep(0.05)
        raise AssertionError("no approval became pending")

    @contextlib.asynccontextmanager
    async def held(self, label: str, tool: str, arguments: dict[str, Any]):
        """A session `label` whose agent's call of `tool` is held for review: yields (the
        pending approval, the agent's call as a task); the agent stays connected inside."""
        token = await self.open_session(label)
        async with self.agent(token) as agent:
            call = asyncio.create_task(agent.call_tool(tool, arguments))
            [approval] = await self.pending()
            yield approval, call

    async def request(self, method: str, path: str, token: str | None = REVIEWER_TOKEN,
                      headers: dict[str, str] | None = None, **options: Any) -> tuple[int, Any]:
        """One request to the control plane at `path` with the bearer `token` (None: no
        Authorization): (status, the JSON answer or else the text)."""
        auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with aiohttp.ClientSession() as http:
            async with http.request(method, f"{self.url}{path}", headers={**auth, **(headers or {})}, **options) as resp:
                body = await resp.json() if resp.content_type == "application/json" else await resp.text()
                return resp.status, body

    async def get(self, path: str) -> Any:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.json()


@contextlib.asynccontextmanager
async def console_world(tmp: Path, intervention_model: str = "plan_editing") -> AsyncIterator[ConsoleWorld]:
    metrics = Metrics()
    runtime, _ = real_runtime(passport(intervention_model), tmp, metrics=metrics, sweep_interval_sec=0.2)
    server = NotesServer().start()
    settings = Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp,
                        reviewer_tokens=(REVIEWER_TOKEN,), control_token=CONTROL_TOKEN,
                        adapters=AdapterConfig(extra={"allowed_tools": runtime.allowed_tools}))
    governor = await serve(settings, runtime, metrics=metrics)
    try:
        yield ConsoleWorld(server, runtime, governor)
    finally:
        await governor.stop()
        server.stop()


@contextlib.asynccontextmanager
async def chromium_browser():
    """A headless Chromium (Debian's), launched once: give each test its own context."""
    from playwright.async_api import async_playwright

    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            await browser.close()


@contextlib.asynccontextmanager
async def fresh_context(browser: Any, **context: Any):
    """One fresh context of a launched Chromium: its own cookies, storage and pages."""
    made = await browser.new_context(**context)
    try:
        yield made
    finally:
        await made.close()


@contextlib.asynccontextmanager
async def chromium(**context: Any):
    """A headless Chromium (Debian's), one fresh context (no shared storage)."""
    async with chromium_browser() as browser, fresh_context(browser, **context) as made:
        yield made


async def sign_in(page: Any, world: ConsoleWorld, token: str = REVIEWER_TOKEN, name: str = "Dana Reviewer") -> None:
    await page.goto(world.console)
    await page.fill("#token", token)
    await page.fill("#reviewer", name)
    await page.click("#sign-in-button")


# --- screenshots for docs/images --------------------------------------------------------


async def screenshots(out: Path, tmp: Path) -> None:
    """The console with a pending approval, and its sessions with a record open."""
    out.mkdir(parents=True, exist_ok=True)
    async with console_world(tmp) as world, chromium(viewport={"width": 1100, "height": 760}) as browser:
        token = await world.open_session("nightly notes cleanup")
        other = await world.open_session("weekly digest")
        async with world.agent(other) as agent:
            await agent.call_tool("read_note", {"path": "/notes/digest.md"})
            await agent.call_tool("read_note", {"path": "/notes/links.md"})
        async with world.agent(token) as agent:
            await agent.call_tool("read_note", {"path": "/notes/2024/q3.md"})
            call = asyncio.create_task(agent.call_tool("delete_note", {"path": "/notes/2024/q3.md"}))
            await world.pending()
            page = await browser.new_page()
            await sign_in(page, world)
            await page.locator("article.approval").first.wait_for()
            await page.screenshot(path=str(out / "console-approval.png"))
            await page.locator("article.approval button.approve").first.click()
            await asyncio.wait_for(call, 30)
            await page.locator("article.approval").wait_for(state="detached")
            await page.locator("tr[data-session]", has_text="nightly notes cleanup").locator("button.open-record").click()
            await page.locator("#verdict").wait_for()
            await page.evaluate("document.querySelector('#sessions').parentElement.scrollIntoView()")
            await page.screenshot(path=str(out / "console-sessions.png"))


if __name__ == "__main__":
    import tempfile

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(screenshots(target, Path(scratch)))
    print(f"screenshots written to {target}")
