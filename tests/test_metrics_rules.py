"""The shipped Prometheus rules (helm/governor/files/prometheus/, which the chart's PrometheusRule loads): valid for promtool, unit-tested with
`promtool test rules`, and naming only families the governor exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from governor.runtime.metrics import Metrics

RULES_DIR = Path(__file__).resolve().parent.parent / "helm" / "governor" / "files" / "prometheus"
RULES = RULES_DIR / "governor-rules.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")


@needs_promtool
def test_promtool_checks_the_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert b"SUCCESS: 12 rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass():
    result = subprocess.run([PROMTOOL, "test", "rules", "governor-rules.test.yaml"], cwd=RULES_DIR,
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


@needs_promtool
def test_promtool_rule_tests_can_fail(tmp_path):
    """The unit tests are not vacuous: with the fail-closed alert's threshold raised, they fail."""
    rules = RULES.read_text().replace('cause="on_governor_error"}[5m])) > 0', 'cause="on_governor_error"}[5m])) > 5')
    assert rules != RULES.read_text()
    (tmp_path / "governor-rules.yaml").write_text(rules)
    shutil.copy(RULES_DIR / "governor-rules.test.yaml", tmp_path)
    result = subprocess.run([PROMTOOL, "test", "rules", "governor-rules.test.yaml"], cwd=tmp_path,
                            capture_output=True, timeout=120)
    assert result.returncode != 0 and b"GovernorFailingClosed" in result.stdout + result.stderr


def test_rules_name_only_families_the_governor_exports():
    exported = {s.name for f in text_string_to_metric_families(Metrics().exposition().decode()) for s in f.samples}
    exported |= {f.name for f in text_string_to_metric_families(Metrics().exposition().decode())}
    exported |= {f"{name}_total" for name in exported} | {f"{name}_count" for name in exported}
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    used = {name for group in groups for rule in group["rules"]
            for name in re.findall(r"\b(governor_[a-z_]+)\b", rule["expr"])}
    assert used, "no governor metric named in the rules"
    assert used <= exported, used - exported
    named = {name for group in groups for rule in group["rules"] for name in re.findall(r"\b(governor:[a-z_0-9:]+)", rule["expr"])}
    assert named <= recorded, named - recorded
