"""The reviewer console: a static page the control plane serves, and the two reads it adds.

  GET /                         redirects to /console/
  GET /console/                 the page (console/index.html), open: it holds no secret
  GET /console/{file}           its script and style sheet (console/*.js, *.css)
  GET /v1/token                 which kind a bearer token is ({"reviewer": bool, "control": bool});
                                401 for a token of neither kind (the page's sign-in check)
  GET /v1/sessions/{id}/verification
                                a fresh signed record of the session and the §8.6 verification
                                of it against this governor's key and pinned passport

The page is plain HTML, JavaScript and CSS shipped in the package: no build step, no
third-party script. It is served under a strict Content-Security-Policy (scripts and
styles from this origin only, no inline script, no eval, no framing), so a string an
agent controls (tool arguments, persona and session names, reasons, labels) cannot
run even if the page's own textContent-only rendering were ever bypassed. The token
the reviewer types stays in the tab (sessionStorage) and travels only in
`Authorization: Bearer`; the control guard (Host, Origin, JSON bodies) applies to the
page's requests as to any other (they are same-origin, so it lets them through).
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

from aiohttp import web

from governor.control.auth import bearer
from governor.control.context import ControlContext
from governor.control.replies import bearer_refusal, error, ok, operator_refusal, unknown_session
from governor.evidence.errors import EvidenceError
from governor.control.runtime_routes import shared_record_refusal
from governor.runtime.shared_records import RecordStoreDamaged, RecordUnavailable, RecordUnreadable

# default-src 'self' covers scripts, styles, images, fetch; nothing inline, nothing framed
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def console_files() -> dict[str, tuple[bytes, str]]:
    """The page's files by name, read once from the package: name -> (bytes, content type)."""
    files: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("governor.control").joinpath("console").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


class ReviewerConsole:
    """The page's files (read once, when the app is built) and the two reads, over the
    runtime and the token sets of a `ControlContext`."""

    def __init__(self, context: ControlContext) -> None:
        self.runtime = context.runtime
        self.operators = context.operators
        self.reviewers = context.reviewers
        self.files = console_files()

    def _serve(self, name: str) -> web.Response:
        found = self.files.get(name)
        if found is None:
            raise web.HTTPNotFound(text=f"no console file {name!r}")
        body, content_type = found
        return web.Response(body=body, content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS)

    async def root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/console/", headers=SECURITY_HEADERS)

    async def page(self, request: web.Request) -> web.Response:
        return self._serve("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        return self._serve(request.match_info["name"])

    async def token_kind(self, request: web.Request) -> web.Response:
        """Which kind of token the bearer is: lets the page refuse a wrong token at sign-in,
        also when reads are open (no control token configured)."""
        if refusal := bearer_refusal(request, self.reviewers, self.operators,
                                     required="this needs `Authorization: Bearer <reviewer or control token>`",
                                     invalid="the bearer token is not a reviewer or control token"):
            return refusal
        token = bearer(request.headers.get("Authorization"))
        reviewer, control = token in self.reviewers, token in self.operators
        return ok({"reviewer": reviewer, "control": control}, headers={"Cache-Control": "no-store"})

    async def session_verification(self, request: web.Request) -> web.Response:
        """A fresh snapshot record of the session, verified as `governor verify` would (§8.6
        steps 1-6) against this governor's public key and its pinned passport. The verdict is
        the governor checking itself: an auditor runs `governor verify` offline on the record."""
        from governor.evidence.verify import verify_record

        if refusal := operator_refusal(request, self.operators, self.reviewers):
            return refusal
        runtime = self.runtime
        session = request.match_info["session"]
        shared = getattr(runtime, "shared_records", None)  # replicas share sessions: the one every replica serves
        if not runtime.has_session(session) and shared is None:
            return unknown_session(session)
        key = getattr(runtime, "key", None)
        if key is None:
            return error(501, "no_key", "this runtime does not expose its signing key's public half")
        try:
            record = runtime.record(session) if shared is None else (await shared.record(session))[0]
        except KeyError:
            return unknown_session(session)
        except (RecordUnavailable, RecordUnreadable, EvidenceError, RecordStoreDamaged) as exc:
            return shared_record_refusal(session, exc)  # the shared store: down, or damaged
        pinned = getattr(runtime, "pinned", None)
        passport: Any = getattr(pinned, "document", None)
        # schema validation, the chain and the signature: CPU work off the event loop
        # the console issues no nonce; its own key is pinned, not resolved: at best INCOMPLETE (step 2 partial)
        report = await asyncio.to_thread(verify_record, record, public_key=key.public_key(), passport=passport,
                                         no_nonce=True)
        return ok({"session": session, "record": record, "verification": report.to_json()},
                  headers={"Cache-Control": "no-store"})


def add_routes(app: web.Application, context: ControlContext) -> None:
    console = ReviewerConsole(context)
    app.router.add_get("/", console.root)
    app.router.add_get("/console", console.root)
    app.router.add_get("/console/", console.page)
    app.router.add_get("/console/{name}", console.asset)
    app.router.add_get("/v1/token", console.token_kind)
    app.router.add_get("/v1/sessions/{session}/verification", console.session_verification)
