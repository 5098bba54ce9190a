"""An A2A 1.0 peer agent of the `a2a-sdk` 1.x (JSON-RPC at /a2a, HTTP+JSON under /rest), run
by tests/test_protocols_next.py from .ci/sdk-tools' venv: argv = port, passports file (JSON:
{file name: signed passport}), received file. It also serves its ADL discovery document
and passports, as a peer the governor can verify. Each message received is appended to the
received file (one JSON line with the A2A-side headers the governor sets)."""

import json
import sys

import uvicorn
from a2a.helpers.proto_helpers import new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

port, passports_file, received_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
passports = json.load(open(passports_file))
base = f"http://127.0.0.1:{port}"


class Summarizer(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue) -> None:
        text = context.get_user_input()
        headers = dict(context.call_context.state.get("headers", {})) if context.call_context else {}
        with open(received_file, "a") as out:
            out.write(json.dumps({"text": text, "depth": headers.get("adl-delegation-depth"),
                                  "session": headers.get("adl-session")}) + "\n")
        await event_queue.enqueue_event(new_text_message(f"done: {text}"))

    async def cancel(self, context: RequestContext, event_queue) -> None:
        return None


card = AgentCard(
    name=next(iter(passports.values()))["name"], description="summarizes papers", version="1.0.0",
    supported_interfaces=[AgentInterface(url=f"{base}/a2a", protocol_binding="JSONRPC", protocol_version="1.0"),
                          AgentInterface(url=f"{base}/rest", protocol_binding="HTTP+JSON", protocol_version="1.0")],
    capabilities=AgentCapabilities(streaming=True), default_input_modes=["text/plain"],
    default_output_modes=["text/plain"],
    skills=[AgentSkill(id="summarize", name="summarize", description="summarize", tags=["papers"])],
)
handler = DefaultRequestHandler(agent_executor=Summarizer(), task_store=InMemoryTaskStore(), agent_card=card)


async def discovery(request):
    return JSONResponse({"adl_discovery": "1.0", "agents": [
        {"id": doc["id"], "name": doc["name"], "adl_document": f"/passports/{name}"}
        for name, doc in passports.items()]})


async def passport(request):
    return JSONResponse(passports[request.path_params["file"]])


routes = [Route("/.well-known/adl-agents", discovery), Route("/passports/{file}", passport),
          *create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/a2a"),
          *create_rest_routes(handler, path_prefix="/rest")]
uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning")
