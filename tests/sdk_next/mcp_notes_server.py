"""An MCP server of the `mcp` SDK 2.x (the 2026-07-28 revision, stateless streamable HTTP),
run by tests/test_protocols_next.py from .ci/sdk-tools' venv: argv = port, calls file.
Each tool run is appended to the calls file, one JSON line, so the test sees what ran."""

import json
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

port, calls_file = int(sys.argv[1]), sys.argv[2]
mcp = MCPServer("notes", log_level="WARNING")


def ran(name: str, **arguments) -> None:
    with open(calls_file, "a") as out:
        out.write(json.dumps({"tool": name, "arguments": arguments}) + "\n")


@mcp.tool()
def read_note(path: str) -> str:
    """Read a research note."""
    ran("read_note", path=path)
    return f"contents of {path}"


@mcp.tool()
def delete_note(path: str) -> str:
    """Delete a research note."""
    ran("delete_note", path=path)
    return f"deleted {path}"


@mcp.tool()
def shell(cmd: str) -> str:
    """Run a shell command (declared by no passport)."""
    ran("shell", cmd=cmd)
    return "ran"


app = mcp.streamable_http_app(stateless_http=True)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
