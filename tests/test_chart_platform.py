"""The chart's platform conventions (issue #33 item 7): a service account, names and image
digests, the agent container's probes, resources, volumes and envFrom, scheduling settings,
a `helm test` hook, a Grafana dashboard whose every query names a series the governor
exports (scraped from a real governor after a real call) and parses as PromQL (promtool),
and the release's own alerts, `absent()` included, unit-tested with `promtool test rules`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import aiohttp
import pytest
import pytest_asyncio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests import chart_tools
from tests.chart_tools import CHART
from tests.proxy_harness import real_governor

PROMTOOL = shutil.which("promtool")
DIGEST = "sha256:" + "ab" * 32
PLATFORM = {
    "serviceAccount.annotations": {"iam.gke.io/gcp-service-account": "agent@p.iam.gserviceaccount.com"},
    "governor.image.digest": DIGEST,
    "agent.image.digest": "sha256:" + "cd" * 32,
    "agent.envFrom": [{"secretRef": {"name": "agent-keys"}}],
    "agent.readinessProbe": {"httpGet": {"path": "/ready", "port": 8000}},
    "agent.livenessProbe": {"httpGet": {"path": "/live", "port": 8000}},
    "agent.ports": [{"name": "http", "containerPort": 8000}],
    "agent.volumeMounts": [{"name": "work", "mountPath": "/work"}],
    "extraVolumes": [{"name": "work", "emptyDir": {"sizeLimit": "1Gi"}}],
    "priorityClassName": "agents",
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "{{ .Release.Name }}"}}}],
    "nameOverride": "gov",
    "grafanaDashboard.enabled": True,
    "prometheusRule.enabled": True,
}


@pytest.fixture(scope="module")
def platform():
    if chart_tools.helm_binary() is None:
        pytest.fail("helm is not on PATH and .ci/k8s-tools could not fetch it")
    return chart_tools.render(PLATFORM, release="lab")


def _one(documents, kind):
    (found,) = [d for d in documents if d["kind"] == kind]
    return found


def test_the_pod_runs_as_its_own_service_account_without_a_token(platform):
    account = _one(platform, "ServiceAccount")
    pod = _one(platform, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "lab-gov"
    assert account["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert account["metadata"]["annotations"] == PLATFORM["serviceAccount.annotations"]


def test_names_images_and_scheduling_follow_the_values(platform):
    deployment = _one(platform, "Deployment")
    assert deployment["metadata"]["name"] == "lab-gov"
    pod = deployment["spec"]["template"]["spec"]
    governor = next(c for c in pod["initContainers"] if c["name"] == "governor")
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    assert governor["image"] == f"localhost/adl-governor@{DIGEST}"
    assert agent["image"] == "example/agent@sha256:" + "cd" * 32
    assert pod["priorityClassName"] == "agents"
    [spread] = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "lab"  # templated
    fullname = chart_tools.render({"fullnameOverride": "governor-x"})
    assert _one(fullname, "Deployment")["metadata"]["name"] == "governor-x"


def test_the_agent_container_gets_its_probes_resources_volumes_and_secrets(platform):
    pod = _one(platform, "Deployment")["spec"]["template"]["spec"]
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    assert agent["readinessProbe"] == PLATFORM["agent.readinessProbe"]
    assert agent["livenessProbe"] == PLATFORM["agent.livenessProbe"]
    assert agent["envFrom"] == PLATFORM["agent.envFrom"] and agent["ports"] == PLATFORM["agent.ports"]
    assert agent["resources"]["limits"]["memory"] and agent["resources"]["requests"]["cpu"]  # defaults set
    assert {"name": "work", "mountPath": "/work"} in agent["volumeMounts"]
    assert {"name": "work", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]
    assert chart_tools.restricted_violations(pod, agent) == []
    defaults = _one(chart_tools.render({}), "Deployment")["spec"]["template"]["spec"]
    plain = next(c for c in defaults["containers"] if c["name"] == "agent")
    assert "readinessProbe" not in plain and "envFrom" not in plain and plain["resources"]  # resources by default


def test_the_control_service_targets_the_port_number_for_kubernetes_before_1_32(platform):
    # a native sidecar is an init container: named ports of one resolve for a Service from 1.32 on
    service = _one(platform, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == 8081


def test_helm_test_checks_the_control_plane_with_the_governor_image_and_no_shell(platform):
    (hook,) = [d for d in platform if d["kind"] == "Pod"]
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    [container] = hook["spec"]["containers"]
    assert container["image"] == f"localhost/adl-governor@{DIGEST}"
    assert container["command"][:2] == ["python3", "-c"] and "lab-gov-control:8081/healthz" in container["command"][2]
    compile(container["command"][2], "helm-test", "exec")  # the script it runs is Python that parses
    assert chart_tools.restricted_violations(hook["spec"], container) == []


def test_the_ca_hand_over_hook_needs_no_shell(platform):
    pod = _one(platform, "Deployment")["spec"]["template"]["spec"]
    governor = next(c for c in pod["initContainers"] if c["name"] == "governor")
    command = governor["lifecycle"]["postStart"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"] and "sh" not in command
    compile(command[2], "post-start", "exec")


def test_the_interception_container_uses_the_intercept_image(platform):
    documents = chart_tools.render({"interception.enabled": True, "governor.image.tag": "0.1.0"})
    pod = _one(documents, "Deployment")["spec"]["template"]["spec"]
    intercept = next(c for c in pod["initContainers"] if c["name"] == "intercept")
    # what .ci/image tags from the Containerfile's `intercept` stage (the governor image has no sh)
    assert intercept["image"] == "localhost/adl-governor-intercept:0.1.0"
    assert "INTERCEPT_IMAGE=${IMAGE%:*}-intercept:${IMAGE##*:}" in (chart_tools.REPO / ".ci" / "image").read_text()
    assert "AS intercept" in (chart_tools.REPO / "Containerfile").read_text()


def test_the_platform_values_validate_for_every_supported_kubernetes_version(platform):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for document in platform:
        if document["kind"] in ("ServiceMonitor", "PrometheusRule"):
            continue
        for version in chart_tools.supported_kubernetes_versions():
            kubernetes_validate.validate(document, version, strict=True)
    lint = chart_tools.helm("lint", "--strict", str(CHART), *chart_tools.set_args(PLATFORM))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    bad = chart_tools.helm("lint", "--strict", str(CHART), *chart_tools.set_args({"governor.image.digest": "latest"}))
    assert bad.returncode != 0 and "schema" in bad.stdout + bad.stderr


# --- the dashboard -------------------------------------------------------------------------


def _dashboard(documents) -> dict:
    config = next(d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(config["data"]["governor.json"])


def _expressions(dashboard: dict) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def exported(tmp_path_factory) -> set[str]:
    """Every series name a real governor exposes on /metrics after one governed call."""
    async with real_governor(tmp_path_factory.mktemp("metrics"), control=("127.0.0.1", 0)) as (running, mock):
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{mock.base_url}/v1/chat/completions", proxy=running.proxy_url,
                                 ssl=False, headers={"ADL-Session": "dash-1"},
                                 json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}) as r:
                assert r.status == 200, await r.text()
            async with http.get(f"{running.control_url}/metrics") as r:
                text = await r.text()
    families = list(text_string_to_metric_families(text))
    names = {f.name for f in families} | {s.name for f in families for s in f.samples}
    names |= set(re.findall(r"^# TYPE (\S+) histogram", text, re.M))
    for histogram in re.findall(r"^# TYPE (\S+) histogram", text, re.M):
        names |= {f"{histogram}_bucket", f"{histogram}_sum", f"{histogram}_count"}
    for counter in re.findall(r"^# TYPE (\S+) counter", text, re.M):
        names |= {counter if counter.endswith("_total") else f"{counter}_total"}
    assert "governor_decisions_total" in names and "governor_upstream_seconds_bucket" in names
    return names


def _recorded() -> set[str]:
    rules = yaml.safe_load((CHART / "files" / "prometheus" / "governor-rules.yaml").read_text())["groups"]
    return {r["record"] for g in rules for r in g["rules"] if "record" in r}


def _unknown(expr: str, exported: set[str], recorded: set[str]) -> set[str]:
    """The governor series an expression names that are neither exported nor recorded."""
    return {s for s in re.findall(r"\b(governor[_:][a-z0-9_:]+)\b", expr) if s not in exported and s not in recorded}


@pytest.mark.asyncio(loop_scope="module")
async def test_every_dashboard_query_names_a_series_the_governor_exports(platform, exported):
    expressions = _expressions(_dashboard(platform))
    assert len(expressions) >= 15
    recorded = _recorded()
    for expr in expressions:
        assert re.search(r"\bgovernor[_:]", expr) or expr.startswith("sum(up{"), expr  # Prometheus' own `up`
        assert _unknown(expr, exported, recorded) == set(), expr
    # not vacuous: a misspelt family or recording rule is caught
    assert _unknown("rate(governor_decision_total[5m])", exported, recorded) == {"governor_decision_total"}
    assert _unknown("governor:halt:rate5m", exported, recorded) == {"governor:halt:rate5m"}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_every_dashboard_query_parses_as_promql(platform, tmp_path):
    expressions = [e.replace("$job", ".*") for e in _expressions(_dashboard(platform))]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(expressions)]}]}
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump(rules))
    done = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "dashboard.yaml")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and f"SUCCESS: {len(expressions)} rules found" in done.stdout, done.stdout + done.stderr


# --- the release's own alerts ----------------------------------------------------------------


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_the_release_alerts_fire_when_the_governor_is_down_or_absent(platform, tmp_path):
    rule = _one(platform, "PrometheusRule")
    own = rule["spec"]["groups"][0]
    assert [r["alert"] for r in own["rules"]] == ["GovernorDown", "GovernorAbsent"]
    (tmp_path / "release.yaml").write_text(yaml.safe_dump({"groups": [own]}))
    tests = {"rule_files": ["release.yaml"], "evaluation_interval": "1m", "tests": [
        {"name": "down, then gone", "interval": "1m",
         "input_series": [{"series": 'up{job="lab-gov-control", instance="a"}', "values": "1 1 0 0 0 0 0 0 0"}],
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "GovernorDown", "exp_alerts": []},
             {"eval_time": "8m", "alertname": "GovernorDown", "exp_alerts": [
                 {"exp_labels": {"severity": "critical", "job": "lab-gov-control", "instance": "a"},
                  "exp_annotations": {"summary": own["rules"][0]["annotations"]["summary"]}}]},
             {"eval_time": "8m", "alertname": "GovernorAbsent", "exp_alerts": []},
         ]},
        {"name": "never scraped", "interval": "1m",
         "input_series": [{"series": 'up{job="someone-else", instance="b"}', "values": "1x20"}],
         "alert_rule_test": [
             {"eval_time": "5m", "alertname": "GovernorAbsent", "exp_alerts": []},  # pending (for: 10m)
             {"eval_time": "15m", "alertname": "GovernorAbsent", "exp_alerts": [
                 {"exp_labels": {"severity": "critical", "job": "lab-gov-control"},
                  "exp_annotations": {"summary": own["rules"][1]["annotations"]["summary"]}}]},
         ]},
    ]}
    (tmp_path / "release.test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([PROMTOOL, "test", "rules", "release.test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # not vacuous: the same tests fail against a GovernorAbsent that never fires
    broken = dict(own, rules=[own["rules"][0], dict(own["rules"][1], expr="absent(vector(1))")])
    (tmp_path / "release.yaml").write_text(yaml.safe_dump({"groups": [broken]}))
    failed = subprocess.run([PROMTOOL, "test", "rules", "release.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert failed.returncode != 0 and "GovernorAbsent" in failed.stdout + failed.stderr


def test_the_up_selector_can_be_set_for_annotation_scrapes():
    rule = _one(chart_tools.render({"prometheusRule.enabled": True,
                                    "prometheusRule.upSelector": 'kubernetes_pod_name=~"lab-.*"'}), "PrometheusRule")
    exprs = [r["expr"] for r in rule["spec"]["groups"][0]["rules"]]
    assert exprs == ['up{kubernetes_pod_name=~"lab-.*"} == 0', 'absent(up{kubernetes_pod_name=~"lab-.*"})']
