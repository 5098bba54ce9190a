"""The real governor (serve() on the real runtime, the bundled example passport: tokens 20000
and cost 0.5 USD per session, halt when exhausted) in front of the compat upstream
(tests/compat_upstreams.py: Azure OpenAI, Ollama, TGI), for the compat SDK tests."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

from governor.adapters.base import AdapterConfig
from tests.compat_upstreams import CompatUpstream
from tests.proxy_harness import AGENT_NAMED

# Prices for the models the tests call (USD per million tokens). `tgi` and the local models
# must be priced for a cost cap to admit them (an unpriced model is refused under one).
PRICING = """
currency: USD
unit: per_million_tokens
models:
  gpt-4o-mini: {input: 0.15, output: 0.60}
  gpt-35-turbo-instruct: {input: 1.50, output: 2.00}
  text-embedding-3-small: {input: 0.02, output: 0}
  llama3.2: {input: 0, output: 0}
  all-minilm: {input: 0, output: 0}
  tgi: {input: 0, output: 0}
"""


@asynccontextmanager
async def compat_governor(tmp: Path, *, priced: bool = True, deployments: dict[str, str] | None = None,
                          **settings: Any) -> AsyncIterator[tuple[Any, CompatUpstream]]:
    """(running, upstream): both stopped on exit. `priced`: the PRICING above (else the
    bundled table, where the local models have no price)."""
    from governor.proxy.server import Settings, serve
    from tests.upstreams import make_tls

    tls = make_tls(tmp / "tls")
    upstream = CompatUpstream(tls)
    await upstream.start()
    options: dict[str, Any] = dict(listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data",
                                   upstream_ca=tls.ca_file, tick_interval=0, **AGENT_NAMED)
    if priced:
        (tmp / "pricing.yaml").write_text(PRICING)
        options["pricing"] = tmp / "pricing.yaml"
    if deployments:
        options["adapters"] = AdapterConfig(extra={"deployments": deployments})
    try:
        running = await serve(Settings(**{**options, **settings}))
    except BaseException:
        await upstream.stop()
        raise
    try:
        yield running, upstream
    finally:
        await running.stop()
        await upstream.stop()


def client_environment(running: Any) -> dict[str, str]:
    """What an SDK in a subprocess needs to go through the proxy (its environment only)."""
    return {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file), "NO_PROXY": ""}


def http_client(running: Any) -> httpx.AsyncClient:
    """A raw HTTP client through the proxy, trusting the governor's CA."""
    return httpx.AsyncClient(proxy=running.proxy_url, verify=str(running.ca_file), trust_env=False, timeout=30)


async def used(running: Any, session: str, dimension: str = "tokens") -> float:
    view = await running.runtime.session_view(session)
    assert view is not None, f"no session {session}"
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == dimension and b["scope"] == "per_session" and b["persona"] is None)


async def verified_record(running: Any, session: str, tmp: Path) -> dict[str, Any]:
    """End the session and check its signed record with `governor verify`; the record."""
    from governor.cli import main as governor_cli
    from governor.passport import example_passport_path

    record = await running.runtime.end_session(session)
    path = tmp / f"{session}-record.json"
    path.write_text(json.dumps(record))
    key = running.settings.data_dir / "keys" / "governor-pub.pem"
    code = governor_cli(["verify", str(path), "--offline", "--key", str(key), "--passport", str(example_passport_path()), "--no-nonce"])
    # 3: every step passed but the key's resolution (a loopback governor publishes no did:web)
    assert code == 3, f"the record of {session} does not verify"
    return record


def events(record: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["cause"], e["action"]) for e in record["events"]]
