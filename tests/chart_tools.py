"""helm for the chart's tests, and the Pod Security "restricted" check over rendered manifests.

helm comes from PATH or from `.ci/k8s-tools` (the npm package that ships it, cached in
.tools/bin); `restricted_violations` is the Pod Security Standard's "restricted" profile
(https://kubernetes.io/docs/concepts/security/pod-security-standards/) plus a read-only
root filesystem and no service-account token, as this chart promises them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any, Iterable

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "governor"
REQUIRED = {"agent.image.repository": "example/agent", "passport.content": "name: x"}

# Volume types the restricted (and baseline) profile allows.
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                   "projected", "secret"}
POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}


@cache
def helm_binary() -> str | None:
    """helm on PATH, else fetched by .ci/k8s-tools; None (with the reason printed) when neither works."""
    found = shutil.which("helm")
    if found:
        return found
    done = subprocess.run(["bash", str(REPO / ".ci" / "k8s-tools")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(f".ci/k8s-tools failed: {done.stderr.strip()}")
        return None
    return str(Path(done.stdout.strip()) / "helm")


def set_args(values: dict[str, Any]) -> list[str]:
    """--set-json arguments for these dotted keys (the required two first)."""
    args: list[str] = []
    for key, value in {**REQUIRED, **values}.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def helm(*argv: str) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    assert binary is not None
    return subprocess.run([binary, *argv], capture_output=True, text=True, timeout=120)


def render(values: dict[str, Any], release: str = "t") -> list[dict[str, Any]]:
    done = helm("template", release, str(CHART), *set_args(values))
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def pod_specs(documents: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
            for d in documents if d.get("kind") in POD_KINDS]


def long_running(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers that run with the agent: containers, and native sidecars among the init containers."""
    return list(pod.get("containers") or []) + [c for c in pod.get("initContainers") or []
                                                if c.get("restartPolicy") == "Always"]


def restricted_violations(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """What in this container (with its pod's settings) breaks the restricted profile, [] if nothing."""
    pod_sc = pod.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    found: list[str] = []
    if pod.get("automountServiceAccountToken") is not False:
        found.append("the pod mounts a service-account token (automountServiceAccountToken is not false)")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(f"the pod sets {key}")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume['name']} is of a disallowed type {sorted(kinds - ALLOWED_VOLUMES)}")
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        found.append(f"seccompProfile is {seccomp!r}, not RuntimeDefault or Localhost")
    if sc.get("privileged"):
        found.append("privileged")
    if sc.get("allowPrivilegeEscalation") is not False:
        found.append("allowPrivilegeEscalation is not false")
    capabilities = sc.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        found.append("capabilities do not drop ALL")
    if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
        found.append(f"capabilities add {sorted(set(capabilities['add']) - {'NET_BIND_SERVICE'})}")
    non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    if non_root is not True:
        found.append("runAsNonRoot is not true")
    if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
        found.append("runAsUser is 0")
    if sc.get("readOnlyRootFilesystem") is not True:
        found.append("readOnlyRootFilesystem is not true")
    for port in container.get("ports") or []:
        if port.get("hostPort"):
            found.append(f"hostPort {port['hostPort']}")
    return found


def supported_kubernetes_versions() -> list[str]:
    """The chart's kubeVersion (>= 1.29) up to the newest kubernetes-validate knows: one per minor."""
    import kubernetes_validate.utils as utils

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.29.0-0"
    minors = sorted({tuple(int(p) for p in v.split(".")[:2]) for v in utils.all_versions()})
    versions = [f"{major}.{minor}.0" for major, minor in minors if (major, minor) >= (1, 29)]
    # issue #33 names 1.29-1.35: an older kubernetes-validate would quietly check fewer
    assert {"1.29.0", "1.35.0"} <= set(versions), f"kubernetes-validate knows only {versions}: 1.29-1.35 needed"
    return versions
