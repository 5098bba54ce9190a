"""Reverse mode: the SDKs' base URL is the governor (no HTTPS_PROXY), which forwards to
one upstream over TLS. Real runtime, example passport."""

from __future__ import annotations

import pytest
import pytest_asyncio

from governor.policy.steps import Tier
from governor.proxy.server import Settings, serve
from tests.proxy_harness import run_python
from tests.upstreams import Behaviour, MockLLM, make_tls
from tests.proxy_harness import AGENT_NAMED

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reverse")
    tls = make_tls(tmp / "tls")
    mock = MockLLM(tls)
    await mock.start()
    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data", upstream_ca=tls.ca_file,
                        mode=f"reverse:{mock.base_url}", tier=Tier.R2, tick_interval=0)
    running = await serve(settings)
    yield running, mock
    await running.stop()
    await mock.stop()


async def test_sdks_with_base_url_pointing_at_the_governor(env):
    running, mock = env
    # outputs of at least 6: the mock's text ("Hello from the mock upstream.") is 6 tokens, and
    # the governor charges its own count (5 words) over a usage that says less
    mock.script(Behaviour(input_tokens=12, output_tokens=6), Behaviour(input_tokens=15, output_tokens=7, chunks=2),
                Behaviour(input_tokens=20, output_tokens=6), Behaviour(input_tokens=21, output_tokens=7, chunks=2))
    environment = running.agent_environment()
    assert environment == {"OPENAI_BASE_URL": f"{running.proxy_url}/v1", "ANTHROPIC_BASE_URL": running.proxy_url}
    code = """
import json, openai, anthropic
h = {"ADL-Session": "rev"}
o = openai.OpenAI()
a = anthropic.Anthropic()
r1 = o.chat.completions.create(model="gpt-4o-mini", max_tokens=20, messages=[{"role": "user", "content": "x"}],
                               extra_headers=h)
r2 = list(o.chat.completions.create(model="gpt-4o-mini", max_tokens=20, stream=True,
                                    messages=[{"role": "user", "content": "x"}], extra_headers=h))
m1 = a.messages.create(model="claude-haiku-4-5", max_tokens=20, messages=[{"role": "user", "content": "x"}],
                       extra_headers=h)
with a.messages.stream(model="claude-haiku-4-5", max_tokens=20, messages=[{"role": "user", "content": "x"}],
                       extra_headers=h) as s:
    m2 = s.get_final_message()
print(json.dumps([r1.usage.total_tokens, r2[-1].usage.total_tokens,
                  m1.usage.input_tokens + m1.usage.output_tokens, m2.usage.input_tokens + m2.usage.output_tokens]))
"""
    out = await run_python(code, {**environment, "OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test"})
    assert out == [18, 22, 26, 28]
    view = await running.runtime.session_view("rev")
    used = next(b["used"] for b in view["budgets"]
                if b["dimension"] == "tokens" and b["scope"] == "per_session" and b["persona"] is None)
    assert used == 18 + 22 + 26 + 28
    assert [r.path for r in mock.requests] == ["/v1/chat/completions", "/v1/chat/completions",
                                               "/v1/messages", "/v1/messages"]
