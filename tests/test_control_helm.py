"""The Helm chart (helm/governor): its plain YAML parses, every value a template uses
exists, and the probes, ports, scrape annotations and token variables match what the
control plane really serves and reads. `helm lint` / `helm template` run when helm is
installed."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from governor.control import create_app
from governor.control.auth import CONTROL_TOKEN_ENV, REVIEWER_TOKENS_ENV
from tests.conftest import REPO
from tests.control_harness import ScriptedRuntime

CHART = REPO / "helm" / "governor"
TEMPLATES = sorted((CHART / "templates").glob("*"))


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
    app = create_app(ScriptedRuntime())
    served = {r.resource.canonical for r in app.router.routes() if r.method == "GET"}
    assert {"/healthz", "/readyz", "/metrics"} <= served


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


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed")
def test_helm_lint_and_template(tmp_path):
    args = ["--set", "agent.image.repository=example/agent", "--set", "passport.content=name: x"]
    subprocess.run(["helm", "lint", str(CHART), *args], check=True, capture_output=True)
    rendered = subprocess.run(["helm", "template", "t", str(CHART), *args], check=True, capture_output=True,
                              text=True).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = sorted(d["kind"] for d in documents)
    assert kinds == ["ConfigMap", "Deployment", "Service"]


def _governor_args(values) -> list[str]:
    """The chart's `governor run` arguments with the default values filled in."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    block = helpers[helpers.index("  args:\n") + len("  args:\n"):helpers.index("    {{- range .Values.governor.extraArgs }}")]

    def value(match: re.Match) -> str:
        node = values
        for part in match.group(1).split("."):
            node = node[part]
        return str(node)

    args = []
    for line in block.splitlines():
        item = line.strip().removeprefix("- ")
        item = re.sub(r"\{\{ \.Values\.([A-Za-z0-9_.]+)(?: \| quote)? \}\}", value, item)
        args.append(item.strip('"'))
    return args


def test_the_governor_command_line_is_one_governor_run_accepts(values):
    from governor.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps them here
    assert "run" in commands
    args = _governor_args(values)
    assert args[:2] == ["run", "--listen"] and "--passport" in args
    parsed = parser.parse_args(args)
    assert parsed.command == "run"


def test_the_session_settings_reach_governor_run(values):
    from governor.cli import build_parser
    from governor.proxy.cli import resolve

    args = _governor_args(values)
    for option, key in (("--sessions", "mode"), ("--default-session", "defaultSession"),
                        ("--agent-sessions-per-day", "agentSessionsPerDay"), ("--lock-on", "lockOn")):
        assert args[args.index(option) + 1] == str(values["sessions"][key])
    parsed = build_parser().parse_args([a for a in args if not a.startswith("/etc/governor/passport")
                                        and a != "--passport"])
    settings = resolve(parsed, environ={})
    assert (settings.sessions, settings.default_session, settings.lock_on) == (
        "principal", "auto", ("on_session_integrity",))


def test_the_control_service_names_are_hosts_the_control_plane_answers_to():
    from governor.proxy.cli import OPTIONS

    text = _template_text()
    assert f"name: {OPTIONS['control_host'][0]}\n" in text
    hosts = text[text.index(f"name: {OPTIONS['control_host'][0]}"):].split("value:", 1)[1].splitlines()[0]
    service = (CHART / "templates" / "service.yaml").read_text()
    assert '{{ include "governor.fullname" . }}-control' in service  # the Service these names point at
    assert hosts.count("{{ $control }}") == 4 and ".svc.cluster.local" in hosts
