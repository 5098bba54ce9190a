"""The causes table (governor/policy/causes.py): the docs show it, the code uses only it,
the spec's seven and ONE extension namespace, old names accepted as typed input only."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from governor.evidence import finalize
from governor.policy import causes, fitting, steps, tools
from governor.policy.degradation import compile_degradation, legacy_degradation_names
from governor.runtime import audit
from governor.sessions import entries, lock_causes
from tests.test_policy_support import Driver, passport, with_runtime

REPO = Path(__file__).resolve().parents[1]
DECIDING = REPO / "docs" / "reference" / "deciding.md"
SPEC_SEVEN = {"on_budget_exhausted", "on_iteration_limit", "on_sub_agent_denied", "on_delegation_denied",
              "on_oversight_timeout", "on_tool_error", "on_anomaly"}  # Runtime §8.3, as written there


def test_the_doc_shows_the_table_generated_from_the_code():
    text = DECIDING.read_text(encoding="utf-8")
    begin, end = "<!-- causes table: generated from governor/policy/causes.py -->\n", "<!-- end of causes table -->"
    shown = text[text.index(begin) + len(begin):text.index(end)]
    assert shown == causes.cause_table_markdown()


def test_spec_causes_are_the_spec_seven_and_every_other_is_in_the_namespace():
    spec = Path("/work/shared/spec/runtime-protocol.txt")
    if spec.is_file():  # the seven as §8.3 lists them
        listed = re.search(r"cause \(([^)]*)\)", spec.read_text(encoding="utf-8")).group(1)
        assert set(re.findall(r"on_[a-z_]+", listed)) == SPEC_SEVEN
    assert set(causes.SPEC_CAUSES) == SPEC_SEVEN
    for cause in causes.CAUSES:
        assert re.fullmatch(r"on_[a-z0-9_]+", cause.name)
        assert (cause.source == causes.EXTENSION) == cause.name.startswith(causes.EXTENSION_PREFIX), cause
        assert set(cause.actions) <= {"halt", "pause", "fallback", "continue"} and cause.actions
    assert len({c.name for c in causes.CAUSES}) == len(causes.CAUSES)


def test_every_cause_the_code_records_is_in_the_table():
    used = {
        steps.ON_SESSION_INTEGRITY, steps.ON_GOVERNOR_ERROR, steps.ON_TOOL_DENIED, steps.ON_REQUEST_REFUSED,
        steps.ON_OVERSIGHT_TRIGGER, steps.ON_SUB_AGENT_SPAWNED, steps.ON_SUB_AGENT_ENDED,
        steps.ON_DELEGATION_ADMITTED, fitting.ON_OUTPUT_FITTED, tools.ON_TOOLS_WITHHELD, entries.ON_AGENT_LOCK,
        entries.ON_SESSION_CAP, audit.ON_KEY_MINTED, *steps.KNOWN_CAUSES,
        finalize.ON_GOVERNOR_ERROR, finalize.ON_SESSION_INTEGRITY,  # the evidence room's own copies
    }
    assert used <= set(causes.BY_NAME), used - set(causes.BY_NAME)
    # no literal cause outside the table anywhere in the package (a cause typed in place drifts)
    literal = re.compile(r"""["'](on_[a-z0-9_]+)["']""")
    allowed = set(causes.BY_NAME) | set(causes.LEGACY_NAMES) | {"on_detected", causes.EXTENSION_PREFIX}  # §3's loop_detection member
    allowed |= {"on_part_begin", "on_part_data", "on_part_end", "on_header_field", "on_header_value",
                "on_header_end", "on_headers_finished"}  # multipart parser callbacks, not causes
    allowed |= {"on_approve", "on_reject", "on_timeout"}  # the reviewer card's consequences, not causes
    strays = {(path.name, name) for path in (REPO / "governor").rglob("*.py")
              for name in literal.findall(path.read_text(encoding="utf-8")) if name not in allowed}
    assert not strays


def test_old_names_are_accepted_in_a_passport_and_recorded_under_the_new_one(caplog):
    runtime = {"degradation": {"on_session_integrity": {"action": "continue"}}}
    assert legacy_degradation_names(runtime) == ["on_session_integrity"]
    assert set(compile_degradation(runtime)) == {"on_governor_session_integrity"}
    from governor.policy import PassportPresented

    decision = Driver(with_runtime(passport(), **runtime)).run(PassportPresented("not-the-pinned-digest"))
    assert decision.event["cause"] == "on_governor_session_integrity"
    assert decision.event["detail"]["overridden_cause"] == "on_governor_session_integrity"


def test_old_names_are_accepted_in_lock_on_with_a_deprecation_line(caplog):
    with caplog.at_level(logging.WARNING, logger="governor.sessions"):
        assert lock_causes.parse_lock_causes("on_session_integrity, on_budget_exhausted") == (
            "on_governor_session_integrity", "on_budget_exhausted")
    assert "lock cause on_session_integrity is deprecated: it is now on_governor_session_integrity" in caplog.text
    with pytest.raises(ValueError, match="on_sesion_integrity"):
        lock_causes.parse_lock_causes("on_sesion_integrity")


def test_approvals_and_fitting_are_not_recorded_as_continue():
    table = causes.BY_NAME
    assert "continue" not in table[causes.ON_GOVERNOR_OUTPUT_FITTED].actions
    assert "continue" not in table[causes.ON_GOVERNOR_TOOLS_WITHHELD].actions
    assert "continue" not in table[causes.ON_GOVERNOR_REQUEST_REFUSED].actions


def test_a_refused_step_is_never_recorded_as_continue():
    """A step refused while the session goes on is §6's fallback (the refusal stands in for the
    step), not `continue`, which says the step went on despite the cause: a full rate-limit
    window, a state store that cannot be reached (fail-closed, retryable)."""
    from governor.policy.engine import store_unreachable
    from governor.policy.rates import rate_refusal
    from governor.policy.steps import ModelCall

    assert causes.BY_NAME[causes.ON_GOVERNOR_RATE_LIMIT].actions == ("fallback",)
    call = ModelCall(model="gpt-4o-mini", expected_input_tokens=1, expected_output_tokens=1)
    refused = rate_refusal(call, None, 0, 30)
    assert refused.blocks and refused.event["action"] == "fallback"
    assert refused.event["detail"]["refused_step"] == "not_executed"
    driver = Driver(passport())
    unreachable = store_unreachable(driver.limits, driver.state, call, "connection refused", 1.0)
    assert unreachable.blocks and unreachable.fail_closed and not unreachable.halts
    assert unreachable.event["cause"] == causes.ON_GOVERNOR_ERROR and unreachable.event["action"] == "fallback"
    assert "overridden_cause" not in unreachable.event["detail"]
