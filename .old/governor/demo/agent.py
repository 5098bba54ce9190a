"""The scripted agent: real HTTP through the governor's proxy, like any agent would send.

It knows nothing of the governor beyond the proxy address (what HTTP_PROXY would
say) and the ADL-Session header naming its session. Model calls are OpenAI chat
completions; tool calls are MCP `tools/call` requests. Every answer, the
governor's refusals included, comes back as a `Reply`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

MODEL = "gpt-4o-mini"  # the model the example passport declares
MAX_TOKENS = 700  # what the agent asks the model for at most (the governor reserves it)


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any  # parsed JSON, or the text when it is not JSON
    governor_action: str | None  # the ADL-Governor-Action header: set when the governor answered or changed it

    @property
    def ok(self) -> bool:
        """Answered by the upstream: HTTP 200 and no error (MCP refusals are JSON-RPC errors in a 200)."""
        return self.status == 200 and not (isinstance(self.body, dict) and "error" in self.body)

    @property
    def governor(self) -> dict[str, Any] | None:
        """The refusal's `governor` object (OpenAI error shape, or JSON-RPC error data)."""
        error = self.body.get("error") if isinstance(self.body, dict) else None
        if not isinstance(error, dict):
            return None
        found = error.get("governor")
        if found is None and isinstance(error.get("data"), dict):
            found = error["data"].get("governor")
        return found if isinstance(found, dict) else None

    @property
    def text(self) -> str:
        """The model's answer or the tool's text result ("" when there is none)."""
        if not isinstance(self.body, dict):
            return ""
        choices = self.body.get("choices")
        if isinstance(choices, list) and choices:
            return str(((choices[0] or {}).get("message") or {}).get("content") or "")
        result = self.body.get("result")
        if isinstance(result, dict):
            return "\n".join(str(c.get("text", "")) for c in result.get("content") or () if isinstance(c, dict))
        return ""


class ScriptedAgent:
    def __init__(self, *, proxy: str, llm_url: str, tools_url: str, session: str) -> None:
        self.proxy = proxy
        self.llm_url = llm_url
        self.tools_url = tools_url
        self.session = session
        self.messages: list[dict[str, str]] = [
            {"role": "system", "content": "You are a research assistant."},
        ]
        self._rpc_ids = itertools.count(1)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "ScriptedAgent":
        # trust_env=False: the demo's proxy is the governor, whatever the user's environment says
        self._http = aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=60))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def ask(self, prompt: str) -> Reply:
        """One model call: the conversation so far plus `prompt`."""
        self.messages.append({"role": "user", "content": prompt})
        reply = await self._post(f"{self.llm_url}/chat/completions",
                                 {"model": MODEL, "messages": self.messages, "max_tokens": MAX_TOKENS})
        if reply.ok:
            self.messages.append({"role": "assistant", "content": reply.text})
        return reply

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Reply:
        """One MCP tools/call."""
        return await self._post(self.tools_url, {"jsonrpc": "2.0", "id": next(self._rpc_ids), "method": "tools/call",
                                                 "params": {"name": name, "arguments": arguments}})

    async def _post(self, url: str, body: dict[str, Any]) -> Reply:
        assert self._http is not None, "use the agent as an async context manager"
        headers = {"ADL-Session": self.session, "Accept": "application/json, text/event-stream"}
        async with self._http.post(url, json=body, headers=headers, proxy=self.proxy) as response:
            raw = await response.read()
            try:
                parsed: Any = json.loads(raw)
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            return Reply(response.status, parsed, response.headers.get("ADL-Governor-Action"))
