"""The endpoint table: every provider endpoint family the governor knows, and its verdict.

Each adapter module declares `ENDPOINTS`, a tuple of `Endpoint` rows for the families it
governs (or refuses on purpose); `KNOWN_REFUSED` below lists providers' families no adapter
governs, which the default-deny rule refuses. `table()` gathers them all;
`python -m governor.adapters.endpoints` prints the Markdown of docs/reference/endpoints.md
(a test fails when the file is not what the code says), and `tests/test_endpoint_table.py`
walks every row's `probe` through the real proxy on default options and checks, at the
mock upstream, that nothing reached it uncounted.

Verdicts:
- GOVERNED: a governed step (admitted, reserved, charged, recorded), refused when the
  session may not act;
- FREE: a governed step that costs nothing (moderation, token counting): counted as an
  iteration and recorded, refused after a halt;
- REFUSED: refused by the governor, never forwarded (a clear error names why);
- ALLOWED: forwarded only when the operator's allow-list names it (non-spending traffic).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Iterable

GOVERNED = "governed"
FREE = "free"
REFUSED = "refused"
ALLOWED = "allowed by configuration"
VERDICTS = (GOVERNED, FREE, REFUSED, ALLOWED)


@dataclass(frozen=True, slots=True)
class Probe:
    """One concrete request of a family, as its official client sends it (minimal but
    valid): what the walking test sends through the proxy."""

    method: str
    path: str  # with the query string, if the provider puts one
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint family of one provider."""

    provider: str  # "OpenAI", "Anthropic", "Gemini", "Vertex AI", "Bedrock", "Azure OpenAI", "Ollama", ...
    family: str  # what it is for people: "chat completions", "image edits", ...
    method: str
    path: str  # the path as documented, placeholders in braces: /v1beta/models/{model}:generateContent
    verdict: str  # one of VERDICTS
    adapter: str | None  # the adapter that governs or refuses it (None: the default-deny rule)
    probe: Probe
    note: str = ""  # how it is charged, or why it is refused
    stream: bool = False  # the probe asks for a streamed answer


# Families of providers no adapter governs: refused by the default-deny rule (an operator can
# only let them through by an allow-list entry, which declares they spend nothing).
KNOWN_REFUSED: tuple[Endpoint, ...] = (
    Endpoint("Cohere", "chat", "POST", "/v1/chat", REFUSED, None,
             Probe("POST", "/v1/chat", b'{"model":"command-r","message":"hi"}'),
             "no adapter: refused by default deny"),
    Endpoint("Replicate", "predictions", "POST", "/v1/predictions", REFUSED, None,
             Probe("POST", "/v1/predictions", b'{"version":"abc","input":{"prompt":"hi"}}'),
             "no adapter: refused by default deny"),
)


def _adapter_modules() -> Iterable[str]:
    from governor.adapters import ADAPTER_MODULES  # the registry's own list, in match order
    return ADAPTER_MODULES


def table() -> list[Endpoint]:
    """Every row: each adapter module's ENDPOINTS in registry order, then KNOWN_REFUSED."""
    rows: list[Endpoint] = []
    for name in _adapter_modules():
        module = importlib.import_module(name)
        rows.extend(getattr(module, "ENDPOINTS", ()))
    rows.extend(KNOWN_REFUSED)
    for row in rows:
        if row.verdict not in VERDICTS:
            raise ValueError(f"endpoint {row.provider} {row.family}: unknown verdict {row.verdict!r}")
    return rows


def markdown(rows: Iterable[Endpoint] | None = None) -> str:
    """docs/reference/endpoints.md, from the code."""
    rows = table() if rows is None else list(rows)
    lines = [
        "# Endpoint table",
        "",
        "Generated from the code's registry (`governor/adapters/endpoints.py`; each adapter's",
        "`ENDPOINTS`) by `python -m governor.adapters.endpoints > docs/reference/endpoints.md`;",
        "`tests/test_endpoint_table.py` fails when this file differs from the code, and walks every",
        "row through the real proxy on default options. Anything not listed here is refused by",
        "default (`unknown_traffic: deny`), unless the operator's allow-list names it.",
        "",
        "| provider | family | method | path | verdict | adapter | how |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        stream = " (streamed)" if row.stream else ""
        lines.append(f"| {row.provider} | {row.family}{stream} | {row.method} | `{row.path}` | {row.verdict} | "
                     f"{row.adapter or '-'} | {row.note} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()


__all__ = ["Endpoint", "Probe", "GOVERNED", "FREE", "REFUSED", "ALLOWED", "VERDICTS", "KNOWN_REFUSED", "table",
           "markdown"]
