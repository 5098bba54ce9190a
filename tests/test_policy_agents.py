"""Runtime §4: sub-agent personas (§4.1) and peer delegation (§4.2)."""

from __future__ import annotations

import pytest

from governor.policy import (
    ON_DELEGATION_ADMITTED,
    ON_DELEGATION_DENIED,
    ON_ITERATION_LIMIT,
    ON_SUB_AGENT_DENIED,
    ON_SUB_AGENT_ENDED,
    ON_SUB_AGENT_SPAWNED,
    Action,
    Delegation,
    LimitsError,
    ModelCall,
    PersonaExit,
    PersonaSpawn,
    StepDone,
    Tier,
    ToolCall,
)
from tests.test_policy_support import Driver, passport, tools, with_runtime


def _personas(*entries, parent_tools=("search", "read_file", "write_file"), **permissions):
    return passport(tools=tools(*parent_tools), permissions={"sub_agents": list(entries), **permissions})


# --- §4.1 personas -------------------------------------------------------------------


def test_s4_1_undeclared_persona_is_denied():
    driver = Driver(_personas({"name": "helper"}))
    decision = driver.run(PersonaSpawn("stranger"))
    assert decision.halts and decision.cause == ON_SUB_AGENT_DENIED and decision.fail_closed
    assert decision.details["reason"] == "undeclared_persona" and decision.details["persona"] == "stranger"
    assert "stranger" not in driver.state.personas_live


def test_s4_1_model_call_by_undeclared_persona_is_denied():
    decision = Driver(_personas({"name": "helper"})).run(ModelCall("gpt-4o", 1, 1, persona="stranger"))
    assert decision.cause == ON_SUB_AGENT_DENIED


def test_s4_1_persona_never_gets_tool_parent_lacks():
    driver = Driver(_personas({"name": "helper", "tools": ["search", "shell"]}))
    spawn = driver.run(PersonaSpawn("helper"))
    assert spawn.action is Action.PERMIT and spawn.allowed_tools == frozenset({"search"})
    assert driver.run(ModelCall("gpt-4o", 1, 1, persona="helper")).allowed_tools == frozenset({"search"})
    decision = driver.run(ToolCall("shell", {"cmd": "ls"}, persona="helper"))
    assert decision.cause == ON_SUB_AGENT_DENIED and decision.details["reason"] == "tool_not_granted"
    assert decision.details["allowed_tools"] == ["search"]


def test_s4_1_persona_tools_default_to_the_parents():
    spawn = Driver(_personas({"name": "helper"})).run(PersonaSpawn("helper"))
    assert spawn.allowed_tools == frozenset({"search", "read_file", "write_file"})


def test_s4_1_parent_without_tools_grants_none():
    doc = passport(permissions={"sub_agents": [{"name": "helper", "tools": ["search"]}]})
    assert Driver(doc).run(PersonaSpawn("helper")).allowed_tools == frozenset()


def test_s4_1_persona_tool_call_inside_its_set_is_permitted():
    driver = Driver(_personas({"name": "helper", "tools": ["search"]}))
    assert driver.run(ToolCall("search", {"q": 1}, persona="helper")).action is Action.PERMIT


def test_s4_1_tool_denial_resolves_on_sub_agent_denied_as_declared():
    doc = with_runtime(_personas({"name": "helper", "tools": ["search"]}),
                       degradation={"on_sub_agent_denied": {"action": "fallback", "message": "not yours"}})
    decision = Driver(doc).run(ToolCall("write_file", {}, persona="helper"))
    assert decision.action is Action.FALLBACK and decision.fallback_message == "not yours"
    assert decision.event["detail"]["matched_rule"] == "permissions.sub_agents[0]"


def test_s4_1_max_parallel():
    driver = Driver(_personas({"name": "helper", "max_parallel": 2}))
    assert driver.run(PersonaSpawn("helper")).action is Action.PERMIT
    assert driver.run(PersonaSpawn("helper")).action is Action.PERMIT
    decision = driver.decide(PersonaSpawn("helper"))
    assert decision.cause == ON_SUB_AGENT_DENIED and decision.details["reason"] == "max_parallel"
    assert (decision.details["observed"], decision.details["limit"]) == (2, 2)
    driver.run(PersonaExit("helper"))  # one instance finished: a slot is free again
    assert driver.run(PersonaSpawn("helper")).action is Action.PERMIT


def test_s4_1_parent_max_concurrent_caps_all_personas():
    doc = _personas({"name": "a"}, {"name": "b"}, resource_limits={"max_concurrent": 2})
    driver = Driver(doc)
    driver.run(PersonaSpawn("a"))
    driver.run(PersonaSpawn("b"))
    decision = driver.run(PersonaSpawn("a"))
    assert decision.cause == ON_SUB_AGENT_DENIED and decision.details["reason"] == "max_concurrent"


def test_s4_1_spawn_decision_names_the_matched_rule():
    decision = Driver(_personas({"name": "x"}, {"name": "helper"})).run(PersonaSpawn("helper"))
    assert decision.details["matched_rule"] == "permissions.sub_agents[1]"
    assert decision.details["persona"] == "helper" and "draw_down" in decision.details


def test_s4_1_r1_records_prospective_spawn_without_blocking():
    driver = Driver(_personas({"name": "helper"}), tier=Tier.R1)
    decision = driver.run(PersonaSpawn("stranger"))
    observed, spawned = decision.events
    assert not decision.blocks and observed["detail"]["would"] == "halt"
    assert spawned["cause"] == ON_SUB_AGENT_SPAWNED  # it went ahead, and the record says so


def test_s4_1_5_a_permitted_spawn_and_its_end_are_recorded():
    driver = Driver(_personas({"name": "helper", "max_parallel": 2}))
    spawn = driver.run(PersonaSpawn("helper", instance="a1"))
    assert spawn.action is Action.PERMIT and not spawn.blocks
    [event] = spawn.events
    assert (event["cause"], event["action"]) == (ON_SUB_AGENT_SPAWNED, "continue")
    detail = event["detail"]
    assert detail["decision"] == "permit" and "overridden_cause" not in detail  # it overrode nothing
    assert (detail["persona"], detail["instance"], detail["live"], detail["max_parallel"]) == ("helper", "a1", 1, 2)
    assert detail["matched_rule"] == "permissions.sub_agents[0]" and "draw_down" in detail
    ended = driver.run(PersonaExit("helper", instance="a1", reason="idle", lived_sec=1.5))
    [event] = ended.events
    assert (event["cause"], event["action"]) == (ON_SUB_AGENT_ENDED, "continue")
    assert (event["detail"]["reason"], event["detail"]["live"], event["detail"]["lived_sec"]) == ("idle", 0, 1.5)
    assert "helper" not in driver.state.personas_live


def test_s4_1_5_a_refused_spawn_records_only_the_refusal():
    driver = Driver(_personas({"name": "helper", "max_parallel": 1}))
    driver.run(PersonaSpawn("helper"))
    refused = driver.run(PersonaSpawn("helper"))
    assert refused.blocks and [e["cause"] for e in refused.events] == [ON_SUB_AGENT_DENIED]


def test_s4_1_duplicate_persona_names_refuse_the_passport():
    with pytest.raises(LimitsError, match="duplicate persona name 'a'"):
        Driver(_personas({"name": "a"}, {"name": "a"}))


def test_max_concurrent_counts_steps_in_flight_until_done():
    driver = Driver(passport(tools=tools("search"), permissions={"resource_limits": {"max_concurrent": 2}}))
    driver.run(ModelCall("gpt-4o", 1, 1))
    driver.run(ToolCall("search", {"q": 1}))
    decision = driver.decide(ToolCall("search", {"q": 2}))
    assert decision.cause == ON_ITERATION_LIMIT and decision.details["limit_name"] == "max_concurrent"
    driver.run(StepDone("tool"))
    assert driver.run(ToolCall("search", {"q": 2})).action is Action.PERMIT


def test_tool_invocation_parallel_false_allows_one_tool_at_a_time():
    driver = Driver(with_runtime(passport(tools=tools("search")), tool_invocation={"parallel": False}))
    driver.run(ToolCall("search", {"q": 1}))
    assert driver.decide(ToolCall("search", {"q": 2})).details["limit_name"] == "tool_invocation.max_concurrent"
    driver.run(StepDone("tool"))
    assert driver.run(ToolCall("search", {"q": 2})).action is Action.PERMIT


# --- §4.2 peers ----------------------------------------------------------------------

PEER = "https://partners.example/agents/helper"


def _delegating(**delegation):
    return passport(
        permissions={
            "delegation": {"match": ["https://partners.example/agents/*"], **delegation},
            "resource_limits": {"budget": {"tokens": {"per_session": 1000, "per_day": 5000}}},
        },
        security={"authentication": {"type": "oauth2", "scopes": ["read", "write"]}},
    )


def _peer(scopes=("read",), tokens=None, peer_id=PEER):
    document = passport(id=peer_id, security={"authentication": {"type": "oauth2", "scopes": list(scopes)}})
    if tokens is not None:
        document["permissions"] = {"resource_limits": {"budget": {"tokens": tokens}}}
    return document


def _delegate(driver, peer_id=PEER, passport_doc=None, verified=True, depth=1):
    return driver.run(Delegation(peer_id, passport_doc if passport_doc is not None else _peer(peer_id=peer_id), verified, depth))


def test_s4_2_admitted_peer_records_the_matched_rule():
    decision = _delegate(Driver(_delegating()))
    assert decision.action is Action.PERMIT
    assert decision.details["matched_rule"] == "match:https://partners.example/agents/*"
    assert decision.details["peer"] == PEER


def test_s4_2_5_an_admitted_delegation_is_recorded():
    decision = _delegate(Driver(_delegating()))
    [event] = decision.events
    assert (event["cause"], event["action"]) == (ON_DELEGATION_ADMITTED, "continue")
    detail = event["detail"]
    assert (detail["decision"], detail["peer"], detail["chain_depth"]) == ("permit", PEER, 1)
    assert detail["matched_rule"] == "match:https://partners.example/agents/*" and "overridden_cause" not in detail
    denied = _delegate(Driver(_delegating()), verified=False)
    assert [e["cause"] for e in denied.events] == [ON_DELEGATION_DENIED]  # a refusal is not also an admission
    by_persona = Driver(_delegating()).run(Delegation(PEER, _peer(), True, 1, persona="scout"))
    assert by_persona.event["detail"]["persona"] == "scout"  # §8.3: attributed to the persona
    refused = Driver(_delegating()).run(Delegation(PEER, None, False, 1, persona="scout"))
    assert refused.event["detail"]["persona"] == "scout"


def test_s4_2_unverified_peer_passport_is_denied():
    decision = _delegate(Driver(_delegating()), verified=False)
    assert decision.cause == ON_DELEGATION_DENIED and decision.details["reason"] == "unverified_peer"
    missing = Driver(_delegating()).run(Delegation(PEER, None, True, 1))
    assert missing.details["reason"] == "unverified_peer"


def test_s4_2_deny_overrides_match():
    decision = _delegate(Driver(_delegating(deny=[PEER])))
    assert decision.cause == ON_DELEGATION_DENIED and decision.details["reason"] == "identity_denied"
    assert decision.details["matched_rule"] == f"deny:{PEER}"


def test_s4_2_identifier_matching_no_pattern_is_denied():
    other = "https://elsewhere.example/agents/helper"
    decision = _delegate(Driver(_delegating()), peer_id=other)
    assert decision.details["reason"] == "identity_not_matched" and decision.details["matched_rule"] is None


def test_s4_2_no_delegation_member_denies_every_peer():
    decision = _delegate(Driver(passport()))
    assert decision.cause == ON_DELEGATION_DENIED and decision.details["reason"] == "no_delegation_declared"


def test_s4_2_peer_passport_must_be_the_peer_named():
    decision = _delegate(Driver(_delegating()), passport_doc=_peer(peer_id="https://partners.example/agents/other"))
    assert decision.details["reason"] == "peer_id_mismatch"


def test_s4_2_max_depth_relative_to_the_chain_root():
    driver = Driver(_delegating(max_depth=2))
    assert _delegate(driver, depth=2).action is Action.PERMIT
    decision = _delegate(driver, depth=3)
    assert decision.details["reason"] == "max_depth_exceeded" and decision.details["max_depth"] == 2


def test_s4_2_scopes_subset():
    driver = Driver(_delegating(attenuation={"scopes_subset": True}))
    assert _delegate(driver, passport_doc=_peer(scopes=("read",))).action is Action.PERMIT
    decision = _delegate(driver, passport_doc=_peer(scopes=("read", "admin")))
    assert decision.details["reason"] == "attenuation_failed"
    assert decision.details["attenuation"]["scopes_subset"] == {"ok": False, "excess_scopes": ["admin"]}


def test_s4_2_budget_subset():
    driver = Driver(_delegating(attenuation={"budget_subset": True}))
    within = _peer(tokens={"per_session": 500, "per_day": 5000})
    assert _delegate(driver, passport_doc=within).action is Action.PERMIT
    over = _delegate(driver, passport_doc=_peer(tokens={"per_session": 2000, "per_day": 100}))
    assert over.details["attenuation"]["budget_subset"]["exceeding"] == [
        {"dimension": "tokens", "scope": "per_session", "peer": 2000.0, "limit": 1000.0}
    ]
    # a peer without a cap we declare is unbounded there: not a subset
    # (a denial halts the session: a fresh one for the next case)
    fresh = Driver(_delegating(attenuation={"budget_subset": True}))
    unbounded = _delegate(fresh, passport_doc=_peer(tokens={"per_session": 10}))
    assert unbounded.details["attenuation"]["budget_subset"]["exceeding"] == [
        {"dimension": "tokens", "scope": "per_day", "peer": None, "limit": 5000.0}
    ]


def test_s4_2_peer_cap_we_do_not_declare_is_within_our_envelope():
    driver = Driver(_delegating(attenuation={"budget_subset": True}))
    peer = _peer(tokens={"per_session": 500, "per_day": 5000})
    peer["permissions"]["resource_limits"]["budget"]["cost_usd"] = {"per_day": 99}
    assert _delegate(driver, passport_doc=peer).action is Action.PERMIT


def test_s4_2_denial_resolves_on_delegation_denied_as_declared():
    doc = with_runtime(_delegating(), degradation={"on_delegation_denied": {"action": "fallback", "message": "no"}})
    decision = _delegate(Driver(doc), verified=False)
    assert decision.action is Action.FALLBACK and decision.event["cause"] == ON_DELEGATION_DENIED
    assert decision.event["detail"]["peer"] == PEER


def test_s4_2_r1_records_what_the_admission_would_be():
    decision = _delegate(Driver(_delegating(), tier=Tier.R1), verified=False)
    assert not decision.blocks and decision.event["detail"]["would"] == "halt"


def test_s4_2_bad_identifier_pattern_refuses_the_passport():
    with pytest.raises(LimitsError, match="whole segment"):
        Driver(passport(permissions={"delegation": {"match": ["https://x/agents/a**"]}}))


# --- the agent's own declared tools (Core §8.1) --------------------------------------


def test_s4_1_agent_never_calls_a_tool_it_did_not_declare():
    from governor.policy import ON_TOOL_DENIED

    driver = Driver(passport(tools=tools("search", "read_file")))
    denied = driver.run(ToolCall(tool="shell", arguments={"cmd": "rm -rf /"}))
    assert denied.halts and denied.cause == ON_TOOL_DENIED and denied.fail_closed
    assert denied.details["reason"] == "tool_not_declared"
    assert denied.event["cause"] == ON_TOOL_DENIED and denied.event["action"] == "halt"
    after = driver.run(ToolCall(tool="search", arguments={}))  # after the halt, nothing goes ahead
    assert after.halts and after.details["halt_cause"] == ON_TOOL_DENIED


def test_s4_1_undeclared_tool_resolves_the_declared_response():
    from governor.policy import ON_TOOL_DENIED

    document = with_runtime(passport(tools=tools("search")), degradation={
        "on_governor_tool_denied": {"action": "fallback", "value": {"error": "tool_not_declared"}}})
    driver = Driver(document)
    refused = driver.run(ToolCall(tool="shell", arguments={}))
    assert refused.action is Action.FALLBACK and refused.cause == ON_TOOL_DENIED and not refused.halts
    assert refused.fallback_value == {"error": "tool_not_declared"}
    assert not driver.run(ToolCall(tool="search", arguments={"q": "x"})).blocks  # the session goes on


def test_s4_1_undeclared_tool_is_only_observed_at_r1():
    driver = Driver(passport(tools=tools("search")), tier=Tier.R1)
    observed = driver.run(ToolCall(tool="shell", arguments={}))
    assert not observed.blocks and observed.event["detail"]["observed_only"] is True


def test_s4_1_a_passport_without_tools_names_none_to_refuse():
    assert not Driver(passport()).run(ToolCall(tool="anything", arguments={})).blocks


def test_s4_2_scopes_subset_holds_for_a_frozen_peer_passport():
    # a pinned passport's read-only view carries tuples, not lists: still checked
    from governor.passport import PinnedPassport

    driver = Driver(_delegating(attenuation={"scopes_subset": True}))
    frozen = PinnedPassport(_peer(scopes=("read", "admin"))).frozen
    decision = _delegate(driver, passport_doc=frozen)
    assert decision.details["reason"] == "attenuation_failed"
