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
import re
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
    # the host CA bundle pip used during the build is not in the image (no shell: Python looks)
    listed = _podman("run", "--rm", "--network", "none", *_limits(), "--entrypoint", "python3", image, "-c",
                     "import os; print(os.path.exists('/run/secrets/host-ca'), os.getuid())")
    assert listed.stdout.split() == ["False", str(GOVERNOR_UID)], listed.stdout + listed.stderr
    # the chart's gateway mode runs on a Redis store: its client (with hiredis's parser) is in the image
    store = _podman("run", "--rm", "--network", "none", *_limits(), "--entrypoint", "python3", image, "-c",
                    "import redis.utils, governor.store.redis; print(redis.utils.HIREDIS_AVAILABLE)")
    assert store.stdout.split() == ["True"], store.stdout + store.stderr


SHELLS = {"sh", "bash", "rbash", "dash", "ash", "zsh", "ksh", "csh", "tcsh", "fish", "busybox"}
PACKAGE_MANAGERS = {"apt", "apt-get", "apt-cache", "aptitude", "dpkg", "dpkg-deb", "dpkg-query", "pip", "pip3",
                    "pip3.12", "pip3.13", "easy_install", "rpm", "yum", "dnf", "apk", "microdnf"}


def _files(image: str, *command: str) -> list[tuple[str, int, bool]]:
    """(path, mode, is a regular file) of every entry of the image's filesystem but directories, read from outside it
    (podman export), so nothing in the image is trusted to report on itself."""
    import tarfile

    created = _podman("create", image, *command)
    box = created.stdout.strip()
    assert created.returncode == 0 and box, created.stderr
    try:
        exported = subprocess.run([*PODMAN, "export", box], capture_output=True, timeout=300)
        assert exported.returncode == 0, exported.stderr[-2000:]
    finally:
        _podman("rm", box)
    import io

    with tarfile.open(fileobj=io.BytesIO(exported.stdout)) as archive:
        return [("/" + m.name.lstrip("./"), m.mode, m.isfile()) for m in archive.getmembers() if not m.isdir()]


@pytest.fixture(scope="module")
def image_files(image) -> list[tuple[str, int, bool]]:
    return _files(image)


EXEC_DIRS = {"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin", "/opt/governor/bin",
             "/usr/libexec", "/etc/alternatives"}


def _commands(files: list[tuple[str, int, bool]]) -> set[str]:
    """The names of what can be run by name: entries of the directories commands live in."""
    return {path.rsplit("/", 1)[-1] for path, _, _ in files if path.rsplit("/", 1)[0] in EXEC_DIRS}


def test_the_image_has_no_package_manager_shell_or_setuid_file(image_files):
    names = _commands(image_files)
    assert "python3" in names and "governor" in names  # what it must keep
    assert not SHELLS & set(names), sorted((SHELLS & set(names)))
    assert not PACKAGE_MANAGERS & set(names), sorted(PACKAGE_MANAGERS & set(names))
    assert not [p for p, _, _ in image_files if "/site-packages/pip/" in p or p.endswith("/var/lib/dpkg/status")]
    privileged = [p for p, mode, regular in image_files if regular and mode & 0o6000]
    assert privileged == []


def test_the_scan_finds_what_it_looks_for(image):
    """Not vacuous: the same scan over the intercept image (the base, with sh and apt) finds them."""
    intercept = image.rsplit(":", 1)[0] + "-intercept:" + image.rsplit(":", 1)[1]
    files = _files(intercept, "sh")
    names = _commands(files)
    assert {"sh", "dpkg", "iptables"} <= names
    assert [p for p, mode, regular in files if regular and mode & 0o6000]  # su, mount, ... in a Debian base


def test_the_image_carries_oci_labels_and_its_sbom(image, image_files):
    labels = json.loads(_podman("image", "inspect", image).stdout)[0]["Config"]["Labels"]
    version = labels["org.opencontainers.image.version"]
    assert labels["org.opencontainers.image.title"] == "adl-governor" and image.endswith(":" + version)
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels["org.opencontainers.image.created"])
    assert labels["io.cyclonedx.sbom"] in {p for p, _, _ in image_files}
    sbom_file = REPO / ".tools" / "image" / f"adl-governor-{version}.cdx.json"
    sbom = json.loads(sbom_file.read_text())
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"].startswith("1.")
    components = {c["name"]: c for c in sbom["components"]}
    # the venv's packages at the versions installed in the image, and the Debian ones under them
    listed = _podman("run", "--rm", "--network", "none", *_limits(), "--entrypoint", "python3", image, "-c",
                     "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name'].lower(): d.version "
                     "for d in m.distributions()}))")
    installed = json.loads(listed.stdout)
    for name in ("mitmproxy", "aiohttp", "cryptography", "jsonschema", "adl-governor"):
        assert components[name]["version"] == installed[name], name
    for name in ("mitmproxy", "aiohttp", "cryptography", "jsonschema"):  # the governor itself: the project
        assert components[name]["purl"].startswith(f"pkg:pypi/{name}@")
    debs = [c for c in sbom["components"] if c.get("purl", "").startswith("pkg:deb/debian/")]
    assert any(c["name"].startswith("libc6") for c in debs) and any(c["name"].startswith("python3") for c in debs)


def test_the_intercept_image_runs_the_charts_interception_script(image):
    """The chart's interception init container runs `sh intercept.sh` in the -intercept image."""
    intercept = image.rsplit(":", 1)[0] + "-intercept:" + image.rsplit(":", 1)[1]
    script = REPO / "helm" / "governor" / "files" / "intercept.sh"
    done = _podman("run", "--rm", "--network", "none", *_limits(), "-v", f"{script}:/intercept.sh:ro",
                   "-e", "GOVERNOR_UID=", intercept, "sh", "/intercept.sh")
    # refused before touching iptables (no GOVERNOR_UID): sh and the script ran, and said why
    assert done.returncode != 0 and "GOVERNOR_UID" in done.stdout + done.stderr, done.stdout + done.stderr
    found = _podman("run", "--rm", "--network", "none", *_limits(), "--entrypoint", "sh", intercept, "-c",
                    "command -v iptables")
    assert found.returncode == 0 and "iptables" in found.stdout


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
