"""A loopback mock of OpenAI's and Anthropic's asynchronous endpoints (aiohttp, over TLS),
answering as the providers' API references describe and as the official SDKs parse:

    POST /v1/files                      multipart (purpose, file) -> a file object
    POST /v1/batches, GET /v1/batches/{id}          a batch; `completed` with `usage` once finished
    POST /v1/responses (background)     a `queued` response; GET /v1/responses/{id}: `completed`, usage
    POST /v1/assistants                 an assistant
    POST /v1/threads/{id}/runs, /v1/threads/runs, .../submit_tool_outputs   a `queued` run
    GET  /v1/threads/{id}/runs/{run}    the run `completed`, with usage
    GET  /v1/files/{id}/content         the bytes uploaded
    POST /v1/fine_tuning/jobs           a job `validating_files`
    POST /v1/vector_stores/{id}/file_batches, .../files   a file batch / a vector store file
    POST /v1/messages/batches           an Anthropic message batch `in_progress`

What a finished resource reports is set per test (`finished_usage`); every request is
recorded (`requests`: method, path, body bytes), the proof of what reached the upstream.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from tests.upstreams import TLSMaterial


@dataclass
class Seen:
    method: str
    path: str
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return orjson.loads(self.body)


class AsyncMock:
    def __init__(self, tls: TLSMaterial) -> None:
        self.tls = tls
        self.requests: list[Seen] = []
        self.files: dict[str, tuple[str, bytes]] = {}  # id -> (purpose, bytes)
        self.finished_usage = (100, 50)  # (input, output) a finished response, run or batch reports
        self.asks_tool: str | None = None  # a run read is `requires_action`, asking for this tool
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def reset(self) -> None:
        self.requests.clear()
        self.finished_usage = (100, 50)
        self.asks_tool = None

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def posted(self, suffix: str) -> list[Seen]:
        return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0].endswith(suffix)]

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._record])
        r = app.router
        r.add_post("/v1/files", self._file)
        r.add_get("/v1/files/{id}/content", self._file_content)
        r.add_post("/v1/batches", self._batch)
        r.add_get("/v1/batches/{id}", self._batch_read)
        r.add_post("/v1/responses", self._response)
        r.add_get("/v1/responses/{id}", self._response_read)
        r.add_post("/v1/assistants", self._assistant)
        r.add_post("/v1/threads/runs", self._run)
        r.add_post("/v1/threads/{thread}/runs", self._run)
        r.add_post("/v1/threads/{thread}/runs/{run}/submit_tool_outputs", self._run)
        r.add_get("/v1/threads/{thread}/runs/{run}", self._run_read)
        r.add_post("/v1/fine_tuning/jobs", self._job)
        r.add_post("/v1/vector_stores/{store}/file_batches", self._file_batch)
        r.add_post("/v1/vector_stores/{store}/files", self._store_file)
        r.add_post("/v1/messages/batches", self._message_batch)
        r.add_get("/v1/messages/batches/{id}", self._message_batch_read)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls.server_context())
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Seen(request.method, request.path_qs, body, dict(request.headers)))
        return await handler(request)

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}AbC"  # ids are case-sensitive: the governor must keep their case

    # --- OpenAI ---

    async def _file(self, request: web.Request) -> web.Response:
        # the form as a server's multipart reader reads it (the stdlib's MIME parser, not the governor's)
        raw = await request.read()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {request.headers['Content-Type']}\r\n\r\n".encode() + raw)
        fields = {part.get_param("name", header="content-disposition"): part for part in message.iter_parts()}
        purpose = fields["purpose"].get_content().strip()
        data = fields["file"].get_payload(decode=True)
        file_id = self._id("file-")
        self.files[file_id] = (purpose, data)
        return web.json_response({"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                                  "filename": fields["file"].get_filename(), "purpose": purpose,
                                  "status": "processed", "expires_at": None, "status_details": None})

    async def _file_content(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["id"]
        # a file this mock did not take in: its results, of the size its id names (file-big-<bytes>)
        data = self.files[file_id][1] if file_id in self.files else bytes(range(256)) * (int(file_id[9:]) // 256)
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.enable_chunked_encoding()  # as a large download comes: its size is known only at its end
        await response.prepare(request)
        for start in range(0, len(data), 64 * 1024):
            await response.write(data[start:start + 64 * 1024])
        await response.write_eof()
        return response

    def _batch_object(self, batch_id: str, body: dict[str, Any], status: str) -> dict[str, Any]:
        now = int(time.time())
        batch = {"id": batch_id, "object": "batch", "endpoint": body.get("endpoint", "/v1/chat/completions"),
                 "errors": None, "input_file_id": body.get("input_file_id", "file-x"),
                 "completion_window": "24h", "status": status, "output_file_id": None, "error_file_id": None,
                 "created_at": now, "in_progress_at": None, "expires_at": now + 86400, "finalizing_at": None,
                 "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
                 "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": None}
        if status == "completed":
            inputs, outputs = self.finished_usage
            batch.update(completed_at=now, output_file_id="file-out", usage={
                "input_tokens": inputs, "output_tokens": outputs, "total_tokens": inputs + outputs,
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}})
        return batch

    async def _batch(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(self._batch_object(self._id("batch_"), body, "validating"))

    async def _batch_read(self, request: web.Request) -> web.Response:
        return web.json_response(self._batch_object(request.match_info["id"], {}, "completed"))

    def _response_object(self, response_id: str, model: str, status: str) -> dict[str, Any]:
        response: dict[str, Any] = {
            "id": response_id, "object": "response", "created_at": int(time.time()), "status": status,
            "background": True, "error": None, "incomplete_details": None, "instructions": None,
            "max_output_tokens": None, "model": model, "output": [], "parallel_tool_calls": True,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": True,
            "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
            "top_p": 1.0, "truncation": "disabled", "usage": None, "user": None, "metadata": {}}
        if status == "completed":
            inputs, outputs = self.finished_usage
            response["output"] = [{"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                                   "content": [{"type": "output_text", "text": "done", "annotations": []}]}]
            response["usage"] = {"input_tokens": inputs, "input_tokens_details": {"cached_tokens": 0},
                                 "output_tokens": outputs, "output_tokens_details": {"reasoning_tokens": 0},
                                 "total_tokens": inputs + outputs}
        return response

    async def _response(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(self._response_object(self._id("resp_"), body.get("model", ""), "queued"))

    async def _response_read(self, request: web.Request) -> web.Response:
        return web.json_response(self._response_object(request.match_info["id"], "gpt-4o-mini", "completed"))

    async def _assistant(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"id": self._id("asst_"), "object": "assistant", "created_at": int(time.time()),
                                  "name": body.get("name"), "description": None, "model": body["model"],
                                  "instructions": body.get("instructions"), "tools": [], "metadata": {},
                                  "top_p": 1.0, "temperature": 1.0, "response_format": "auto",
                                  "tool_resources": {}})

    def _run_object(self, run_id: str, thread: str, model: str, status: str) -> dict[str, Any]:
        now = int(time.time())
        run: dict[str, Any] = {
            "id": run_id, "object": "thread.run", "created_at": now, "assistant_id": "asst_1", "thread_id": thread,
            "status": status, "started_at": None, "expires_at": now + 600, "cancelled_at": None, "failed_at": None,
            "completed_at": None, "required_action": None, "last_error": None, "model": model, "instructions": "",
            "tools": [], "metadata": {}, "incomplete_details": None, "usage": None, "temperature": 1.0, "top_p": 1.0,
            "max_prompt_tokens": None, "max_completion_tokens": None,
            "truncation_strategy": {"type": "auto", "last_messages": None}, "response_format": "auto",
            "tool_choice": "auto", "parallel_tool_calls": True}
        if status == "completed":
            inputs, outputs = self.finished_usage
            run.update(completed_at=now, usage={"prompt_tokens": inputs, "completion_tokens": outputs,
                                                "total_tokens": inputs + outputs})
        return run

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        run_id = request.match_info.get("run") or self._id("run_")
        return web.json_response(self._run_object(run_id, request.match_info.get("thread", "thread_new"),
                                                  body.get("model") or "gpt-4o-mini", "queued"))

    async def _run_read(self, request: web.Request) -> web.Response:
        if self.asks_tool is None:
            return web.json_response(self._run_object(request.match_info["run"], request.match_info["thread"],
                                                      "gpt-4o-mini", "completed"))
        run = self._run_object(request.match_info["run"], request.match_info["thread"], "gpt-4o-mini",
                               "requires_action")
        run["required_action"] = {"type": "submit_tool_outputs", "submit_tool_outputs": {"tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": self.asks_tool, "arguments": "{}"}}]}}
        return web.json_response(run)

    async def _job(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({
            "id": self._id("ftjob-"), "object": "fine_tuning.job", "created_at": int(time.time()), "error": None,
            "fine_tuned_model": None, "finished_at": None, "hyperparameters": {"n_epochs": "auto",
                                                                               "batch_size": "auto",
                                                                               "learning_rate_multiplier": "auto"},
            "model": body["model"], "organization_id": "org-1", "result_files": [], "seed": 1,
            "status": "validating_files", "trained_tokens": None, "training_file": body["training_file"],
            "validation_file": None, "estimated_finish": None, "integrations": None, "metadata": None})

    async def _file_batch(self, request: web.Request) -> web.Response:
        return web.json_response({
            "id": self._id("vsfb_"), "object": "vector_store.files_batch", "created_at": int(time.time()),
            "status": "in_progress", "vector_store_id": request.match_info["store"],
            "file_counts": {"in_progress": 1, "completed": 0, "failed": 0, "cancelled": 0, "total": 1}})

    async def _store_file(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({
            "id": body["file_id"], "object": "vector_store.file", "created_at": int(time.time()), "usage_bytes": 0,
            "vector_store_id": request.match_info["store"], "status": "in_progress", "last_error": None})

    # --- Anthropic ---

    def _message_batch_object(self, batch_id: str, count: int) -> dict[str, Any]:
        return {"id": batch_id, "type": "message_batch", "processing_status": "in_progress",
                "request_counts": {"processing": count, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
                "ended_at": None, "created_at": "2026-11-27T00:00:00Z", "expires_at": "2026-11-28T00:00:00Z",
                "archived_at": None, "cancel_initiated_at": None, "results_url": None}

    async def _message_batch(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(self._message_batch_object(self._id("msgbatch_"), len(body["requests"])))

    async def _message_batch_read(self, request: web.Request) -> web.Response:
        return web.json_response(self._message_batch_object(request.match_info["id"], 1))
