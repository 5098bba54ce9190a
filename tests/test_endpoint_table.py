"""The endpoint table (governor/adapters/endpoints.py): docs/reference/endpoints.md is what the
code says, every row is well formed, and every row walked through the real proxy on default
options (issue 29): a governed row that reaches the upstream is counted in its session, a
refused one never reaches it and gets the governor's error, and after its session halts no
row's probe reaches the upstream, with or without the session's token.

The walk is generic over rows: a row an adapter adds to its ENDPOINTS is walked by the same
test (one governor and one mock upstream for all, one principal session per row); a failure
names the row."""

from __future__ import annotations

from pathlib import Path

from governor.adapters import endpoints

ROOT = Path(__file__).resolve().parent.parent


def test_the_endpoint_document_is_generated_from_the_registry() -> None:
    document = (ROOT / "docs" / "reference" / "endpoints.md").read_text()
    assert document == endpoints.markdown(), (
        "docs/reference/endpoints.md is stale: python -m governor.adapters.endpoints > docs/reference/endpoints.md")


def test_every_row_has_a_probe_of_its_own_method_and_a_known_verdict() -> None:
    rows = endpoints.table()
    assert rows
    for row in rows:
        assert row.verdict in endpoints.VERDICTS, row
        assert row.probe.method == row.method, row
        assert row.probe.path.startswith("/"), row
        assert row.provider and row.family, row


# --- the walk: every row through the real proxy on default options ---------------------------------

import itertools  # noqa: E402
import ssl  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402
import pytest_asyncio  # noqa: E402

from tests.proxy_harness import real_governor  # noqa: E402

CONTROL_TOKEN = "endpoint-walk-control-token-0123456789"
# the defaults `governor run` has (real_governor's are agent-named): sessions opened by a principal
DEFAULTS = dict(sessions="principal", default_session="auto", lock_on=("on_governor_session_integrity",),
                control=("127.0.0.1", 0), control_token=CONTROL_TOKEN)
# a call the bundled passport's 20,000-token session budget refuses even fitted: it halts the session
UNFITTABLE = (b'{"model":"gpt-4o-mini","max_tokens":30000,"n":100,'
              b'"messages":[{"role":"user","content":"hi"}]}')
ROWS = endpoints.table()


def _row_id(index: int, row: endpoints.Endpoint) -> str:
    name = f"{row.provider} {row.family}{' streamed' if row.stream else ''} {row.method} {row.path}"
    return f"{index}:{name}".replace(" ", "_")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def walk(tmp_path_factory: Any) -> Any:
    """ONE governor (the bundled passport, default options) in front of ONE mock upstream
    that answers every path (the provider's shape where it speaks it, a JSON 200 elsewhere)
    and records every request it receives; the agent's client and the principal's."""
    async with real_governor(tmp_path_factory.mktemp("walk"), **DEFAULTS) as (running, mock):
        agent = httpx.AsyncClient(proxy=running.proxy_url, verify=ssl.create_default_context(cafile=str(running.ca_file)),
                                  trust_env=False, timeout=30)
        control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30,
                                    headers={"Authorization": f"Bearer {CONTROL_TOKEN}"})
        try:
            yield running, mock, agent, control
        finally:
            await agent.aclose()
            await control.aclose()


async def _send(agent: httpx.AsyncClient, mock: Any, probe: endpoints.Probe, token: str | None) -> httpx.Response:
    headers = {"content-type": probe.content_type, **dict(probe.headers)} if probe.body else dict(probe.headers)
    if token is not None:
        headers["ADL-Session"] = token
    return await agent.request(probe.method, f"{mock.base_url}{probe.path}", content=probe.body or None,
                               headers=headers)


def _reached(mock: Any, mark: int, probe: endpoints.Probe) -> list[Any]:
    """The probe's requests among those the upstream received since `mark` (the A2A adapter
    also asks a peer's origin for its passport, itself, not through the proxy)."""
    return [r for r in mock.requests[mark:] if r.method == probe.method and r.path == probe.path]


def _governor_error(answer: httpx.Response) -> dict[str, Any] | None:
    """The governor object of an answer the governor made instead of the upstream (it says so
    in ADL-Governor-Action), in any protocol's shape (an error's, a JSON-RPC error's data, an
    A2A fallback's metadata), or None."""
    if answer.headers.get("adl-governor-action") is None:
        return None
    try:
        body = answer.json()
    except ValueError:
        return None

    def find(value: Any, depth: int) -> dict[str, Any] | None:
        if isinstance(value, dict):
            if isinstance(value.get("governor"), dict):
                return value["governor"]
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            return None
        for child in children if depth else ():
            if (found := find(child, depth - 1)) is not None:
                return found
        return None

    return find(body, 4)


async def _counted(running: Any, session: str) -> int:
    view = await running.runtime.session_view(session)
    return 0 if view is None else view["iterations"] + view["tool_calls"]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("row", ROWS, ids=list(itertools.starmap(_row_id, enumerate(ROWS))))
async def test_every_row_is_governed_or_refused_and_nothing_reaches_the_upstream_after_a_halt(walk, row):
    running, mock, agent, control = walk
    probe = row.probe
    opened = await control.post("/v1/sessions", json={"label": f"walk {row.provider} {row.family}"})
    assert opened.status_code == 201, opened.text
    session, token = opened.json()["session"], opened.json()["token"]

    mark = len(mock.requests)
    answer = await _send(agent, mock, probe, token)
    reached = _reached(mock, mark, probe)
    if row.verdict in (endpoints.GOVERNED, endpoints.FREE) and reached:
        assert await _counted(running, session) >= 1, (
            f"{row.provider} {row.family}: reached the upstream ({answer.status_code}) but the session counted "
            "no step")
    elif row.verdict in (endpoints.GOVERNED, endpoints.FREE):  # refused by the passport's policy: said so
        assert _governor_error(answer) is not None, (
            f"{row.provider} {row.family}: neither forwarded nor refused with a governor error: "
            f"{answer.status_code} {answer.text[:300]}")
    else:  # REFUSED, and ALLOWED (refused on default options: no allow-list)
        assert not reached, f"{row.provider} {row.family} ({row.verdict}) reached the upstream"
        assert answer.status_code >= 400 and _governor_error(answer) is not None, (
            f"{row.provider} {row.family}: {answer.status_code} {answer.text[:300]}")
    assert not any(name.lower() == "adl-session" or token in value for r in reached for name, value in r.headers.items()), (
        f"{row.provider} {row.family}: the agent's session token reached the upstream")

    # halt the session (its token budget: refused before the upstream), then every channel is shut
    halting = await agent.post(f"{mock.base_url}/v1/chat/completions", content=UNFITTABLE,
                               headers={"ADL-Session": token, "content-type": "application/json"})
    assert halting.status_code in (403, 429), halting.text  # 403: the probe's step already halted it
    view = await running.runtime.session_view(session)
    assert view["state"] == "halted", view
    mark = len(mock.requests)
    for with_token in (token, None):
        answer = await _send(agent, mock, probe, with_token)
        assert _governor_error(answer) is not None, (
            f"{row.provider} {row.family} after a halt ({'with' if with_token else 'without'} the token): "
            f"{answer.status_code} {answer.text[:300]}")
    assert _reached(mock, mark, probe) == [], (
        f"{row.provider} {row.family}: reached the upstream after its session halted")
