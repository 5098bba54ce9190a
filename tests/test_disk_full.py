"""A data disk that is full (issue #32 item 8: 15 refusals answered, 2 recorded): a refusal
that cannot be recorded is still refused; the governor says its record is incomplete
(readiness fails, `governor_record_gaps_total`), and once the disk has room the session's next
event names the gap, so the signed record itself says what it is missing. The data directory
is a real 16 MiB tmpfs filled to the last byte (root may mount one, as here); without the
privilege (or with GOVERNOR_TEST_NO_TMPFS set) the journal's write is made to fail with ENOSPC
instead (the test says which). The state store is in memory, so what fails is the journal."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import uuid

import httpx
import pytest

from governor.demo.mock_llm import MockLLM
from governor.proxy.server import Settings, serve
from governor.runtime.gaps import ON_GOVERNOR_RECORD_GAP

CONTROL = "control-token-for-disk-full-tests-0123456789"
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
REFUSALS = 15


def mounted_tmpfs(path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or os.environ.get("GOVERNOR_TEST_NO_TMPFS"):  # the injected ENOSPC instead
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], capture_output=True, timeout=10)
    return done.returncode == 0


class Filler:
    """Fills the filesystem of `where` to its last byte, and frees it again."""

    def __init__(self, where) -> None:
        self.path = where / f"filler-{uuid.uuid4().hex}"

    def fill(self) -> None:
        with open(self.path, "wb", buffering=0) as out:  # unbuffered: each write meets the disk
            for size in (65536, 4096, 512, 1):  # down to the last byte
                try:
                    while True:
                        out.write(b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc

    def free(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


@pytest.fixture
async def full_disk(tmp_path, monkeypatch):
    data = tmp_path / "data"
    real = mounted_tmpfs(data)
    try:
        async with _served_on(data, real, monkeypatch) as world:
            yield world
    finally:  # unmounted whatever failed, a start that raised included
        if real:
            subprocess.run(["umount", "-l", str(data)], capture_output=True, timeout=10)


@contextlib.asynccontextmanager
async def _served_on(data, real: bool, monkeypatch):
    llm = MockLLM(prompt_tokens=10, completion_tokens=5)
    await llm.start()
    running = await serve(Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=data,
                                   tick_interval=0, control_token=CONTROL, log=False, store="memory:"))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30,
                                headers={"Authorization": f"Bearer {CONTROL}"})
    filler = Filler(data)
    injected = {"on": False}
    if not real:  # no tmpfs: the journal's write fails as a full disk's would
        from governor.evidence import journal

        original = journal._write_all

        def write_all(fd, data):
            if injected["on"]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return original(fd, data)
        monkeypatch.setattr(journal, "_write_all", write_all)
        filler.fill = lambda: injected.update(on=True)  # type: ignore[method-assign]
        filler.free = lambda: injected.update(on=False)  # type: ignore[method-assign]
    print(f"\ndisk full: {'a real 16 MiB tmpfs filled to its last byte' if real else 'ENOSPC injected at the journal write'}")
    try:
        yield llm, agent, control, filler
    finally:
        filler.free()
        await agent.aclose()
        await control.aclose()
        await running.stop()
        await llm.stop()


async def ready_within(control, seconds: float) -> bool:
    import asyncio

    for _ in range(int(seconds / 0.1)):
        answer = await control.get("/readyz")
        if answer.status_code == 200:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_refusals_on_a_full_disk_are_refused_the_gap_reported_then_named(full_disk):
    llm, agent, control, filler = full_disk
    session = (await control.post("/v1/sessions", json={"label": "full"})).json()
    headers = {"ADL-Session": session["token"], "content-type": "application/json"}
    ok = await agent.post(f"{llm.url}/chat/completions", json=CHAT, headers={"ADL-Session": session["token"]})
    assert ok.status_code == 200
    assert (await control.get("/readyz")).status_code == 200
    filler.fill()
    answers = [await agent.post(f"{llm.url}/chat/completions", content=b"{not json", headers=headers)
               for _ in range(REFUSALS)]
    assert [a.status_code for a in answers] == [400] * REFUSALS  # refused all the same
    assert llm.served == 1
    for answer in answers:  # no answer claims a recording that did not happen
        assert "recorded" not in answer.text
    ready = await control.get("/readyz")
    assert ready.status_code == 503, ready.text
    missed = ready.json()["record_gaps"]["events_missed"]
    # a journal's last page may still hold a few lines after the disk is full: those are recorded
    assert ready.json()["record"] == "incomplete" and 0 < missed <= REFUSALS
    metrics = (await control.get("/metrics")).text
    assert f"governor_record_gaps_total {float(missed)}" in metrics
    assert f'governor_proxy_refusals_total{{reason="bad_request",recorded="false"}} {float(missed)}' in metrics
    filler.free()
    # the next event of the session names the gap; the record is then complete about its gap
    again = await agent.post(f"{llm.url}/chat/completions", content=b"{still not json", headers=headers)
    assert again.status_code == 400
    assert await ready_within(control, 10.0)  # the write-behind store flushes again within its interval
    record = (await control.get(f"/v1/sessions/{session['session']}/record")).json()
    causes = [e["cause"] for e in record["events"]]
    assert causes.count(ON_GOVERNOR_RECORD_GAP) == 1
    gap = record["events"][causes.index(ON_GOVERNOR_RECORD_GAP)]
    assert gap["detail"]["missed"] == missed and gap["detail"]["causes"] == ["on_governor_request_refused"]
    # every refusal is either in the record or counted in its gap
    assert causes.count("on_governor_request_refused") - 1 + missed == REFUSALS
    assert "ENOSPC" in gap["detail"]["error"] or "No space" in gap["detail"]["error"]
    assert causes[causes.index(ON_GOVERNOR_RECORD_GAP) + 1] == "on_governor_request_refused"  # then the refusal itself


async def test_a_step_that_cannot_be_recorded_is_refused_not_run(full_disk):
    llm, agent, control, filler = full_disk
    session = (await control.post("/v1/sessions", json={})).json()
    filler.fill()
    # each call asks for more output than its budget leaves: its limit is lowered (fitted), an event
    # the record must hold; once the journal's last page is full too, the call is refused, not run
    statuses = []
    for _ in range(200):
        answer = await agent.post(f"{llm.url}/chat/completions", json={**CHAT, "max_tokens": 10 ** 6},
                                  headers={"ADL-Session": session["token"]})
        statuses.append(answer.status_code)
        if answer.status_code != 200:
            break
    assert statuses[-1] == 503, statuses
    assert llm.served == len(statuses) - 1  # the unrecorded one never went upstream
    assert answer.headers["adl-governor-action"] == "halt"
    assert (await control.get("/readyz")).status_code == 503
