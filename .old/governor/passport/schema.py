"""Trust §1.1.2: the passport against the project's own schemas, every problem with its path.

Validators are compiled once per mode and kept (admission happens per session,
but nothing here should be rebuilt per call). `format` is checked for
`date-time` only: those are the values the governor interprets (expiry).

After the structure holds, `check_limits` checks what JSON Schema cannot say
and the decision point relies on (per_session <= per_day, unique names,
persona tools within the parent's).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, Mapping

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource

from governor.passport.loader import type_name
from governor.passport.resources import data_path

GOVERNANCE_PROFILE = "urn:adl:profile:governance:1.0"
# Governance-profile members the governor acts on: checked whenever present.
GOVERNANCE_MEMBERS = frozenset({"human_oversight", "anomaly_baseline", "governance_record_ref"})
SCHEMA_FILES = ("passport.schema.json", "passport-strict.schema.json", "passport-governance.schema.json")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True, slots=True)
class SchemaIssue:
    """One problem: the JSON path of the offending value and what is wrong with it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def parse_datetime(text: Any) -> datetime | None:
    """An RFC 3339 date-time with an offset, or None."""
    if not isinstance(text, str) or not _RFC3339.match(text):
        return None
    try:
        return datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        return None


FORMAT_CHECKER = FormatChecker(formats=())


@FORMAT_CHECKER.checks("date-time")
def _is_datetime(value: Any) -> bool:
    return not isinstance(value, str) or parse_datetime(value) is not None


@cache
def schema_document(name: str) -> dict[str, Any]:
    return json.loads(data_path(name).read_text(encoding="utf-8"))


@cache
def _registry() -> Registry:
    return Registry().with_resources(
        (schema_document(name)["$id"], Resource.from_contents(schema_document(name))) for name in SCHEMA_FILES
    )


@cache
def validator(strict: bool = False) -> Draft202012Validator:
    """The compiled validator for open or strict mode (built once)."""
    schema = schema_document("passport-strict.schema.json" if strict else "passport.schema.json")
    return Draft202012Validator(schema, registry=_registry(), format_checker=FORMAT_CHECKER)


def declares_governance(document: Mapping[str, Any]) -> bool:
    profiles = document.get("profiles")
    return isinstance(profiles, list) and GOVERNANCE_PROFILE in profiles


def validate(document: Any, *, strict: bool = False) -> list[SchemaIssue]:
    """Every schema problem in `document` (empty when valid), sorted by path."""
    issues: list[SchemaIssue] = []
    known = _known_top_level(document) if isinstance(document, Mapping) else frozenset()
    for error in validator(strict).iter_errors(document):
        issues.extend(_issues(error, known))
    return sorted(set(issues), key=lambda issue: (issue.path, issue.message))


def check_limits(document: Mapping[str, Any]) -> list[SchemaIssue]:
    """Coherence of the declared limits, for a schema-valid document; sorted by path."""
    issues: list[SchemaIssue] = []
    permissions = document.get("permissions", {})
    limits = permissions.get("resource_limits", {})
    _check_budget(limits.get("budget"), "$.permissions.resource_limits.budget", issues)

    tools = document.get("tools")
    tool_names = [tool["name"] for tool in tools or ()]
    _check_unique(tool_names, "$.tools", "name", "tool", issues)

    personas = permissions.get("sub_agents", [])
    _check_unique([p["name"] for p in personas], "$.permissions.sub_agents", "name", "sub-agent", issues)
    for index, persona in enumerate(personas):
        path = f"$.permissions.sub_agents[{index}]"
        _check_budget(persona.get("budget_share"), f"{path}.budget_share", issues)
        # Only checkable when the parent enumerates its tools.
        if tools is not None:
            for position, name in enumerate(persona.get("tools", [])):
                if name not in tool_names:
                    issues.append(SchemaIssue(f"{path}.tools[{position}]", f"{name!r} is not one of the agent's tools"))

    cost = document.get("anomaly_baseline", {}).get("cost_per_session_usd", {})
    if "min" in cost and "max" in cost and cost["min"] > cost["max"]:
        issues.append(SchemaIssue("$.anomaly_baseline.cost_per_session_usd", "min is greater than max"))
    return sorted(issues, key=lambda issue: (issue.path, issue.message))


def _check_budget(budget: Mapping[str, Any] | None, path: str, issues: list[SchemaIssue]) -> None:
    for dimension, cap in (budget or {}).items():
        if "per_session" in cap and "per_day" in cap and cap["per_session"] > cap["per_day"]:
            issues.append(SchemaIssue(f"{path}.{dimension}", "per_session is greater than per_day"))


def _check_unique(names: list[str], path: str, member: str, what: str, issues: list[SchemaIssue]) -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            issues.append(SchemaIssue(f"{path}[{index}].{member}", f"duplicate {what} name {name!r}"))
        seen.add(name)


# --- messages ------------------------------------------------------------------------------


def _known_top_level(document: Mapping[str, Any]) -> frozenset[str]:
    names = set(schema_document("passport.schema.json")["properties"])
    if declares_governance(document):
        names |= set(schema_document("passport-governance.schema.json")["properties"])
    else:
        names -= GOVERNANCE_MEMBERS
    return frozenset(names)


def _issues(error: ValidationError, known_top_level: frozenset[str]) -> list[SchemaIssue]:
    path = error.json_path
    keyword = error.validator
    if keyword == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        return [SchemaIssue(_join(path, name), "required member is missing") for name in missing]
    if keyword in ("additionalProperties", "unevaluatedProperties"):
        extra = _unexpected(error)
        if keyword == "unevaluatedProperties" and path == "$":
            # When any core check fails, JSON Schema drops that branch's annotations and so
            # reports every member as unevaluated: name only the truly unknown ones.
            extra = [name for name in extra if name not in known_top_level]
        where = "top-level member (strict mode)" if path == "$" else "member"
        hint = "" if path != "$" else ": not an ADL core member nor one of a declared profile"
        return [SchemaIssue(_join(path, name), f"unknown {where}{hint}") for name in extra]
    if keyword == "not" and error.validator_value == {}:
        return [SchemaIssue(path, f"allowed only when `profiles` declares {GOVERNANCE_PROFILE}")]
    if keyword == "enum":
        options = ", ".join(json.dumps(option) for option in error.validator_value)
        return [SchemaIssue(path, f"{json.dumps(error.instance)} is not one of {options}")]
    if keyword == "const":
        return [SchemaIssue(path, f"must be {json.dumps(error.validator_value)}")]
    if keyword == "type":
        return [SchemaIssue(path, f"must be of type {error.validator_value} (got {type_name(error.instance)})")]
    if keyword == "format":
        return [SchemaIssue(path, f"{json.dumps(error.instance)} is not a valid {error.validator_value}")]
    if keyword in ("anyOf", "oneOf") and error.context:
        # the alternative whose type fits the value says best what is wrong with it
        fitting = [sub for sub in error.context if not (sub.validator == "type" and not sub.relative_path)]
        if fitting:
            return _issues(best_match(fitting), known_top_level)
        types = " or ".join(sorted({str(sub.validator_value) for sub in error.context}))
        return [SchemaIssue(path, f"must be of type {types} (got {type_name(error.instance)})")]
    return [SchemaIssue(path, error.message)]


def _unexpected(error: ValidationError) -> list[str]:
    """The members an additional/unevaluatedProperties error is about."""
    if error.validator == "additionalProperties":
        schema = error.schema
        known = set(schema.get("properties", {}))
        patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
        return [k for k in error.instance if k not in known and not any(p.search(k) for p in patterns)]
    # unevaluatedProperties: jsonschema's message quotes each member with repr().
    return [name for name in error.instance if repr(name) in error.message]


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"{path}[{json.dumps(name)}]"
