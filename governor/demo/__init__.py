"""`governor demo`: the governor on its embedded defaults, governing a scripted agent.

Everything runs in one process on loopback, in a temporary data directory:

  mock_llm     an OpenAI-compatible chat-completions server that reports usage
  mock_tools   an MCP-over-HTTP tool server (JSON-RPC tools/call) with research notes
  agent        a scripted agent doing real HTTP through the governor's proxy
  run          the demo's flow: budget bars, an approval, the halt, the signed record
  render       the terminal output (bars redrawn in place on a TTY)
"""

from typing import Any

__all__ = ["DemoFailed", "DemoOptions", "run_demo"]


def __getattr__(name: str) -> Any:
    # the demo's flow (the whole proxy, mitmproxy) is imported when first asked for: every
    # `governor` command registers `demo` (governor.cli.demo), and most never run it
    if name in __all__:
        from governor.demo import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
