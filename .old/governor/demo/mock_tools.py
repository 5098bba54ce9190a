"""A tiny MCP tool server on loopback: JSON-RPC 2.0 over HTTP POST /mcp (plain JSON answers).

Enough of MCP's streamable HTTP transport for the governor's MCP adapter and a
scripted agent: initialize, tools/list, tools/call and notifications. The tools
are the example passport's research tools over an in-memory paper index and
note store, so a tool the governor held really runs (or not) once it is answered.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from aiohttp import web

PROTOCOL_VERSION = "2025-06-18"

PAPERS = {
    "2403.01234": ("Runtime Governance for LLM Agents", "Budgets, oversight and signed enforcement records."),
    "2404.04567": ("Hash-Chained Audit Logs", "Tamper-evident logs whose verification needs no trust in the logger."),
    "2405.07890": ("Human-in-the-Loop Tool Use", "When agents should pause for a reviewer, and how long to wait."),
}


class MockTools:
    def __init__(self, notes: dict[str, str] | None = None) -> None:
        self.notes = dict(notes or {})
        self.calls: list[tuple[str, dict[str, Any]]] = []  # tools that actually ran, in order
        self._tools: dict[str, Callable[[dict[str, Any]], str]] = {
            "search_papers": self._search_papers,
            "fetch_paper": self._fetch_paper,
            "read_note": self._read_note,
            "write_note": self._write_note,
            "delete_note": self._delete_note,
        }
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port (0: a free port); returns the endpoint URL (…/mcp)."""
        app = web.Application()
        app.router.add_post("/mcp", self._rpc)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{bound_host}:{bound_port}/mcp"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _rpc(self, request: web.Request) -> web.Response:
        try:
            message = json.loads(await request.read())
        except ValueError:
            return _reply(None, error=(-32700, "parse error"))
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _reply(None, error=(-32600, "not a JSON-RPC 2.0 request"))
        method, rpc_id = message.get("method"), message.get("id")
        if isinstance(method, str) and method.startswith("notifications/"):
            return web.Response(status=202)
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        if method == "initialize":
            return _reply(rpc_id, {"protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}},
                                   "serverInfo": {"name": "governor-demo-tools", "version": "1.0"}})
        if method == "tools/list":
            return _reply(rpc_id, {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in self._tools]})
        if method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            tool = self._tools.get(name) if isinstance(name, str) else None
            if tool is None or not isinstance(arguments, dict):
                return _reply(rpc_id, error=(-32602, f"unknown tool {name!r}"))
            self.calls.append((name, arguments))
            try:
                text = tool(arguments)
            except KeyError as exc:
                return _reply(rpc_id, {"content": [{"type": "text", "text": f"missing argument {exc}"}], "isError": True})
            return _reply(rpc_id, {"content": [{"type": "text", "text": text}], "isError": False})
        return _reply(rpc_id, error=(-32601, f"method {method!r} not found"))

    # --- the tools -----------------------------------------------------------------

    def _search_papers(self, args: dict[str, Any]) -> str:
        limit = args.get("limit") if isinstance(args.get("limit"), int) else 10
        hits = list(PAPERS.items())[:limit]
        return "\n".join(f"{pid}  {title}" for pid, (title, _) in hits)

    def _fetch_paper(self, args: dict[str, Any]) -> str:
        paper = PAPERS.get(args["paper_id"])
        return f"{paper[0]}: {paper[1]}" if paper else f"no paper {args['paper_id']}"

    def _read_note(self, args: dict[str, Any]) -> str:
        return self.notes.get(args["path"], f"no note at {args['path']}")

    def _write_note(self, args: dict[str, Any]) -> str:
        self.notes[args["path"]] = str(args["content"])
        return f"wrote {args['path']} ({len(self.notes[args['path']])} characters)"

    def _delete_note(self, args: dict[str, Any]) -> str:
        path = args["path"]
        return f"deleted {path}" if self.notes.pop(path, None) is not None else f"no note at {path}"


def _reply(rpc_id: Any, result: Any = None, *, error: tuple[int, str] | None = None) -> web.Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rpc_id}
    if error is not None:
        body["error"] = {"code": error[0], "message": error[1]}
    else:
        body["result"] = result
    return web.json_response(body)
