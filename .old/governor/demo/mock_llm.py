"""A tiny OpenAI-compatible LLM on loopback: POST /v1/chat/completions, non-streamed.

It answers every request with the next scripted reply and a fixed usage, so the
demo's budget arithmetic is exact: each answer costs `prompt_tokens +
completion_tokens` tokens, whatever the request said. It counts the requests it
served, which shows that a call the governor refused never reached it.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Sequence

from aiohttp import web

DEFAULT_REPLY = "Noted. Continuing with the research."


class MockLLM:
    def __init__(self, replies: Sequence[str] = (), *, prompt_tokens: int = 1800, completion_tokens: int = 700) -> None:
        self.replies = list(replies)
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.served = 0
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def tokens_per_call(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port (0: a free port); returns the base URL (…/v1)."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{bound_host}:{bound_port}/v1"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "'messages' must be an array")
        if body.get("stream") is True:
            return _error(400, "this mock does not stream; send stream: false")
        reply = self.replies[self.served] if self.served < len(self.replies) else DEFAULT_REPLY
        self.served += 1
        return web.json_response({
            "id": f"chatcmpl-demo-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                      "total_tokens": self.tokens_per_call},
        })


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)
