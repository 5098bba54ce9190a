"""bench/scaling.py's lean harness: wrk as its load generator (bench/wrk_load.py) counts every
response by status against a real server, through a real governor as a proxy every request it
sent was governed, and the lean mock upstream (bench/lean_upstream.py) answers as the aiohttp
one does and refuses what it cannot read. The numbers themselves are bench/scaling.py's."""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
from pathlib import Path

import pytest
from aiohttp import web

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import scaling  # noqa: E402
import wrk_load  # noqa: E402
from lean_upstream import LeanUpstream  # noqa: E402

needs_wrk = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (.ci/dev components wrk)")


@pytest.fixture(scope="module")
def lean_upstream() -> LeanUpstream:
    with LeanUpstream() as upstream:
        yield upstream


@pytest.fixture
async def every_third_refused() -> str:
    """Loopback: POST / answers 200, except every third request: 429."""
    seen = [0]

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        seen[0] += 1
        return web.json_response({"n": seen[0]}, status=429 if seen[0] % 3 == 0 else 200)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", seen
    finally:
        await runner.cleanup()


@needs_wrk
async def test_wrk_counts_every_response_by_status_and_its_own_cpu(every_third_refused) -> None:
    url, seen = every_third_refused
    answer = await asyncio.to_thread(wrk_load.WrkLoad().ask, {
        "url": url, "proxy": None, "body": common.chat_body(), "concurrency": 2, "duration": 1, "warmup": 0})
    statuses = answer["statuses"]
    assert set(statuses) == {"200", "429"}, statuses  # non-200 counted, not hidden
    # what the server answered, less what was in flight when wrk stopped (one per connection)
    assert seen[0] - 2 <= sum(statuses.values()) <= seen[0]
    assert abs(statuses["429"] - sum(statuses.values()) / 3) <= 2
    assert answer["load_cpu_seconds"] > 0 and answer["elapsed"] >= 1.0 and answer["warmup_count"] == 0


def test_wrk_output_without_a_result_or_with_a_count_that_does_not_add_up_is_an_error() -> None:
    with pytest.raises(ValueError, match="no WRK-RESULT line"):
        wrk_load.parse("Running 1s test @ http://127.0.0.1:1/\n  unable to connect to 127.0.0.1:1\n")
    line = ('WRK-RESULT {"requests": 5, "duration_us": 1000000, "bytes": 10, "statuses": {"200": 4}, '
            '"errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}, '
            '"latency_us": {"p50": 1, "p99": 2, "max": 3}}')
    with pytest.raises(ValueError, match="wrk counted 5 responses, its script 4"):
        wrk_load.parse(line)
    whole = wrk_load.parse(line.replace('"200": 4', '"200": 4, "503": 1').replace('"read": 0', '"read": 2'))
    assert wrk_load.statuses(whole) == {"200": 4, "503": 1, "error": 2}


def test_the_lua_string_holds_any_body_exactly() -> None:
    text = 'a "quoted" \\ back\nslash, tab\t, é and 🙂'
    literal = wrk_load.lua_string(text)
    assert literal.isascii() and "\n" not in literal
    # decode it the way Lua reads a decimal escape: \ddd is one byte
    raw, i, body = bytearray(), 0, literal[1:-1]
    while i < len(body):
        if body[i] == "\\":
            raw.append(int(body[i + 1:i + 4]))
            i += 4
        else:
            raw.append(ord(body[i]))
            i += 1
    assert raw.decode() == text


@needs_wrk
def test_wrk_through_the_governor_sends_requests_it_governs(tmp_path: Path, lean_upstream: LeanUpstream) -> None:
    """Absolute-form requests from wrk through `governor run`: every one answered was a
    step of the session (the ones wrk cut at its end reached the governor too)."""
    with common.Governor(common.write_passport(tmp_path / "passport.json"), tmp_path / "data") as governor:
        answer = wrk_load.WrkLoad().ask({
            "url": common.upstream_url(lean_upstream.port), "proxy": f"{common.HOST}:{governor.port}",
            "body": common.chat_body(), "concurrency": 4, "duration": 1, "warmup": 0})
        assert set(answer["statuses"]) == {"200"}, answer
        answered = answer["statuses"]["200"]
        steps = scaling.session_steps((governor, "bench"))
    assert answered > 0 and answered <= steps <= answered + 4


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send `data` on one connection; read until the server closes it (or 5 s)."""
    with socket.create_connection((common.HOST, port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_the_lean_upstream_answers_as_the_aiohttp_one_pipelined_too(lean_upstream: LeanUpstream) -> None:
    body = common.chat_body()
    request = common.request_bytes(common.upstream_url(lean_upstream.port), body, via_proxy=False)
    answers = raw_exchange(lean_upstream.port, request * 2).split(b"HTTP/1.1 ")[1:]
    assert len(answers) == 2 and answers[0] == answers[1]
    head, _, payload = answers[0].partition(b"\r\n\r\n")
    assert head.startswith(b"200 OK") and b"Content-Type: application/json" in head
    import orjson

    request_doc = orjson.loads(body)
    assert payload == common.plain_answer(request_doc["model"], common.mock_usage(request_doc))


@pytest.mark.parametrize("hostile, reason", [
    (b"NOT-HTTP\r\n\r\n", b"not an HTTP/1.x request line"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -3\r\n\r\n", b"bad Content-Length"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: many\r\n\r\n", b"bad Content-Length"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"chunked"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nno colon here\r\n\r\n", b"without a colon"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\n[1,2]", b"not a JSON object"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 3\r\n\r\n{x}", b"bad json"),
    (b'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 35\r\n\r\n{"messages": [], "max_tokens": "x"}',
     b"unusable request"),
    (b"GET / HTTP/1.1\r\n" + b"X: " + b"y" * 70_000, b"request head too large"),
])
def test_the_lean_upstream_refuses_what_it_cannot_read_and_closes(lean_upstream: LeanUpstream,
                                                                  hostile: bytes, reason: bytes) -> None:
    answer = raw_exchange(lean_upstream.port, hostile)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request") and reason in answer, answer[:300]
    assert answer.count(b"HTTP/1.1 ") == 1  # one answer, then the connection closed
    # and it still serves the next connection
    assert raw_exchange(lean_upstream.port, b"GET /stats HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 200 OK")


def _segment(requests: int, cpu_ms: float, harness_ms: dict[str, float], other: dict[str, int] | None = None) -> dict:
    """One second of `requests` answered 200 at `cpu_ms` a request, the harness's at its own."""
    return {"ok": requests, "other": other or {}, "elapsed": 1.0, "wall": 1.0, "cpu": requests * cpu_ms / 1000,
            "redis_cpu": requests * harness_ms["redis"] / 1000 if "redis" in harness_ms else None,
            "harness_cpu": {k: requests * v / 1000 for k, v in harness_ms.items()}, "machine_busy": 2.0,
            "steps_counted": requests, "requests_all": requests, "errors": []}


def test_the_bound_is_the_hosts_cores_over_the_cpu_per_request_of_the_path_and_its_harness() -> None:
    harness = {"load": 0.05, "upstream": 0.1}
    result = scaling.aggregate({
        "embedded": [_segment(800, 1.0, harness), _segment(800, 1.0, harness)],
        "redis-local-x2": [_segment(1000, 1.5, {**harness, "redis": 0.2}, {"503": 2}),
                           _segment(1000, 1.5, {**harness, "redis": 0.2}, {"503": 1, "error": 4})],
    }, rounds=2, duration=1.0, concurrency=32, nproc=2)
    embedded, workers = result["paths"]["embedded"], result["paths"]["redis-local-x2"]
    assert embedded["cores"] == {"governor": 0.8, "load": 0.04, "upstream": 0.08, "redis": 0.0, "host_busy": 2.0}
    # 2 cores over 1.15 ms a request, over the 800/s measured and the 1,000/s of one full core
    assert embedded["bound_per_request"] == round(2 / 1.15e-3 / 800, 3)
    assert embedded["bound_over_one_core"] == round(2 * 1.0 / 1.15, 3)
    assert embedded["bound_as_measured"] == round((2 - 0.12) / 1e-3 / 800, 3)
    assert workers["bound_over_one_core"] == round(2 * 1.0 / (1.5 + 0.15 + 0.2), 3)
    assert workers["harness_cpu_ms_per_request"] == {"load": 0.05, "upstream": 0.1, "redis": 0.2}
    assert workers["other_statuses"] == {"503": 3, "error": 4}  # every segment's, summed
    assert workers["governed"] == {"steps_counted": 2000, "requests_answered": 2000}
    printed = scaling.report(result)
    assert "redis-local-x2" in printed and "FEWER STEPS" not in printed
    workers["governed"] = {"steps_counted": 1999, "requests_answered": 2000}  # a request that went ungoverned
    assert "FEWER STEPS THAN REQUESTS" in scaling.report(result)
