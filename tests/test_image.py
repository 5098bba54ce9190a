"""The image (Containerfile), built by .ci/image without any registry and run with podman:
non-root, a read-only root filesystem, the bundled passport admitted, a model call governed
through it to a mock upstream on loopback, SIGTERM ending the session with a signed record
that `governor verify` accepts.

The build is reused while its inputs are unchanged (.ci/image labels the image with their
hash), so the suite pays for it once. Skipped, saying why, where podman cannot be had."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from governor.passport import example_passport_path, load_passport, passport_digest
from tests.conftest import REPO
from tests.upstreams import start_mock

PODMAN = ["podman", "--runtime", "runc"]  # crun fails here: "cgroups in hybrid mode not supported"
BUILD_GUARD_SEC = 900  # not a timing assertion: only stops a hung build from hanging the suite
GOVERNOR_UID = 10001


@pytest.fixture(scope="module")
def image() -> str:
    if os.geteuid() != 0:
        pytest.skip("the image tests need root (podman with the runc runtime, mmdebstrap)")
    tools = subprocess.run(["bash", str(REPO / ".ci" / "image"), "--tools"], capture_output=True, text=True,
                           timeout=BUILD_GUARD_SEC)
    if tools.returncode != 0 or shutil.which("podman") is None:
        pytest.skip(f"podman is missing and could not be installed: {tools.stderr.strip()[-300:]}")
    built = subprocess.run(["bash", str(REPO / ".ci" / "image")], capture_output=True, text=True,
                           timeout=BUILD_GUARD_SEC)
    assert built.returncode == 0, built.stderr[-3000:]
    return built.stdout.strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _podman(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, *argv], capture_output=True, text=True, timeout=timeout)


def test_the_image_runs_as_a_non_root_user_with_governor_as_its_entrypoint(image):
    config = json.loads(_podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == f"{GOVERNOR_UID}:{GOVERNOR_UID}"
    assert config["Entrypoint"] == ["governor"] and config["Cmd"] == ["run"]
    assert "/var/lib/governor" in config["Volumes"]
    # the host CA bundle pip used during the build is not in the image
    listed = _podman("run", "--rm", "--network", "none", *_limits(), "--entrypoint", "sh", image, "-c",
                     "ls /run/secrets/host-ca 2>&1; command -v iptables; id -u")
    assert "No such file" in listed.stdout and "iptables" in listed.stdout, listed.stdout + listed.stderr
    assert listed.stdout.strip().endswith(str(GOVERNOR_UID))


def _limits() -> list[str]:
    # podman's default rlimits fail here (setrlimit RLIMIT_NOFILE: Operation not permitted)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return ["--ulimit", f"nofile={hard}:{hard}", "--ulimit", "nproc=32768:32768"]


async def _wait_healthy(control: str, container: str) -> dict:
    async with aiohttp.ClientSession() as http:
        for _ in range(240):  # bounded: 60 s
            try:
                async with http.get(f"{control}/readyz") as answer:
                    if answer.status == 200:
                        return await answer.json()
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    logs = _podman("logs", container).stdout
    raise AssertionError(f"the governor in the container never became ready:\n{logs}")


async def test_the_image_governs_a_call_and_writes_a_verifiable_record_on_sigterm(image, tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    os.chown(data, GOVERNOR_UID, GOVERNOR_UID)
    proxy_port, control_port = _free_port(), _free_port()
    name = f"governor-test-{uuid.uuid4().hex[:8]}"
    mock = await start_mock()
    started = _podman("run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
                      *_limits(), "-v", f"{data}:/var/lib/governor", image, "run",
                      "--listen", f"127.0.0.1:{proxy_port}", "--control", f"127.0.0.1:{control_port}",
                      "--session", "image-test")
    assert started.returncode == 0, started.stderr
    try:
        ready = await _wait_healthy(f"http://127.0.0.1:{control_port}", name)
        assert ready["passport_digest"] == passport_digest(load_passport(example_passport_path()))

        async with aiohttp.ClientSession() as http:
            async with http.post(f"{mock.base_url}/v1/chat/completions", proxy=f"http://127.0.0.1:{proxy_port}",
                                 json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}) as answer:
                body = await answer.json()
                assert answer.status == 200, body
        assert body["usage"]["total_tokens"] == 18 and len(mock.requests) == 1

        stopped_at = time.monotonic()
        assert _podman("kill", "--signal", "TERM", name).returncode == 0
        waited = _podman("wait", name, timeout=60)
        exit_code = waited.stdout.strip()
        logs = _podman("logs", name)
        assert exit_code == "0", f"exit {exit_code}\n{logs.stdout}{logs.stderr}"
        assert time.monotonic() - stopped_at < 60
    finally:
        _podman("rm", "-f", name)
        await mock.stop()

    record_file = data / "records" / "image-test.json"
    assert record_file.is_file(), sorted(p.name for p in data.rglob("*"))
    record = json.loads(record_file.read_text())
    assert record["outcome"] == "completed"
    verified = subprocess.run([sys.executable, "-m", "governor", "verify", str(record_file),
                               "--offline", "--key", str(data / "keys" / "governor-pub.pem")],
                              capture_output=True, text=True, timeout=60)
    assert verified.returncode == 3 and "\nINCOMPLETE" in verified.stdout and "FAIL " not in verified.stdout, verified.stdout + verified.stderr
