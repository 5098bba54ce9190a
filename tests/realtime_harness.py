"""What the Realtime tests share: the real governor (real runtime, the bundled example
passport, a pricing file with the Realtime model) in front of the loopback Realtime mock
(tests/realtime_upstream.py), and the prelude of the SDK scripts they run."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import pytest_asyncio

from tests.proxy_harness import AGENT_NAMED
from tests.realtime_upstream import RealtimeMock
from tests.upstreams import make_tls

PRELUDE = """
import asyncio, json, openai
client = openai.AsyncOpenAI(max_retries=0)
out = {"events": []}
def plain(event):
    return event.to_dict() if hasattr(event, "to_dict") else event
async def talk(session, steps, model="gpt-realtime"):
    try:
        async with client.realtime.connect(model=model, extra_headers={"ADL-Session": session}) as conn:
            await steps(conn)
    except Exception as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        body = getattr(getattr(e, "response", None), "body", None)
        out["raised"] = {"type": type(e).__name__, "status": status,
                         "body": json.loads(body) if body else None,
                         "code": getattr(getattr(e, "rcvd", None), "code", None),
                         "reason": getattr(getattr(e, "rcvd", None), "reason", None)}
async def until(conn, last):
    async for event in conn:
        out["events"].append(plain(event))
        if event.type in last:
            return event
"""


PRICING = """currency: USD
unit: per_million_tokens
as_of: "2025-11-15"
models:
  gpt-realtime: {input: 4.00, cached_input: 0.40, output: 16.00}
  gpt-4o-transcribe: {input: 2.50, output: 10.00}
"""


def realtime_env(name: str, **overrides: Any) -> Any:
    """A module's `env` fixture: (running, mock, the SDK's environment); `overrides` go to Settings."""

    @pytest_asyncio.fixture(loop_scope="module", scope="module")
    async def env(tmp_path_factory: Any) -> Any:
        async with realtime_governor(tmp_path_factory.mktemp(name), **overrides) as parts:
            yield parts

    return env


@asynccontextmanager
async def realtime_governor(tmp: Path, **overrides: Any) -> AsyncIterator[tuple[Any, RealtimeMock, dict[str, str]]]:
    from governor.proxy.server import Settings, serve

    reverse = overrides.pop("reverse", False)  # reverse mode: the agent's base URL is the governor
    tls = make_tls(tmp / "tls")
    mock = RealtimeMock(tls)
    await mock.start()
    if reverse:
        overrides["mode"] = f"reverse:{mock.base_url}"
    pricing = tmp / "pricing.yaml"  # the bundled table has no Realtime model: priced here (its text rates)
    pricing.write_text(PRICING)
    options = dict(listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data", upstream_ca=tls.ca_file,
                   tick_interval=0, pricing=pricing, **AGENT_NAMED)
    settings = Settings(**{**options, **overrides})
    running = await serve(settings)
    if settings.mode.startswith("reverse:"):  # the agent's base URL is the governor
        sdk_env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{running.proxy_url}/v1"}
    else:
        sdk_env = {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file),
                   "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{mock.base_url}/v1"}
    try:
        yield running, mock, sdk_env
    finally:
        await running.stop()
        await mock.stop()



async def tokens_used(running: Any, session: str) -> float:
    view = await running.runtime.session_view(session)
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == "tokens" and b["scope"] == "per_session" and b["persona"] is None)


async def iterations(running: Any, session: str) -> int:
    return (await running.runtime.session_view(session))["iterations"]


def verified(running: Any, record: dict[str, Any]) -> bool:
    from governor.evidence import load_public_key, verify_record

    keys = running.settings.data_dir / "keys"
    return verify_record(record, public_key=load_public_key(keys / "governor-pub.pem")).ok


def events_of(record: dict[str, Any], cause: str) -> list[dict[str, Any]]:
    return [e for e in record.get("events", []) if e.get("cause") == cause]
