"""Budget accuracy under concurrency: 64 requests at once against caps that allow only some.

    .venv/bin/python bench/budget_accuracy.py [--requests 64]

One `governor run` (tier R3) on a bench passport whose per-session caps fit 20 requests'
tokens and 16 requests' cost of the priciest scenario (half a request of headroom each).
Each scenario is its own session (ADL-Session), and sends `--requests` chat completions
all at once (every connection opened first, then every request written in the same instant):

  tokens         gpt-4o-mini, plain: the token cap binds (about 20 fit)
  cost           o1-pro, plain: the cost cap binds first (about 16 fit)
  tokens-stream  gpt-4o-mini, streamed: usage arrives at the end of each stream

Every request declares max_tokens = 100; the mock answers with exactly that many
completion tokens, and prompt tokens = ceil(bytes of the messages / 4), within the
governor's input estimate (ceil(request bytes / 4)). "Forwarded" is what the mock
upstream received (what was spent); "answered" what the clients got with status 200. The final counters are read from the control plane
(GET /v1/sessions/{id}). Target: no counter past its cap (zero overshoot), and the
consumption never beyond what the admitted requests reserved.
Writes bench/results/budget_accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST,
    scratch,
    Governor,
    Role,
    chat_body,
    http_get_json,
    machine,
    table,
    upstream_url,
    write_passport,
    write_result,
)

MAX_TOKENS = 100
TOKENS_FIT = 20  # requests the token cap admits
COST_FIT = 16  # o1-pro requests the cost cap admits
# USD per million tokens, as the governor's price book has them (genai-prices 0.2.3; input, output)
PRICES = {"gpt-4o-mini": (0.15, 0.60), "o1-pro": (150.0, 600.0)}
SCENARIOS = (("tokens", "gpt-4o-mini", False), ("cost", "o1-pro", False), ("tokens-stream", "gpt-4o-mini", True))


def per_request(model: str, stream: bool) -> tuple[str, int, float]:
    """The body, the tokens it reserves (the governor's input estimate + max_tokens), its cost."""
    body = chat_body(model=model, stream=stream, max_tokens=MAX_TOKENS, chunks=20, gap_ms=1)
    tokens_in = math.ceil(len(body.encode()) / 4)
    price_in, price_out = PRICES[model]
    return body, tokens_in + MAX_TOKENS, (tokens_in * price_in + MAX_TOKENS * price_out) / 1e6


def caps() -> dict[str, float]:
    _, tokens, _ = per_request("gpt-4o-mini", False)
    _, _, cost = per_request("o1-pro", False)
    # half a request of headroom: the next request clearly does not fit
    return {"tokens": tokens * TOKENS_FIT + tokens // 2, "cost_usd": round(cost * (COST_FIT + 0.5), 6)}


def run(requests: int = 64, log=print) -> dict[str, Any]:
    limit = caps()
    scenarios: dict[str, Any] = {}
    with (
        scratch("budget") as work,
        Role("upstream") as upstream,
        # each scenario names its own session (ADL-Session): agent-named sessions, opted into
        Governor(write_passport(work / "passport.json", caps=limit), work / "governor",
                 extra=["--sessions", "agent-named"]) as governor,
        Role("load") as load,
    ):
        for name, model, stream in SCENARIOS:
            session = f"budget-{name}-{uuid.uuid4().hex[:8]}"
            body, reserve_tokens, reserve_cost = per_request(model, stream)
            log(f"  {name}: {requests} x {model}{' (streamed)' if stream else ''} at once, session {session}")
            served_before = http_get_json(f"http://{HOST}:{upstream.port}/stats")["requests"]
            began = time.perf_counter()
            answer = load.ask({"op": "burst", "url": upstream_url(upstream.port), "proxy": f"{HOST}:{governor.port}",
                               "body": body, "count": requests, "headers": {"ADL-Session": session}})
            elapsed = time.perf_counter() - began
            forwarded = http_get_json(f"http://{HOST}:{upstream.port}/stats")["requests"] - served_before
            view = _settled_view(governor.control_url, session, governor.control_token)
            scenarios[name] = _scenario(answer["responses"], view, limit, reserve_tokens, reserve_cost, forwarded,
                                        model, stream, elapsed)
    return {
        "benchmark": f"budget accuracy: {requests} concurrent requests per session, tier R3",
        "machine": machine(),
        "requests": requests,
        "max_tokens": MAX_TOKENS,
        "caps": limit,
        "scenarios": scenarios,
        "target": "overshoot 0 on every per-session cap; consumption <= reservations admitted",
        "verdict": "PASS" if all(s["verdict"] == "PASS" for s in scenarios.values()) else "MISS",
    }


def _settled_view(control_url: str, session: str, token: str | None, timeout: float = 5.0) -> dict[str, Any]:
    """The session once its counters stopped moving (every response is back, so they
    should not move at all; a second look confirms it)."""
    deadline = time.monotonic() + timeout
    view = http_get_json(f"{control_url}/v1/sessions/{session}", token=token)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        again = http_get_json(f"{control_url}/v1/sessions/{session}", token=token)
        if again["budgets"] == view["budgets"]:
            return again
        view = again
    return view


def _scenario(responses: list[dict[str, Any]], view: dict[str, Any], limit: dict[str, float], reserve_tokens: int,
              reserve_cost: float, forwarded: int, model: str, stream: bool, elapsed: float) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    causes: dict[str, int] = {}
    answered = 0
    for response in responses:
        status = str(response.get("status"))
        statuses[status] = statuses.get(status, 0) + 1
        if response.get("status") == 200 and not response.get("action"):
            answered += 1
        elif response.get("body"):
            causes[_cause(response["body"])] = causes.get(_cause(response["body"]), 0) + 1
    dims: dict[str, Any] = {}
    for entry in view.get("budgets", []):
        if entry["scope"] != "per_session" or entry["persona"] is not None or entry["dimension"] not in limit:
            continue
        dimension = entry["dimension"]
        reserved = forwarded * (reserve_tokens if dimension == "tokens" else reserve_cost)
        used = entry["used"]
        dims[dimension] = {
            "cap": entry["limit"],
            "used": round(used, 6),
            "overshoot": round(max(0.0, used - entry["limit"]), 6),
            "reserved_by_admitted": round(reserved, 6),
            "beyond_reservations": round(max(0.0, used - reserved), 6),
        }
    ok = bool(dims) and all(d["overshoot"] == 0 and d["beyond_reservations"] <= 1e-9 for d in dims.values())
    return {
        "model": model, "stream": stream, "seconds": round(elapsed, 3),
        "sent": len(responses), "forwarded": forwarded, "answered": answered, "statuses": statuses,
        "in_flight_after": view.get("in_flight"), "refusal_causes": causes,
        "session_state": view.get("state"), "halt_cause": view.get("halt_cause"),
        "reserve_per_request": {"tokens": reserve_tokens, "cost_usd": round(reserve_cost, 8)},
        "counters": dims,
        "verdict": "PASS" if ok else "MISS",
    }


def _cause(body: str) -> str:
    """The governor's cause from a refusal (OpenAI error shape, or the last SSE error event)."""
    for chunk in reversed(body.split("\n\n")):
        text = chunk.removeprefix("data: ").strip()
        if not text.startswith("{"):
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue
        governor = (data.get("error") or {}).get("governor") if isinstance(data.get("error"), dict) else None
        if isinstance(governor, dict):
            return str(governor.get("cause"))
    return "unknown"


def report(result: dict[str, Any]) -> str:
    rows = []
    for name, s in result["scenarios"].items():
        for dimension, d in s["counters"].items():
            rows.append([name, s["sent"], s["forwarded"], s["answered"], dimension, d["cap"], d["used"], d["reserved_by_admitted"], d["overshoot"], s["verdict"]])
    out = [table(rows, ["scenario", "sent", "forwarded", "answered 200", "counter", "cap", "used", "reserved (admitted)",
                        "overshoot", "verdict"])]
    for name, s in result["scenarios"].items():
        out.append(f"{name}: {s['statuses']} causes {s['refusal_causes']} session {s['session_state']} "
                   f"({s['halt_cause']}), in flight after: {s['in_flight_after']}, {s['seconds']} s")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="(same run: it takes a few seconds)")
    args = parser.parse_args()
    result = run(args.requests)
    print(report(result))
    print(f"wrote {write_result('budget_accuracy.json', result)}")


if __name__ == "__main__":
    main()
