"""A stream spends only what it reserved (issue #20, finding 2), end to end: N parallel
streams in one session against a 10,000-token cap, through the real proxy and runtime, the
tokens delivered counted at the client. Upstreams: a hostile one that ignores max_tokens
(20) and streams 500 tokens, reporting usage in every chunk or only at the end; an honest
one, asked for no max_tokens, that streams 500 tokens (the admission guessed 100) or 6,000
(the admission guessed the default 4,096). Target: delivered <= cap + one chunk per stream.
Output fitting is off here: what is measured is a stream spending past its reservation
(tests/test_fitting_proxy.py measures the same loads with fitting on).
"""

from __future__ import annotations

import pytest

from governor.adapters.base import AdapterConfig
from governor.proxy.server import Settings, serve
from tests.stream_budget_harness import CAP, behaviour, parallel_streams, write_passport
from tests.upstreams import MockLLM
from tests.proxy_harness import AGENT_NAMED


async def governed(tmp_path, guess: int):
    mock = MockLLM()
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, passport=write_passport(tmp_path / "passport.json"), listen=("127.0.0.1", 0),
                                   control=None, data_dir=tmp_path / "data", tick_interval=0,
                                   adapters=AdapterConfig(default_output_tokens=guess, fit_output=False)))
    return running, mock


async def run(tmp_path, guess: int, streams: int, max_tokens: int | None, api: str = "openai", **upstream) -> tuple:
    running, mock = await governed(tmp_path, guess)
    try:
        mock.default = behaviour(**upstream)
        tally = await parallel_streams([running.proxy_url], mock.base_url, streams, max_tokens, "spender", api=api)
        view = await running.runtime.session_view("spender")
        used = next((b["used"] for b in view["budgets"] if b["scope"] == "per_session" and b["persona"] is None
                     and b["dimension"] == "tokens"), None)
        print(f"\n{streams} streams, max_tokens {max_tokens}, {upstream}: delivered {tally.total} tokens "
              f"(cap {CAP}), {tally.cut} cut, {tally.statuses.count(429)} refused, counter {used}")
        return tally, view
    finally:
        await running.stop()
        await mock.stop()


def assert_within_the_cap(tally, view, streams: int) -> None:
    assert not tally.errors, tally.errors[:3]
    assert len(tally.delivered) == streams
    # the bound the issue sets: the cap, plus at most one chunk (one token here) per stream
    assert tally.total <= CAP + streams, (tally.total, tally.cut, sorted(tally.delivered)[-5:])
    assert tally.cut > 0 or 429 in tally.statuses  # the cap is what stopped them
    assert view["state"] == "halted"  # on_budget_exhausted: halt, recorded


@pytest.mark.parametrize(("streams", "per_chunk_usage"), [(64, True), (64, False), (256, True)],
                         ids=["64-usage-per-chunk", "64-usage-at-end", "256-usage-per-chunk"])
async def test_parallel_streams_from_an_upstream_ignoring_max_tokens_stay_within_the_cap(
        tmp_path, streams, per_chunk_usage):
    tally, view = await run(tmp_path, 4096, streams, 20, tokens=500, per_chunk_usage=per_chunk_usage, honest=False)
    assert_within_the_cap(tally, view, streams)


@pytest.mark.parametrize("streams", [64, 256])
async def test_parallel_honest_streams_without_max_tokens_stay_within_the_cap(tmp_path, streams):
    tally, view = await run(tmp_path, 100, streams, None, tokens=500, per_chunk_usage=False, honest=True)
    assert_within_the_cap(tally, view, streams)


async def test_two_honest_streams_longer_than_the_default_guess_stay_within_the_cap(tmp_path):
    # the figure: 11,715 tokens delivered (+17.7%); each stream reserved 4,096 + input
    tally, view = await run(tmp_path, 4096, 2, None, tokens=6000, per_chunk_usage=False, honest=True)
    assert not tally.errors and tally.statuses == [200, 200]
    assert tally.total <= CAP + 2, tally
    assert tally.total > CAP // 2 and tally.cut >= 1  # one grew past its guess; the other was cut at the cap
    assert view["state"] == "halted"



async def test_parallel_anthropic_streams_from_an_upstream_ignoring_max_tokens_stay_within_the_cap(tmp_path):
    # message_delta carries the cumulative output after every text delta
    tally, view = await run(tmp_path, 4096, 64, 20, api="anthropic", tokens=500, per_chunk_usage=True, honest=False)
    assert_within_the_cap(tally, view, 64)


async def test_an_upstream_claiming_absurd_usage_is_cut_before_the_chunk_that_claims_it(tmp_path):
    from tests.upstreams import Behaviour

    running, mock = await governed(tmp_path, 4096)
    try:  # hostile: the first text chunk already reports 2 * 10^13 output tokens
        mock.default = Behaviour(text="abcd" * 50, chunks=50, input_tokens=11, output_tokens=10**15,
                                 progressive_usage=True)
        tally = await parallel_streams([running.proxy_url], mock.base_url, 8, 20, "absurd")
        view = await running.runtime.session_view("absurd")
    finally:
        await running.stop()
        await mock.stop()
    assert not tally.errors and tally.statuses == [200] * 8
    assert tally.total == 0 and tally.cut == 8  # not one token of it delivered
    assert view["state"] == "halted"
