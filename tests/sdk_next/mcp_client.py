"""An MCP client of the `mcp` SDK 2.x through an HTTP proxy: argv = server URL, proxy URL,
JSON list of actions (["list"] or ["call", tool, arguments]). Prints one JSON line: a result
per action, {"tools": [...]}, {"text": ..., "is_error": ...} or {"error": ..., "code": ...,
"data": ...} for an MCPError."""

import asyncio
import json
import sys

import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


async def main() -> None:
    url, proxy, actions = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    results = []
    async with httpx2.AsyncClient(proxy=proxy, trust_env=False, timeout=httpx2.Timeout(60.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="auto") as client:
            for action in actions:
                try:
                    if action[0] == "list":
                        listed = await client.list_tools()
                        results.append({"tools": sorted(t.name for t in listed.tools)})
                    else:
                        result = await client.call_tool(action[1], action[2])
                        text = "".join(getattr(c, "text", "") for c in result.content)
                        results.append({"text": text, "is_error": result.is_error})
                except MCPError as exc:
                    results.append({"error": str(exc), "code": exc.error.code, "data": exc.error.data})
    print(json.dumps(results))


asyncio.run(main())
