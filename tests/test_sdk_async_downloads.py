"""A file's content through the real proxy on the real runtime, with the official `openai` SDK:
relayed as it comes (adapters.base.UNREAD_ANSWER), not buffered, and still a governed step.
Its own module: it runs a governor that buffers at most 1 MiB of an answer, and two governors
in one process share mitmproxy's certificate store (another module's governor is stopped
before this one starts)."""

from __future__ import annotations

import pytest

from tests.proxy_harness import run_python
from tests.test_sdk_async import async_governor, session, used, verified

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_files_content_is_relayed_unread_however_large_and_still_a_governed_step(tmp_path):
    # a governor that buffers at most 1 MiB of an answer: the 3 MiB results pass only if relayed unread
    async with async_governor(tmp_path, max_body_bytes=1 << 20, max_response_bytes=1 << 20) as (running, mock):
        sdk_env = {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file),
                   "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{mock.base_url}/v1"}
        code = """
size = 3 << 20
record("same", lambda: client.files.content(f"file-big-{size}").content == bytes(range(256)) * (size // 256))
"""
        out = await run_python(session(code, "content"), sdk_env)
        assert out["same"] is True, out
        assert (await used(running, "content"))["iterations"] == 1  # a free step all the same
        verified(running, "content")

