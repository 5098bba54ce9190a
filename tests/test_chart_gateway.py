"""The chart's gateway mode (issue #30: "a shared gateway Deployment with N replicas behind a
Service, beside today's sidecar"), with the real helm: what it renders (replicas, Services,
PodDisruptionBudget, topology spread, probes, drain, hardening, NetworkPolicy, alerts, records
on a shared claim), that it
validates for every supported Kubernetes version and lints, that hostile or unusable values
are each refused at render with a clear message, that gateway values leave the sidecar's
output as it was, and that the rendered command line and environment really run: two
replicas started from the rendered Deployment as local processes on one real redis-server
(with a password, from the "Secret"), one session served through both, their records and
logs on the "claim" (a local directory), each pod in its own directory."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import chart_tools
from tests.chart_tools import CHART, REPO

PROMTOOL = shutil.which("promtool")
# what the gateway needs besides the passport: a Redis store URL, one CA, one key, one set of tokens
NEEDS = {"mode": "gateway", "gateway.store.url": "redis://redis-master.data.svc:6379/0",
         "gateway.store.password.existingSecret": "gov-redis", "ca.existingSecret": "gov-ca",
         "gateway.key.existingSecret": "gov-key", "controlToken.existingSecret": "gov-control",
         "reviewerTokens.existingSecret": "gov-reviewers"}
GATEWAY = {**NEEDS, "agent.image.repository": "", "gateway.replicas": 3, "gateway.workers": 2,
           "governor.image.digest": "sha256:" + "ab" * 32, "networkPolicy.enabled": True,
           "gateway.agentsFrom": [{"namespaceSelector": {"matchLabels": {"agents": "yes"}}}],
           "serviceMonitor.enabled": True, "prometheusRule.enabled": True, "grafanaDashboard.enabled": True}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _render(values: dict[str, Any], release: str = "gw") -> list[dict[str, Any]]:
    done = chart_tools.helm("template", release, str(CHART), "--namespace", "agents", *chart_tools.set_args(values))
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _refused(values: dict[str, Any]) -> str:
    done = chart_tools.helm("template", "gw", str(CHART), *chart_tools.set_args(values))
    assert done.returncode != 0, f"rendered: {values}"
    return done.stderr


def _one(documents, kind, suffix=""):
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


def _governor(documents) -> tuple[dict, dict]:
    pod = _one(documents, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


@pytest.fixture(scope="module")
def gateway():
    if chart_tools.helm_binary() is None:
        pytest.fail("helm is not on PATH and .ci/k8s-tools could not fetch it")
    return _render(GATEWAY)


def test_the_gateway_renders_replicas_behind_a_proxy_and_a_control_service(gateway):
    kinds = sorted(d["kind"] for d in gateway)
    assert kinds == sorted(["ConfigMap", "ConfigMap", "Deployment", "NetworkPolicy", "Pod", "PodDisruptionBudget",
                            "PrometheusRule", "Service", "Service", "ServiceAccount", "ServiceMonitor"]), kinds
    deployment = _one(gateway, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod, governor = _governor(gateway)
    assert "initContainers" not in pod and governor["name"] == "governor"  # no agent: agents live elsewhere
    args = governor["args"]
    assert args[args.index("--listen") + 1] == "0.0.0.0:8080"  # the pod IP: agents in other pods reach it
    assert args[args.index("--workers") + 1] == "2"
    assert args[args.index("--default-session") + 1] == "off"  # many agents: no shared token-less session
    proxy = _one(gateway, "Service", "-proxy")
    assert proxy["spec"]["ports"] == [{"name": "proxy", "port": 8080, "targetPort": "proxy", "protocol": "TCP"}]
    assert "publishNotReadyAddresses" not in proxy["spec"]  # a draining or store-less replica takes no calls
    control = _one(gateway, "Service", "-control")
    assert control["spec"]["publishNotReadyAddresses"] is True  # its acknowledgement still arrives
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert proxy["spec"]["selector"] == control["spec"]["selector"] == selector
    budget = _one(gateway, "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    spread = pod["topologySpreadConstraints"]
    assert [s["topologyKey"] for s in spread] == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    assert all(s["labelSelector"]["matchLabels"] == selector and s["whenUnsatisfiable"] == "ScheduleAnyway"
               for s in spread)
    given = [{"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
              "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "{{ .Release.Name }}"}}}]
    own, _ = _governor(_render({**NEEDS, "topologySpreadConstraints": given}))
    assert own["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "gw"


def test_probes_drain_and_grace_period_fit_together(gateway):
    pod, governor = _governor(gateway)
    assert governor["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "control"}
    assert governor["livenessProbe"]["httpGet"] == governor["startupProbe"]["httpGet"] == {"path": "/healthz",
                                                                                          "port": "control"}
    env = {e["name"]: e for e in governor["env"]}
    pre_stop = governor["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:2] == ["python3", "-c"]  # the image has no shell
    compile(pre_stop[2], "pre-stop", "exec")
    wait = float(re.search(r"sleep\((\d+)\)", pre_stop[2]).group(1))
    # preStop wait + drain + the 5 s the governor keeps for records = the grace period
    assert wait + float(env["GOVERNOR_DRAIN_TIMEOUT"]["value"]) + 5 == pod["terminationGracePeriodSeconds"] == 30
    longer, _ = _governor(_render({**NEEDS, "terminationGracePeriodSeconds": 90, "gateway.preStopSeconds": 0}))
    _, plain = _governor(_render({**NEEDS, "terminationGracePeriodSeconds": 90, "gateway.preStopSeconds": 0}))
    assert longer["terminationGracePeriodSeconds"] == 90 and "lifecycle" not in plain
    assert {e["name"]: e for e in plain["env"]}["GOVERNOR_DRAIN_TIMEOUT"]["value"] == "85"


def test_the_gateway_is_hardened_like_the_sidecar(gateway):
    pod, governor = _governor(gateway)
    assert chart_tools.restricted_violations(pod, governor) == []
    assert governor["image"] == "localhost/adl-governor@sha256:" + "ab" * 32
    assert pod["serviceAccountName"] == _one(gateway, "ServiceAccount")["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # the CA Secret's key half only; the signing key from its own Secret, read-only
    assert volumes["ca"]["secret"] == {"secretName": "gov-ca", "items": [{"key": "mitmproxy-ca.pem",
                                                                          "path": "mitmproxy-ca.pem"}]}
    assert volumes["governor-key"]["secret"]["secretName"] == "gov-key"
    mounts = {m["name"]: m for m in governor["volumeMounts"]}
    assert mounts["governor-key"] == {"name": "governor-key", "mountPath": "/var/lib/governor/keys", "readOnly": True}
    assert "persistentVolumeClaim" not in volumes["data"]
    hook = next(d for d in gateway if d["kind"] == "Pod")
    [test] = hook["spec"]["containers"]
    assert "gw-governor-proxy\", 8080" in test["command"][2] and "gw-governor-control:8081/healthz" in test["command"][2]
    compile(test["command"][2], "helm-test", "exec")
    assert chart_tools.restricted_violations(hook["spec"], test) == []


def test_records_can_outlive_their_pods_on_a_shared_claim_one_directory_per_pod(gateway):
    """gateway.records.persistence: the data directory (records, transparency log, journals,
    deferred refusals) on an existing ReadWriteMany claim, each pod in its own subdirectory named
    after it; the Deployment and its rolling update as they were. Off (the default): an emptyDir."""
    pod, governor = _governor(gateway)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in governor["volumeMounts"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}} and "subPathExpr" not in mounts["data"]
    documents = _render({**GATEWAY, "gateway.records.persistence.enabled": True,
                         "gateway.records.persistence.existingClaim": "gov-records"})
    deployment = _one(documents, "Deployment")
    assert deployment["spec"]["strategy"] == _one(gateway, "Deployment")["spec"]["strategy"]
    assert "volumeClaimTemplates" not in deployment["spec"]
    assert [d["kind"] for d in documents if d["kind"] == "PersistentVolumeClaim"] == []  # the installer's claim
    pod, governor = _governor(documents)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in governor["volumeMounts"]}
    assert volumes["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "gov-records"}}
    assert mounts["data"] == {"name": "data", "mountPath": "/var/lib/governor", "subPathExpr": "$(GOVERNOR_POD_NAME)"}
    env = {e["name"]: e for e in governor["env"]}
    assert env["GOVERNOR_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # the pod's log origin names the same pod as its directory: one log per directory
    assert env["GOVERNOR_LOG_ORIGIN"]["value"].endswith("/log/$(GOVERNOR_POD_NAME)")
    assert pod["securityContext"]["fsGroup"] == 10001  # the claim's files are the governor's group's
    assert chart_tools.restricted_violations(pod, governor) == []
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for version in chart_tools.supported_kubernetes_versions():
        kubernetes_validate.validate(deployment, version, strict=True)
    lint = chart_tools.helm("lint", "--strict", str(CHART), *chart_tools.set_args(
        {**GATEWAY, "gateway.records.persistence.enabled": True, "gateway.records.persistence.existingClaim": "c"}))
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_network_policy_lets_agents_in_and_the_governor_out_to_its_store(gateway):
    policy = _one(gateway, "NetworkPolicy")["spec"]
    proxy_in, control_in = policy["ingress"]
    assert proxy_in == {"ports": [{"port": 8080, "protocol": "TCP"}], "from": GATEWAY["gateway.agentsFrom"]}
    assert control_in == {"ports": [{"port": 8081, "protocol": "TCP"}]}
    out = [p["port"] for rule in policy["egress"] for p in rule["ports"]]
    assert out == [53, 53, 443, 6379]
    sentinel = _render({**NEEDS, "networkPolicy.enabled": True,
                        "gateway.store.url": "redis+sentinel://s1:26379,s2:26380/main"})
    assert _one(sentinel, "NetworkPolicy")["spec"]["egress"][-1]["ports"] == [
        {"port": 26379, "protocol": "TCP"}, {"port": 26380, "protocol": "TCP"}, {"port": 6379, "protocol": "TCP"}]
    pinned = _render({**NEEDS, "networkPolicy.enabled": True, "networkPolicy.storePorts": [7000]})
    assert _one(pinned, "NetworkPolicy")["spec"]["egress"][-1]["ports"] == [{"port": 7000, "protocol": "TCP"}]


def test_the_store_password_comes_from_a_secret_into_the_url(gateway):
    _, governor = _governor(gateway)
    names = [e["name"] for e in governor["env"]]
    env = {e["name"]: e for e in governor["env"]}
    assert env["GOVERNOR_STORE_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "gov-redis", "key": "redis-password"}
    assert env["GOVERNOR_STORE"]["value"] == "redis://:$(GOVERNOR_STORE_PASSWORD)@redis-master.data.svc:6379/0"
    # Kubernetes expands $(NAME) only from entries defined before
    assert names.index("GOVERNOR_STORE_PASSWORD") < names.index("GOVERNOR_STORE")
    assert env["GOVERNOR_CONTROL_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "gov-control"
    sentinel = _render({**NEEDS, "gateway.store.url": "redis+sentinel://ops@s1:26379,s2:26379/main/2?timeout=3",
                        "gateway.store.sentinelPassword.existingSecret": "gov-sentinel"})
    env = {e["name"]: e for e in _governor(sentinel)[1]["env"]}
    assert env["GOVERNOR_STORE"]["value"] == ("redis+sentinel://ops:$(GOVERNOR_STORE_PASSWORD)@s1:26379,s2:26379/main/2"
                                              "?timeout=3&sentinel_password=$(GOVERNOR_SENTINEL_PASSWORD)")
    open_redis = _render({**NEEDS, "gateway.store.password.existingSecret": "",
                          "gateway.store.url": "redis+cluster://a:7000,b:7001"})
    env = {e["name"]: e for e in _governor(open_redis)[1]["env"]}
    assert env["GOVERNOR_STORE"]["value"] == "redis+cluster://a:7000,b:7001" and "GOVERNOR_STORE_PASSWORD" not in env


def test_the_rendered_command_line_is_one_governor_run_accepts(gateway):
    from governor.cli import build_parser
    from governor.cli.run import resolve

    _, governor = _governor(gateway)
    parsed = build_parser().parse_args(governor["args"])
    parsed.passport = None  # the mounted passport is not here
    env = {e["name"]: e["value"] for e in governor["env"] if "value" in e}
    env["GOVERNOR_STORE"] = env["GOVERNOR_STORE"].replace("$(GOVERNOR_STORE_PASSWORD)", "pw")
    settings = resolve(parsed, env)
    assert settings.workers == 2 and settings.listen == ("0.0.0.0", 8080) and settings.control == ("0.0.0.0", 8081)
    assert settings.default_session == "off"


@pytest.mark.parametrize(("values", "message"), [
    ({"gateway.store.url": ""}, "mode gateway needs gateway.store.url"),
    ({"gateway.store.url": "memory:"}, 'must be a Redis store (redis://, rediss://, redis+sentinel:// or '
                                       'redis+cluster://), got "memory:"'),
    ({"gateway.store.url": "sqlite:///var/lib/governor/state.db"}, "an embedded store"),
    ({"gateway.store.url": "/var/lib/governor/state.db"}, "an embedded store"),
    ({"gateway.store.url": "http://redis:6379"}, "must be a Redis store"),
    ({"gateway.store.url": "redis://:hunter2@redis:6379/0"}, "carries a password inline"),
    ({"gateway.store.url": "rediss://ops:hunter2@redis:6379/0"}, "carries a password inline"),
    ({"gateway.store.url": "redis+sentinel://s:26379/m?sentinel_password=x"}, "carries sentinel_password inline"),
    ({"gateway.store.url": "redis://redis:6379/0?sessions=local"}, "share their sessions through the store"),
    ({"gateway.store.sentinelPassword.existingSecret": "s"}, "is for a redis+sentinel:// store URL"),
    ({"ca.existingSecret": ""}, "mode gateway needs ca.existingSecret"),
    ({"gateway.key.existingSecret": ""}, "mode gateway needs gateway.key.existingSecret"),
    ({"controlToken.existingSecret": ""}, "mode gateway needs controlToken.existingSecret"),
    ({"reviewerTokens.existingSecret": ""}, "mode gateway needs reviewerTokens.existingSecret"),
    ({"dataDir.persistence.enabled": True}, "dataDir.persistence.enabled is for the sidecar"),
    ({"interception.enabled": True}, "interception.enabled is for the sidecar"),
    ({"gateway.records.persistence.enabled": True}, "gateway.records.persistence.enabled needs "
                                                     "gateway.records.persistence.existingClaim"),
    ({"gateway.records.persistence.existingclaim": "x"}, "/gateway/records/persistence"),
    ({"terminationGracePeriodSeconds": 10}, "must exceed gateway.preStopSeconds (5) + 5"),
    ({"gateway.replicas": 0}, "/gateway/replicas': minimum: got 0, want 1"),
    ({"gateway.replicas": -2}, "/gateway/replicas': minimum: got -2, want 1"),
    ({"gateway.replicas": "three"}, "/gateway/replicas"),
    ({"gateway.workers": 0}, "/gateway/workers"),
    ({"mode": "gatway"}, "/mode': value must be one of 'sidecar', 'gateway'"),
    ({"mode": ""}, "/mode': value must be one of 'sidecar', 'gateway'"),
])
def test_bad_gateway_values_are_refused_at_render_with_the_reason(gateway, values, message):
    stderr = _refused({**NEEDS, **values})
    assert message in stderr, stderr
    assert "hunter2" not in stderr  # an inline password is not echoed


def test_gateway_values_leave_the_sidecar_as_it_was(gateway):
    """mode sidecar (the default) ignores every gateway value: the same bytes with or without them."""
    plain = chart_tools.helm("template", "t", str(CHART), *chart_tools.set_args({}))
    configured = chart_tools.helm("template", "t", str(CHART), *chart_tools.set_args(
        {k: v for k, v in GATEWAY.items() if k.startswith("gateway.")} | {"mode": "sidecar"}))
    assert plain.returncode == configured.returncode == 0, plain.stderr + configured.stderr
    assert plain.stdout == configured.stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(plain.stdout) if d]
    assert "PodDisruptionBudget" not in kinds and kinds.count("Service") == 1
    notes = chart_tools.helm("install", "--dry-run", "gw", str(CHART), *chart_tools.set_args(NEEDS))
    assert "HTTPS_PROXY=http://gw-governor-proxy.default.svc:8080" in notes.stdout, notes.stdout[-3000:]
    assert "redis://redis-master.data.svc:6379/0" in notes.stdout


def test_the_gateway_validates_for_every_supported_kubernetes_version_and_lints(gateway):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for document in gateway:
        if document["kind"] in CRD_KINDS:
            continue
        for version in chart_tools.supported_kubernetes_versions():
            kubernetes_validate.validate(document, version, strict=True)
    lint = chart_tools.helm("lint", "--strict", str(CHART), *chart_tools.set_args(GATEWAY))
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_the_gateway_alerts_fire_per_replica_and_for_all_replicas_down(gateway, tmp_path):
    rule = _one(gateway, "PrometheusRule")
    own = rule["spec"]["groups"][0]
    assert [r["alert"] for r in own["rules"]] == ["GovernorDown", "GovernorAbsent", "GovernorGatewayDown",
                                                  "GovernorGatewayDegraded"]
    (tmp_path / "release.yaml").write_text(yaml.safe_dump({"groups": [own]}))
    job = 'job="gw-governor-control"'
    tests = {"rule_files": ["release.yaml"], "evaluation_interval": "1m", "tests": [
        {"name": "one replica of three down, then all", "interval": "1m",
         "input_series": [{"series": f'up{{{job}, pod="a"}}', "values": "1 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0"},
                          {"series": f'up{{{job}, pod="b"}}', "values": "1x12 0 0 0 0 0 0 0 0"},
                          {"series": f'up{{{job}, pod="c"}}', "values": "1x12 0 0 0 0 0 0 0 0"}],
         "alert_rule_test": [
             {"eval_time": "8m", "alertname": "GovernorDown", "exp_alerts": [  # the one pod that is down
                 {"exp_labels": {"severity": "critical", "job": "gw-governor-control", "pod": "a"},
                  "exp_annotations": {"summary": own["rules"][0]["annotations"]["summary"]}}]},
             {"eval_time": "8m", "alertname": "GovernorGatewayDown", "exp_alerts": []},
             {"eval_time": "12m", "alertname": "GovernorGatewayDegraded", "exp_alerts": [
                 {"exp_labels": {"severity": "warning"},
                  "exp_annotations": {"summary": own["rules"][3]["annotations"]["summary"]}}]},
             {"eval_time": "16m", "alertname": "GovernorGatewayDown", "exp_alerts": [
                 {"exp_labels": {"severity": "critical"},
                  "exp_annotations": {"summary": own["rules"][2]["annotations"]["summary"]}}]},
         ]},
    ]}
    (tmp_path / "release.test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([PROMTOOL, "test", "rules", "release.test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # not vacuous: a gateway alert that never fires fails the same tests
    broken = dict(own, rules=own["rules"][:2] + [dict(own["rules"][2], expr="absent(vector(1))"), own["rules"][3]])
    (tmp_path / "release.yaml").write_text(yaml.safe_dump({"groups": [broken]}))
    failed = subprocess.run([PROMTOOL, "test", "rules", "release.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert failed.returncode != 0 and "GovernorGatewayDown" in failed.stdout + failed.stderr


# --- the rendered Deployment, run -------------------------------------------------------------


class Kubelet:
    """What a kubelet does with the rendered pod, on this machine: each volume mount made under a
    per-replica root directory (Secrets and ConfigMaps written from `secrets` and the rendered
    ConfigMaps, read-only where the pod says so), the environment resolved (secretKeyRef from
    `secrets`, $(NAME) expanded from the entries before), and the container's command run. The
    listen addresses become loopback ephemeral ports: two replicas share this one host."""

    def __init__(self, documents: list[dict], secrets: dict[str, dict[str, bytes]],
                 claims: dict[str, Path] | None = None) -> None:
        self.pod, self.container = _governor(documents)
        self.config_maps = {d["metadata"]["name"]: d["data"] for d in documents if d["kind"] == "ConfigMap"}
        self.secrets = secrets
        self.claims = claims or {}  # claim name -> the local directory standing for its volume

    def mount(self, root: Path, pod_name: str) -> None:
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        for mount in self.container["volumeMounts"]:
            volume, target = volumes[mount["name"]], root / mount["mountPath"].lstrip("/")
            if "emptyDir" in volume:
                target.mkdir(parents=True, exist_ok=True)
                continue
            if "persistentVolumeClaim" in volume:  # the claim's subdirectory, as $(VAR)s expand in the pod
                env = self.environment(pod_name)
                sub = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)],
                             mount.get("subPathExpr", mount.get("subPath", "")))
                source = self.claims[volume["persistentVolumeClaim"]["claimName"]] / sub
                source.mkdir(parents=True, exist_ok=True)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(source, target_is_directory=True)
                continue
            if "configMap" in volume:
                files = {k: v.encode() for k, v in self.config_maps[volume["configMap"]["name"]].items()}
                mode = 0o644
            else:
                source = volume["secret"]
                files = self.secrets[source["secretName"]]
                if "items" in source:
                    files = {i["path"]: files[i["key"]] for i in source["items"]}
                mode = source.get("defaultMode", 0o644)
            if "subPath" in mount:
                target.write_bytes(files[mount["subPath"]])
                target.chmod(mode)
                continue
            target.mkdir(parents=True, exist_ok=True)
            for name, data in files.items():
                (target / name).write_bytes(data)
                (target / name).chmod(mode)
            if mount.get("readOnly"):
                target.chmod(0o555)

    def environment(self, pod_name: str) -> dict[str, str]:
        resolved: dict[str, str] = {}
        for entry in self.container["env"]:
            if "fieldRef" in entry.get("valueFrom", {}):
                assert entry["valueFrom"]["fieldRef"] == {"fieldPath": "metadata.name"}, entry
                resolved[entry["name"]] = pod_name
            elif "valueFrom" in entry:
                ref = entry["valueFrom"]["secretKeyRef"]
                resolved[entry["name"]] = self.secrets[ref["name"]][ref["key"]].decode()
            else:
                resolved[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: resolved.get(m.group(1), m.group(0)),
                                                 entry["value"])
        return resolved

    def command(self, root: Path) -> list[str]:
        mounts = sorted((m["mountPath"] for m in self.container["volumeMounts"]), key=len, reverse=True)
        args = []
        for arg in self.container["args"]:
            if re.fullmatch(r"0\.0\.0\.0:\d+", arg):
                arg = "127.0.0.1:0"
            elif any(arg == m or arg.startswith(m + "/") for m in mounts):
                arg = str(root / arg.lstrip("/"))
            args.append(arg)
        return [sys.executable, "-m", "governor", *args]  # the image's ENTRYPOINT is `governor`


class Replica:
    def __init__(self, process: subprocess.Popen, log: Path, proxy: str, control: str) -> None:
        self.process, self.log, self.proxy, self.control = process, log, proxy, control

    @classmethod
    async def start(cls, kubelet: Kubelet, root: Path, extra_env: dict[str, str]) -> "Replica":
        kubelet.mount(root, f"gov-gateway-{root.name}")
        log = root.parent / f"{root.name}.log"
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(root), "PYTHONPATH": str(REPO), **kubelet.environment(f"gov-gateway-{root.name}"),
               **extra_env}
        with open(log, "wb") as err:
            process = subprocess.Popen(kubelet.command(root), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err)
        lines: list[str] = []

        def banner() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                lines.append(raw.decode(errors="replace").rstrip())
                if lines[-1].startswith("Set in the agent's environment"):
                    return

        try:
            await asyncio.wait_for(asyncio.to_thread(banner), 90)
        except asyncio.TimeoutError:
            process.kill()
            raise AssertionError(f"replica did not start: {lines} {log.read_text()[-2000:]}") from None
        text = "\n".join(lines)
        if process.poll() is not None:
            raise AssertionError(f"replica exited with {process.returncode}: {log.read_text()[-2000:]}")
        proxy, control = re.search(r"proxy:\s+(http://[\d.]+:\d+)", text), re.search(r"control plane:\s+(http://\S+)", text)
        assert proxy and control, text + log.read_text()[-2000:]
        asyncio.get_running_loop().run_in_executor(None, lambda: process.stdout.read())  # never a full pipe
        return cls(process, log, proxy.group(1), control.group(1))

    async def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), 40)
            except asyncio.TimeoutError:
                self.process.kill()
                await asyncio.to_thread(self.process.wait)
        return self.process.returncode


def _ca_files(tmp: Path) -> dict[str, bytes]:
    from mitmproxy.certs import CertStore

    CertStore.from_store(tmp / "ca", "mitmproxy", 2048)
    return {name: (tmp / "ca" / name).read_bytes() for name in ("mitmproxy-ca.pem", "mitmproxy-ca-cert.pem")}


def _key_files(tmp: Path) -> dict[str, bytes]:
    from governor.evidence.keys import write_key_files

    files = write_key_files(tmp / "keygen", "did:web:gateway.example")
    return {p.name: p.read_bytes() for p in (files.private_key, files.public_key, files.did_document)}


@pytest.mark.asyncio
async def test_two_replicas_run_from_the_rendered_deployment_share_a_session_on_one_redis(gateway, tmp_path):
    """The rendered args and env, run: a password-protected redis-server, the Secrets' CA, key and
    tokens; a session opened on A, served through A and B over HTTPS that the agent trusts with
    the CA Secret's certificate alone, ended on B; its record verifies with the key Secret's
    public key; token-less and forged-token calls are refused on both; SIGTERM stops both."""
    from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer
    from tests.upstreams import Behaviour, MockLLM, make_tls

    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    import redis

    server = RedisServer()
    password = secrets.token_urlsafe(24)
    admin = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    admin.config_set("requirepass", password)
    admin.close()
    control_token, reviewer_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    fake_secrets = {"gov-redis": {"redis-password": password.encode()}, "gov-ca": _ca_files(tmp_path),
                    "gov-key": _key_files(tmp_path), "gov-control": {"control-token": control_token.encode()},
                    "gov-reviewers": {"reviewer-tokens": reviewer_token.encode()}}
    passport = (REPO / "governor" / "data" / "example-passport.yaml").read_text()
    documents = _render({**NEEDS, "gateway.store.url": server.url, "passport.content": passport,
                         "gateway.replicas": 2, "gateway.records.persistence.enabled": True,
                         "gateway.records.persistence.existingClaim": "gov-records"})
    assert _one(documents, "Deployment")["spec"]["replicas"] == 2
    claim = tmp_path / "claim"  # a local directory standing for the ReadWriteMany claim's volume
    kubelet = Kubelet(documents, fake_secrets, {"gov-records": claim})
    # the test's upstream serves HTTPS from its own CA: the governor is told to trust it (test plumbing)
    upstream_tls = make_tls(tmp_path / "upstream")
    mock = MockLLM(tls=upstream_tls)
    await mock.start()
    mock.default = Behaviour(input_tokens=5, output_tokens=20)
    agent_ca = tmp_path / "agent-ca.pem"  # what an agent mounts: the CA Secret's certificate item
    agent_ca.write_bytes(fake_secrets["gov-ca"]["mitmproxy-ca-cert.pem"])
    trust = ssl.create_default_context(cafile=str(agent_ca))
    replicas: list[Replica] = []
    try:
        started = await asyncio.gather(*[
            Replica.start(kubelet, tmp_path / f"pod-{k}", {"GOVERNOR_UPSTREAM_CA": str(upstream_tls.ca_file)})
            for k in (0, 1)], return_exceptions=True)
        replicas = [r for r in started if isinstance(r, Replica)]  # stopped below, whatever happens
        for failed in started:
            if isinstance(failed, BaseException):
                raise failed
        a, b = replicas
        async with httpx.AsyncClient(trust_env=False, timeout=30,
                                     headers={"Authorization": f"Bearer {control_token}"}) as control:
            opened = await control.post(f"{a.control}/v1/sessions", json={"label": "gateway"})
            assert opened.status_code == 201, opened.text
            session, token = opened.json()["session"], opened.json()["token"]
            chat = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
            url = f"{mock.base_url}/v1/chat/completions"
            assert url.startswith("https://")
            for replica in (a, b, a, b):  # the session opened on A, served through both
                async with httpx.AsyncClient(proxy=replica.proxy, trust_env=False, timeout=30, verify=trust) as agent:
                    answer = await agent.post(url, headers={"ADL-Session": token}, json=chat)
                    assert answer.status_code == 200, answer.text
            for replica in (a, b):  # no default session on a gateway; a forged token is refused on each
                async with httpx.AsyncClient(proxy=replica.proxy, trust_env=False, timeout=30, verify=trust) as agent:
                    assert (await agent.post(url, json=chat)).status_code in (401, 403)
                    forged = await agent.post(url, headers={"ADL-Session": "forged"}, json=chat)
                    assert forged.status_code in (401, 403), forged.text
            ended = await control.post(f"{b.control}/v1/sessions/{session}/end")
            assert ended.status_code == 200, ended.text
            record = await control.get(f"{a.control}/v1/sessions/{session}/record")
            assert record.status_code == 200, record.text
            # A served the session before B ended it: it serves B's record, byte for byte (not a
            # snapshot of its own stale copy)
            assert record.headers["Governor-Record"] == "final" and record.content == ended.content, record.text
            # each replica its own transparency log, under its own origin (one origin: a fork)
            origins = [(await control.get(f"{replica.control}/log/checkpoint")).text.split("\n", 1)[0]
                       for replica in (a, b)]
            assert origins == [f"gw-governor.agents/log/gov-gateway-pod-{k}" for k in (0, 1)], origins
        assert len(mock.requests) == 4  # the four governed calls reached the upstream, nothing else
    finally:
        codes = [await replica.stop() for replica in replicas]
        await mock.stop()
        server.stop()
    assert codes == [0, 0]
    # on the claim, each pod in its own directory: B's record of the session it ended, and each
    # pod's transparency log (the pods, their roots, can go: these stay)
    kept = sorted(p.relative_to(claim).as_posix() for p in claim.glob("*/records/*.json"))
    assert len(kept) == 1 and kept[0].startswith("gov-gateway-pod-1/records/"), kept
    assert json.loads((claim / kept[0]).read_text())["signature"] == ended.json()["signature"]
    assert all((claim / f"gov-gateway-pod-{k}" / "log" / "checkpoint").is_file() for k in (0, 1))
    for replica in replicas:
        text = replica.log.read_text()
        assert "Traceback" not in text, text[-3000:]
        assert "shares this governor's" not in text  # replicas of one gateway are no duplicate identities
    (tmp_path / "record.json").write_bytes(record.content)
    (tmp_path / "governor-pub.pem").write_bytes(fake_secrets["gov-key"]["governor-pub.pem"])
    verified = subprocess.run([sys.executable, "-m", "governor", "verify", str(tmp_path / "record.json"), "--offline",
                               "--key", str(tmp_path / "governor-pub.pem"), "--json"], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
    report = json.loads(verified.stdout)
    # a pinned key: every check but the key's binding to the id passes (tests/test_shared_sessions.py)
    assert verified.returncode == 3 and report["verdict"] == "INCOMPLETE", verified.stdout + verified.stderr
