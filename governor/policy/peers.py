"""Runtime §4.2: may the agent delegate to this separately identified peer?

Checks, each gating the next, first failure wins:

1. verified      the step carries the peer's passport and the Trust Protocol verified
                 it; otherwise `unverified_peer`.
2. declared      the passport declares permissions.delegation; otherwise
                 `no_delegation_declared` (deny by default).
3. identity      peer_id against deny then match (§4.4 identifier patterns): a deny
                 match is `identity_denied`, no match is `identity_not_matched`; a
                 peer passport whose `id` differs from peer_id is `peer_id_mismatch`.
4. depth         chain_depth > max_depth is `max_depth_exceeded` (no max_depth: no
                 depth limit).
5. attenuation   scopes_subset: the peer's security.authentication.scopes must be a
                 subset of ours (ours undeclared = empty). budget_subset: for every cap
                 we declare, the peer must declare the same (dimension, scope) at or
                 below it; a peer without that cap is unbounded there and fails; a cap
                 the peer declares and we do not is within our (unbounded) envelope.
                 Failure is `attenuation_failed`, with the offending scopes and caps.
"""

from __future__ import annotations

from typing import Any, Mapping

from governor.policy.limits import DelegationPolicy, LimitsError
from governor.policy.passport_members import budget_caps
from governor.policy.steps import Delegation


def _peer_scopes(passport: Mapping[str, Any]) -> set[str]:
    security = passport.get("security")
    authentication = security.get("authentication") if isinstance(security, Mapping) else None
    scopes = authentication.get("scopes") if isinstance(authentication, Mapping) else None
    return {s for s in scopes if isinstance(s, str)} if isinstance(scopes, (list, tuple)) else set()


def _peer_budget(passport: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    permissions = passport.get("permissions")
    limits = permissions.get("resource_limits") if isinstance(permissions, Mapping) else None
    budget = limits.get("budget") if isinstance(limits, Mapping) else None
    return budget_caps(budget, "peer permissions.resource_limits.budget")


def admit_peer(
    policy: DelegationPolicy | None,
    own_scopes: frozenset[str],
    own_budget: Mapping[tuple[str, str], float],
    step: Delegation,
) -> tuple[str | None, dict[str, Any]]:
    """(None, detail) when admitted, else (reason, detail); detail is for the record."""
    detail: dict[str, Any] = {"peer": step.peer_id, "chain_depth": step.chain_depth}
    if step.peer_url:
        detail["peer_url"] = step.peer_url
    passport = step.peer_passport
    if not step.peer_verified or not isinstance(passport, Mapping):
        return "unverified_peer", detail
    if policy is None:
        return "no_delegation_declared", detail
    verdict = policy.identities.evaluate(step.peer_id)
    detail["matched_rule"] = verdict.rule
    if not verdict.allowed:
        return ("identity_denied" if verdict.rule else "identity_not_matched"), detail
    peer_id = passport.get("id")
    if isinstance(peer_id, str) and peer_id != step.peer_id:
        detail["peer_passport_id"] = peer_id
        return "peer_id_mismatch", detail
    if policy.max_depth is not None:
        detail["max_depth"] = policy.max_depth
        if step.chain_depth > policy.max_depth:
            return "max_depth_exceeded", detail
    attenuation: dict[str, Any] = {}
    failed = False
    if policy.scopes_subset:
        excess = sorted(_peer_scopes(passport) - own_scopes)
        attenuation["scopes_subset"] = {"ok": not excess, "excess_scopes": excess}
        failed |= bool(excess)
    if policy.budget_subset:
        try:
            peer_caps = _peer_budget(passport)
        except LimitsError as exc:
            attenuation["budget_subset"] = {"ok": False, "error": str(exc)}
            failed = True
        else:
            over = []
            for (dimension, scope), ours in sorted(own_budget.items()):
                theirs = peer_caps.get((dimension, scope))
                if theirs is None or theirs > ours:
                    over.append({"dimension": dimension, "scope": scope, "peer": theirs, "limit": ours})
            attenuation["budget_subset"] = {"ok": not over, "exceeding": over}
            failed |= bool(over)
    if attenuation:
        detail["attenuation"] = attenuation
    return ("attenuation_failed" if failed else None), detail
