"""`governor demo`: the governor on its embedded defaults, governing a scripted agent.

Everything runs in one process on loopback, in a temporary data directory:

  mock_llm     an OpenAI-compatible chat-completions server that reports usage
  mock_tools   an MCP-over-HTTP tool server (JSON-RPC tools/call) with research notes
  agent        a scripted agent doing real HTTP through the governor's proxy
  run          the demo's flow: budget bars, an approval, the halt, the signed record
  render       the terminal output (bars redrawn in place on a TTY)
"""

from governor.demo.run import DemoOptions, DemoFailed, run_demo

__all__ = ["DemoFailed", "DemoOptions", "run_demo"]
