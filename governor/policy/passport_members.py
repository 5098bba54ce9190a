"""Reading the passport's governed members, one at a time, into the values of `Limits`.

Each reader checks its member as the governor must apply it and raises LimitsError naming
the member it cannot (a non-numeric cap, an unknown predicate, a bad pattern): the passport
is refused rather than half-enforced. `governor.policy.compiling` puts them together.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from governor.policy import patterns
from governor.policy.limits import (COST, DIMENSIONS, SCOPES, SENSITIVITY, TOKENS, WALL_CLOCK, Baseline,
                                    DelegationPolicy, LimitsError, Meter, Persona, Trigger)


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise LimitsError(f"{where}: must be an object")
    return value


def positive(value: Any, where: str, integer: bool = False) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LimitsError(f"{where}: must be a positive number, got {value!r}")
    if integer:
        if value != int(value):
            raise LimitsError(f"{where}: must be an integer, got {value!r}")
        return int(value)
    return float(value)


def budget_caps(budget: Any, where: str) -> dict[tuple[str, str], float]:
    caps: dict[tuple[str, str], float] = {}
    for dimension, scopes in mapping(budget, where).items():
        if dimension == "extensions":
            continue
        if dimension not in DIMENSIONS:
            raise LimitsError(f"{where}: unknown budget dimension {dimension!r}")
        for scope, cap in mapping(scopes, f"{where}.{dimension}").items():
            if scope == "extensions":
                continue
            if scope not in SCOPES:
                raise LimitsError(f"{where}.{dimension}: unknown scope {scope!r}")
            caps[(dimension, scope)] = positive(cap, f"{where}.{dimension}.{scope}")  # type: ignore[assignment]
    return caps


def meters(
    caps: Mapping[tuple[str, str], float], persona: str | None, dimensions: tuple[str, ...], all_scopes: bool, warn_fraction: float
) -> tuple[Meter, ...]:
    out = []
    for dimension in dimensions:
        for scope in SCOPES:
            cap = caps.get((dimension, scope))
            if cap is None and not all_scopes:
                continue
            warn_at = cap * warn_fraction if cap is not None and persona is None else None
            out.append(Meter(scope, persona, dimension, cap, (scope, persona, dimension), warn_at))
    return tuple(out)


def tool_sets(tools: Any) -> tuple[frozenset[str], frozenset[str], dict[str, int], dict[str, frozenset[str]]]:
    if tools is None:
        return frozenset(), frozenset(), {}, {}
    if not isinstance(tools, list):
        raise LimitsError("tools: must be an array")
    names, confirm, sensitivity, categories = set(), set(), {}, {}
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise LimitsError(f"tools[{index}]: must be an object with a name")
        name = tool["name"]
        names.add(name)
        if tool.get("requires_confirmation") is True:
            confirm.add(name)
        classification = tool.get("data_classification")
        if isinstance(classification, Mapping):
            level = SENSITIVITY.get(classification.get("sensitivity"))  # type: ignore[arg-type]
            if level is not None:
                sensitivity[name] = level
            cats = classification.get("categories")
            if isinstance(cats, list):
                categories[name] = frozenset(c for c in cats if isinstance(c, str))
    return frozenset(names), frozenset(confirm), sensitivity, categories


def personas(sub_agents: Any, parent_tools: frozenset[str], warn_fraction: float) -> dict[str, Persona]:
    if sub_agents is None:
        return {}
    if not isinstance(sub_agents, list):
        raise LimitsError("permissions.sub_agents: must be an array")
    found: dict[str, Persona] = {}
    for index, entry in enumerate(sub_agents):
        where = f"permissions.sub_agents[{index}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise LimitsError(f"{where}: must be an object with a name")
        name = entry["name"]
        if name in found:
            raise LimitsError(f"{where}: duplicate persona name {name!r}")
        declared = entry.get("tools")
        if declared is not None and (not isinstance(declared, list) or not all(isinstance(t, str) for t in declared)):
            raise LimitsError(f"{where}.tools: must be an array of tool names")
        # §4.1: the persona's subset (or the parent's tools), never a tool the parent lacks
        tools = (frozenset(declared) if declared is not None else parent_tools) & parent_tools
        caps = budget_caps(entry.get("budget_share"), f"{where}.budget_share")
        found[name] = Persona(
            name,
            where,
            tools,
            positive(entry.get("max_parallel"), f"{where}.max_parallel", integer=True),  # type: ignore[arg-type]
            meters(caps, name, (TOKENS, COST), False, warn_fraction),
            meters(caps, name, (WALL_CLOCK,), False, warn_fraction),
        )
    return found


def delegation(member: Any) -> DelegationPolicy | None:
    if member is None:
        return None
    member = mapping(member, "permissions.delegation")
    for key in ("match", "deny"):
        value = member.get(key, [])
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise LimitsError(f"permissions.delegation.{key}: must be an array of identifier patterns")
    try:
        identities = patterns.pattern_set(member.get("match", []), member.get("deny", []), patterns.compile_identifier)
    except patterns.PatternError as exc:
        raise LimitsError(f"permissions.delegation: {exc}") from exc
    attenuation = mapping(member.get("attenuation"), "permissions.delegation.attenuation")
    return DelegationPolicy(
        identities,
        positive(member.get("max_depth"), "permissions.delegation.max_depth", integer=True),  # type: ignore[arg-type]
        attenuation.get("scopes_subset") is True,
        attenuation.get("budget_subset") is True,
    )


def triggers(oversight: Mapping[str, Any]) -> tuple[tuple[Trigger, ...], tuple[str, ...]]:
    structured, free_text = [], []
    raw = oversight.get("triggers", [])
    if not isinstance(raw, list):
        raise LimitsError("human_oversight.triggers: must be an array")
    for index, entry in enumerate(raw):
        where = f"human_oversight.triggers[{index}]"
        if isinstance(entry, str):
            free_text.append(entry)
            continue
        when = mapping(entry, where).get("when")
        if not isinstance(when, Mapping) or not when:
            raise LimitsError(f"{where}.when: must be an object with at least one predicate")
        unknown = set(when) - {"cost_usd_over", "data_classification_at_least", "tool", "path_matches"}
        if unknown:
            # an unknown predicate cannot be evaluated: refuse rather than ignore it
            raise LimitsError(f"{where}.when: unknown predicate(s) {sorted(unknown)}")
        level = when.get("data_classification_at_least")
        if level is not None and level not in SENSITIVITY:
            raise LimitsError(f"{where}.when.data_classification_at_least: unknown level {level!r}")
        tool = when.get("tool")
        if tool is not None and not isinstance(tool, str):
            raise LimitsError(f"{where}.when.tool: must be a tool name")
        path = when.get("path_matches")
        try:
            compiled_path = patterns.compile_path(path) if path is not None else None
        except patterns.PatternError as exc:
            raise LimitsError(f"{where}.when.path_matches: {exc}") from exc
        description = entry.get("description")
        structured.append(
            Trigger(
                where,
                description if isinstance(description, str) else where,
                positive(when.get("cost_usd_over"), f"{where}.when.cost_usd_over"),  # type: ignore[arg-type]
                SENSITIVITY[level] if level is not None else None,
                tool,
                compiled_path,
            )
        )
    return tuple(structured), tuple(free_text)


def baseline(member: Any) -> Baseline | None:
    if member is None:
        return None
    member = mapping(member, "anomaly_baseline")
    expected, shares = None, []
    if "expected_tools" in member:
        entries = member["expected_tools"]
        if not isinstance(entries, list):
            raise LimitsError("anomaly_baseline.expected_tools: must be an array")
        names = set()
        for index, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise LimitsError(f"anomaly_baseline.expected_tools[{index}]: must be an object with a name")
            names.add(entry["name"])
            share = entry.get("share")
            if share is not None:
                if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
                    raise LimitsError(f"anomaly_baseline.expected_tools[{index}].share: must be a number in [0, 1]")
                shares.append((entry["name"], float(share)))
        expected = frozenset(names)
    cost = mapping(member.get("cost_per_session_usd"), "anomaly_baseline.cost_per_session_usd")
    bounds = []
    for key in ("min", "max"):
        value = cost.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise LimitsError(f"anomaly_baseline.cost_per_session_usd.{key}: must be a non-negative number")
        bounds.append(None if value is None else float(value))
    classes = member.get("data_classes")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        raise LimitsError("anomaly_baseline.data_classes: must be an array of data classes")
    return Baseline(expected, tuple(shares), bounds[0], bounds[1], None if classes is None else frozenset(classes))
