"""An A2A 1.0 client of the `a2a-sdk` 1.x through an HTTP proxy: argv = the peer's agent card
URL base, proxy URL, binding (JSONRPC or HTTP+JSON), streaming (0/1), text. Prints one JSON
line: {"text": the answer's text} or {"error": class name, "message": ...}."""

import asyncio
import json
import sys

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.helpers.proto_helpers import get_message_text, new_text_message
from a2a.types import Role, SendMessageRequest


async def main() -> None:
    base, proxy, binding, streaming, text = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
    async with httpx.AsyncClient(proxy=proxy or None, trust_env=False, timeout=60) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        config = ClientConfig(httpx_client=http, streaming=streaming, supported_protocol_bindings=[binding])
        client = ClientFactory(config).create(card)
        texts = []
        try:
            async for event in client.send_message(SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))):
                response = event[0] if isinstance(event, tuple) else event
                if response.HasField("message"):
                    texts.append(get_message_text(response.message))
                elif response.HasField("task") and response.task.history:
                    texts.extend(get_message_text(m) for m in response.task.history if m.role == Role.ROLE_AGENT)
        except Exception as exc:  # what the SDK raises, as the agent sees it
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
            return
        print(json.dumps({"text": " ".join(texts)}))


asyncio.run(main())
