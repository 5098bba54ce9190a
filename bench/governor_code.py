"""The governor's own code per request, warm: its hooks, runtime and store, without sockets.

    .venv/bin/python bench/governor_code.py [--exchanges 5000] [--rounds 7]

What `governor run` does per request, less mitmproxy's I/O: the addon chain and the runtime,
built by the functions `governor run` builds them with (build_chain, build_runtime: the
bench passport at tier R3, the write-behind SQLite store in a scratch directory, a control
plane's origin marker), are driven through their mitmproxy hooks with mitmproxy's own test
flows, for the overhead benchmark's plain and streamed chat completions (the mock
upstream's answers, byte for byte). Each layer is also timed alone, so the differences say
where the time goes:

  plain     request hook, responseheaders, response hook              (one exchange)
  stream    the same, with the 20 chunks and the tail through the stream relay
  hooks     the plain exchange with a runtime that permits every step at once and
            holds nothing (so no usage is settled): the hooks and the adapter alone
  runtime   admit the model call, settle its final usage, finish      (RuntimeAPI alone)
  store     snapshot + reserve + commit of the model call's charges   (the Store alone)

Flows are built outside the timed rounds. After a warm-up, garbage is collected and what
start-up made is frozen, as `governor run` does once it serves; the collector stays on.
Each figure is the best of the rounds (as timeit reports: on a shared machine the slower
rounds measure the neighbours), in microseconds per exchange or call; the median beside it.

Why: the overhead benchmark's ratios move by about 0.1 between runs here, because its
denominator (a bare mitmproxy's CPU per request) moves with the neighbours' load, so a
change worth a few percent of a request does not show there. These figures move by a few
percent, and a governed request's cost in the proxy follows them (1.6-1.9x as much in the
process as here, where caches stay warm: bench/FINDINGS.md). Prints a table;
writes bench/results/governor_code.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    CHAT_PATH,
    chat_body,
    machine,
    mock_usage,
    plain_answer,
    scratch,
    stream_writes,
    table,
    write_passport,
    write_result,
)

STREAM_CHUNKS = 20  # as the overhead benchmark's streamed workload
URL = f"http://127.0.0.1:9{CHAT_PATH}"  # never connected to: no socket is opened here
FLOW_BATCH = 1_000


def run(exchanges: int = 5_000, rounds: int = 7) -> dict[str, Any]:
    return asyncio.run(_measure(exchanges, rounds))


async def _measure(exchanges: int, rounds: int) -> dict[str, Any]:
    from governor.control.origin import ProxyOrigin
    from governor.runtime.metrics import Metrics
    from governor.policy.steps import Tier
    from governor.proxy.runtime_setup import build_runtime
    from governor.proxy.server import Settings, build_chain

    with scratch("code") as work:
        settings = Settings(passport=write_passport(work / "passport.json"), data_dir=work / "governor",
                            tier=Tier.R3, session="bench", control=None)
        settings.data_dir.mkdir(parents=True)
        metrics = Metrics()
        runtime = build_runtime(settings, metrics)
        built = []  # (chain, its A2A peer resolver), as serve() builds them, with a control plane's origin
        try:
            for behind in (runtime, _PermitEverything(runtime.default_session)):
                built.append(build_chain(settings, behind, metrics=metrics, origin=ProxyOrigin()))
            (chain, _), (hooks_only, _) = built
            cases = {
                "plain": _exchange(chain, stream=False),
                "stream": _exchange(chain, stream=True),
                "hooks": _exchange(hooks_only, stream=False),
                "runtime": _runtime_call(runtime),
                "store": await _store_call(runtime),
            }
            for case in cases.values():  # warm-up: caches, the pricing memo, the session's counters
                await case(2_000)
            gc.collect()
            gc.freeze()  # as governor run does once it serves
            timings: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(rounds):
                for name, case in cases.items():  # interleaved: a slow moment hits every case alike
                    timings[name].append(await case(exchanges))
            gc.unfreeze()
        finally:
            for _, peers in built:
                if peers is not None:
                    await peers.close()
            await runtime.close()
    return {
        "benchmark": "the governor's own code per request, warm (no sockets)",
        "machine": machine(),
        "exchanges_per_round": exchanges,
        "rounds": rounds,
        "stream_chunks": STREAM_CHUNKS,
        "us": {name: {"best": round(min(v), 1), "median": round(statistics.median(v), 1), "worst": round(max(v), 1)}
               for name, v in timings.items()},
    }


class _PermitEverything:
    """A runtime that permits every step at once and holds nothing: what is left of an
    exchange's cost is the addon's and the adapter's."""

    def __init__(self, default_session: str) -> None:
        from governor.policy.steps import PERMIT
        from governor.runtime.api import Admission

        self.default_session = default_session
        self._permit = Admission(decision=PERMIT, session=default_session, ticket=None, governor_object={})

    async def admit(self, session: str, step: Any) -> Any:
        return self._permit  # every bench request is in the default session

    async def finish(self, session: str, ticket: Any, *, error: str | None = None) -> None:
        return None

    def allowed_tools(self, session: str, persona: str | None = None) -> None:
        return None


def _exchange(chain: Any, *, stream: bool) -> Callable[[int], Awaitable[float]]:
    """n exchanges through the chain's hooks, as mitmproxy calls them (each addon's, in
    order; an async one awaited); us per exchange."""
    from mitmproxy import http
    from mitmproxy.test import tflow

    body = chat_body(stream=stream, chunks=STREAM_CHUNKS, gap_ms=0)
    request = json.loads(body)
    usage = mock_usage(request)
    payload = plain_answer(request["model"], usage)
    # the governor asks for stream usage (stream_options.include_usage): the upstream sends it
    writes = list(stream_writes(request["model"], usage, STREAM_CHUNKS, include_usage=True))
    answer_headers = {"content-type": "text/event-stream" if stream else "application/json"}
    answer = http.Response.make(200, b"" if stream else payload, answer_headers)
    request_headers = {"host": "127.0.0.1:9", "content-type": "application/json",
                       "accept": "application/json, text/event-stream"}

    request_hooks, headers_hooks, response_hooks = (chain.hooks(name) for name in
                                                    ("request", "responseheaders", "response"))

    def flow() -> Any:
        f = tflow.tflow()
        f.request = http.Request.make("POST", URL, body.encode(), request_headers)
        f.response = None
        return f

    async def run_n(n: int) -> float:
        elapsed = 0.0
        for start in range(0, n, FLOW_BATCH):  # flows are built (and dropped) in batches, untimed
            flows = [(flow(), answer.copy()) for _ in range(min(FLOW_BATCH, n - start))]
            began = time.perf_counter()
            for f, response in flows:
                for hook in request_hooks:
                    if (pending := hook(f)) is not None:
                        await pending
                if f.response is not None:
                    raise RuntimeError(f"the governor refused the bench request: {f.response.status_code}")
                f.response = response
                for hook in headers_hooks:
                    hook(f)  # all synchronous
                if stream:
                    relay = f.response.stream
                    for data in writes:
                        relay(data)
                    relay(b"")
                for hook in response_hooks:
                    if (pending := hook(f)) is not None:
                        await pending
            elapsed += time.perf_counter() - began
            if f.response.status_code != 200:
                raise RuntimeError(f"the governor replaced the bench answer: {f.response.status_code}")
        return elapsed / n * 1e6

    return run_n


def _model_call() -> tuple[Any, Any]:
    """The bench request's model call and its final usage, as the mock upstream reports it."""
    from governor.policy.steps import ModelCall, UsageReport

    request = json.loads(chat_body())
    usage = mock_usage(request)
    step = ModelCall(model=request["model"], expected_input_tokens=usage["prompt_tokens"],
                     expected_output_tokens=usage["completion_tokens"], provider="openai")
    report = UsageReport(model=request["model"], input_tokens=usage["prompt_tokens"],
                         output_tokens=usage["completion_tokens"], final=True)
    return step, report


def _runtime_call(runtime: Any) -> Callable[[int], Awaitable[float]]:
    """n model calls through the runtime alone, as the addon makes them; us per call."""
    step, report = _model_call()

    async def run_n(n: int) -> float:
        began = time.perf_counter()
        for _ in range(n):
            admission = await runtime.admit("bench", step)
            await runtime.usage("bench", admission.ticket, report)
            await runtime.finish("bench", admission.ticket)
        elapsed = time.perf_counter() - began
        if admission.decision.blocks:
            raise RuntimeError(f"the runtime refused the bench model call: {admission.decision.cause}")
        return elapsed / n * 1e6

    return run_n


async def _store_call(runtime: Any) -> Callable[[int], Awaitable[float]]:
    """n model calls' counter work on the runtime's store alone: the snapshot before the
    decision, the reservation of its charges, the commit of the actual usage."""
    store, agent = runtime.store, runtime.agent_id
    step, _ = _model_call()
    admission = await runtime.admit("bench", step)  # the charges a model call of this shape makes
    charges = admission.decision.charges
    await runtime.finish("bench", admission.ticket)
    keys = runtime.limits.counter_keys(step)
    actual = tuple(c._replace(cap=None) for c in charges)  # a commit carries no caps

    async def run_n(n: int) -> float:
        now = time.time()
        began = time.perf_counter()
        for _ in range(n):
            store.snapshot(agent, "bench", now, keys)
            held = store.reserve(agent, "bench", charges, now)
            store.commit(held.id, actual, now)
        return (time.perf_counter() - began) / n * 1e6

    return run_n


def report(result: dict[str, Any]) -> str:
    us = result["us"]
    rows = [[name, v["best"], v["median"], v["worst"]] for name, v in us.items()]
    lines = [table(rows, ["case", "us (best round)", "median", "worst"]),
             f"{result['rounds']} rounds of {result['exchanges_per_round']:,} per case; stream: "
             f"{result['stream_chunks']} chunks and the tail through the relay"]
    plain, hooks, rt = us["plain"]["best"], us["hooks"]["best"], us["runtime"]["best"]
    if plain:
        lines.append(f"of a plain exchange: hooks and adapter {hooks / plain:.0%}, the runtime's part "
                     f"{(plain - hooks) / plain:.0%} ({plain - hooks:.0f} us; {rt:.0f} us run alone)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=5_000, help="per round and case (default 5,000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7); each case's figure is the best")
    args = parser.parse_args()
    if args.exchanges < 1 or args.rounds < 1:
        parser.error("--exchanges and --rounds must be at least 1")
    result = run(args.exchanges, args.rounds)
    print(report(result))
    print(f"wrote {write_result('governor_code.json', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
