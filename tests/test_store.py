"""The store contract, run against every backend (memory, SQLite, a real Redis)."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.policy.steps import CounterCharge
from governor.store import RollingWindow, Store, StoreUnavailable, UnknownReservation
from tests.store_backends import BACKENDS, open_backend, redis_url, store  # noqa: F401  (fixtures)

T0 = 1_699_999_980.0  # a bucket boundary (divisible by 60)
DAY_SEC = 86400.0

SESSION_TOKENS = ("per_session", None, "tokens")
DAY_TOKENS = ("per_day", None, "tokens")
DAY_COST = ("per_day", None, "cost_usd")


def charge(scope: str, dimension: str, amount: float, cap: float | None = None, persona: str | None = None):
    return CounterCharge(scope=scope, dimension=dimension, amount=amount, cap=cap, persona=persona)


def model_call(tokens: float, cost: float, *, session_cap=None, day_cap=None, cost_cap=None, persona=None):
    """What the policy engine charges for a model call: aggregate counters, plus the persona's."""
    charges = [
        charge("per_session", "tokens", tokens, session_cap),
        charge("per_day", "tokens", tokens, day_cap),
        charge("per_day", "cost_usd", cost, cost_cap),
    ]
    if persona:
        charges.append(charge("per_session", "tokens", tokens, None, persona))
    return charges


# --- reserve / commit / release -------------------------------------------------------


def test_reserve_holds_every_charge_until_commit_replaces_them(store: Store):
    r = store.reserve("agent", "s1", model_call(100, 0.5, session_cap=1000, day_cap=5000), T0)
    assert r.ok and r.id and r.failed is None
    assert store.snapshot("agent", "s1", T0) == {SESSION_TOKENS: 100, DAY_TOKENS: 100, DAY_COST: 0.5}

    store.commit(r.id, model_call(70, 0.25), T0 + 5)
    assert store.snapshot("agent", "s1", T0 + 5) == {SESSION_TOKENS: 70, DAY_TOKENS: 70, DAY_COST: 0.25}


def test_a_reservation_overshooting_any_one_cap_changes_nothing(store: Store):
    store.add("agent", "s1", model_call(400, 2.0), T0)
    before = store.snapshot("agent", "s1", T0)
    caps = {"session_cap": 1000, "day_cap": 1000, "cost_cap": 10.0}
    for name, tight in (("session_cap", 450), ("day_cap", 450), ("cost_cap", 2.5)):
        charges = model_call(100, 1.0, **{**caps, name: tight})
        r = store.reserve("agent", "s1", charges, T0 + 1)
        assert not r.ok and r.id is None
        assert r.failed is next(c for c in charges if c.cap == tight)
        assert r.observed == (2.0 if name == "cost_cap" else 400)
        assert r.key == {"session_cap": SESSION_TOKENS, "day_cap": DAY_TOKENS, "cost_cap": DAY_COST}[name]
        assert store.snapshot("agent", "s1", T0 + 1) == before


def test_a_cap_reached_exactly_is_admitted_and_then_full(store: Store):
    assert store.reserve("agent", "s1", [charge("per_session", "tokens", 300, 300)], T0).ok
    assert store.reserve("agent", "s1", [charge("per_session", "tokens", 0, 300)], T0).ok
    refused = store.reserve("agent", "s1", [charge("per_session", "tokens", 1, 300)], T0)
    assert not refused.ok and refused.observed == 300


def test_outstanding_reservations_count_against_caps(store: Store):
    first = store.reserve("agent", "s1", [charge("per_day", "tokens", 600, 1000)], T0)
    assert first.ok
    assert not store.reserve("agent", "s2", [charge("per_day", "tokens", 600, 1000)], T0).ok
    assert store.release(first.id)
    assert store.reserve("agent", "s2", [charge("per_day", "tokens", 600, 1000)], T0).ok


def test_float_costs_summing_to_the_cap_are_admitted(store: Store):
    # 0.1 ten times sums to 0.9999999999999999 or 1.0000000000000002 depending on order
    for i in range(10):
        assert store.reserve("agent", "s1", [charge("per_day", "cost_usd", 0.1, 1.0)], T0 + i).ok, i
    assert not store.reserve("agent", "s1", [charge("per_day", "cost_usd", 0.01, 1.0)], T0 + 10).ok


def test_several_charges_on_one_counter_are_checked_together(store: Store):
    charges = [charge("per_session", "tokens", 60, 100), charge("per_session", "tokens", 60, 1000)]
    r = store.reserve("agent", "s1", charges, T0)
    assert not r.ok and r.failed is charges[0] and r.observed == 0
    assert store.snapshot("agent", "s1", T0) == {}
    assert store.reserve("agent", "s1", [charge("per_session", "tokens", 60, 120)] * 2, T0).ok
    assert store.snapshot("agent", "s1", T0) == {SESSION_TOKENS: 120}


def test_release_drops_an_unused_reservation_once(store: Store):
    r = store.reserve("agent", "s1", model_call(100, 1.0), T0)
    assert store.release(r.id) is True
    assert store.snapshot("agent", "s1", T0) == {SESSION_TOKENS: 0, DAY_TOKENS: 0, DAY_COST: 0}
    assert store.release(r.id) is False
    assert store.release("never-made") is False
    with pytest.raises(UnknownReservation):
        store.commit(r.id, None, T0)


def test_commit_is_once_only_and_release_after_commit_is_a_no_op(store: Store):
    r = store.reserve("agent", "s1", model_call(100, 1.0), T0)
    store.commit(r.id, model_call(80, 0.75), T0 + 1)
    with pytest.raises(UnknownReservation) as raised:
        store.commit(r.id, model_call(80, 0.75), T0 + 2)
    assert raised.value.reservation_id == r.id
    assert store.release(r.id) is False
    assert store.snapshot("agent", "s1", T0 + 2) == {SESSION_TOKENS: 80, DAY_TOKENS: 80, DAY_COST: 0.75}


def test_commit_without_actual_keeps_the_reserved_amounts(store: Store):
    r = store.reserve("agent", "s1", model_call(100, 1.0), T0)
    store.commit(r.id, None, T0 + 1)
    assert store.snapshot("agent", "s1", T0 + 1) == {SESSION_TOKENS: 100, DAY_TOKENS: 100, DAY_COST: 1.0}


def test_actual_usage_is_recorded_even_past_the_cap(store: Store):
    r = store.reserve("agent", "s1", [charge("per_session", "tokens", 100, 150)], T0)
    store.commit(r.id, [charge("per_session", "tokens", 400, 150)], T0 + 1)
    assert store.snapshot("agent", "s1", T0 + 1) == {SESSION_TOKENS: 400}
    refused = store.reserve("agent", "s1", [charge("per_session", "tokens", 0, 150)], T0 + 2)
    assert not refused.ok and refused.observed == 400


def test_actual_usage_is_the_whole_usage(store: Store):
    r = store.reserve("agent", "s1", [charge("per_session", "tokens", 100), charge("per_day", "tokens", 100)], T0)
    store.commit(r.id, [charge("per_day", "tokens", 90), charge("per_session", "wall_clock_sec", 3.5)], T0 + 1)
    assert store.snapshot("agent", "s1", T0 + 1) == {
        SESSION_TOKENS: 0,  # reserved, not reported: zero
        ("per_session", None, "wall_clock_sec"): 3.5,  # reported, not reserved: created
        DAY_TOKENS: 90,
    }


def test_add_records_usage_whatever_the_caps(store: Store):
    store.add("agent", "s1", [charge("per_session", "wall_clock_sec", 50.0, 10.0)], T0)
    assert store.snapshot("agent", "s1", T0) == {("per_session", None, "wall_clock_sec"): 50.0}


def test_an_empty_reservation_is_a_reservation(store: Store):
    r = store.reserve("agent", "s1", [], T0)
    assert r.ok and r.id
    store.commit(r.id, [], T0)
    assert store.snapshot("agent", "s1", T0) == {}


# --- counter identity -----------------------------------------------------------------


def test_persona_counters_are_apart_from_the_aggregate(store: Store):
    spawn = [charge("per_session", "tokens", 300, 1000), charge("per_session", "tokens", 300, 400, "researcher")]
    assert store.reserve("agent", "s1", spawn, T0).ok
    # the persona's share is spent, the parent still has room
    r = store.reserve("agent", "s1", spawn, T0)
    assert not r.ok and r.failed.persona == "researcher" and r.observed == 300
    assert store.reserve("agent", "s1", [charge("per_session", "tokens", 300, 1000)], T0).ok
    # the aggregate is the ceiling for the whole fan-out
    other = [charge("per_session", "tokens", 500, 1000), charge("per_session", "tokens", 500, None, "writer")]
    r = store.reserve("agent", "s1", other, T0)
    assert not r.ok and r.failed.persona is None and r.observed == 600
    assert store.snapshot("agent", "s1", T0) == {
        SESSION_TOKENS: 600,
        ("per_session", "researcher", "tokens"): 300,
    }


def test_per_day_is_shared_by_an_agents_sessions_and_not_across_agents(store: Store):
    assert store.reserve("agent", "s1", [charge("per_day", "tokens", 700, 1000)], T0).ok
    r = store.reserve("agent", "s2", [charge("per_day", "tokens", 700, 1000)], T0 + 60)
    assert not r.ok and r.observed == 700
    assert store.reserve("other", "s3", [charge("per_day", "tokens", 700, 1000)], T0 + 60).ok
    assert store.snapshot("agent", "s2", T0 + 60, [DAY_TOKENS]) == {DAY_TOKENS: 700}
    assert store.snapshot("other", "s3", T0 + 60, [DAY_TOKENS]) == {DAY_TOKENS: 700}


def test_per_session_is_not_shared_across_sessions(store: Store):
    assert store.reserve("agent", "s1", [charge("per_session", "tokens", 700, 1000)], T0).ok
    assert store.reserve("agent", "s2", [charge("per_session", "tokens", 700, 1000)], T0).ok
    assert store.snapshot("agent", "s1", T0, [SESSION_TOKENS]) == {SESSION_TOKENS: 700}
    assert store.snapshot("agent", "s2", T0, [SESSION_TOKENS]) == {SESSION_TOKENS: 700}


def test_names_with_separators_do_not_collide(store: Store):
    names = [("a", "s", "p"), ("a:b", "s:x", "p|q"), ("1:a", "s|x", "q"), ("a", "s", "p|q")]
    for i, (agent, session, persona) in enumerate(names, start=1):
        usage = [charge("per_day", "tokens", i, None, persona), charge("per_session", "tokens", i)]
        store.add(agent, session, usage, T0)
    for i, (agent, session, persona) in enumerate(names, start=1):
        day = store.snapshot(agent, session, T0, [("per_day", persona, "tokens")])
        assert day == {("per_day", persona, "tokens"): i}
    assert store.snapshot("a", "s", T0, [SESSION_TOKENS]) == {SESSION_TOKENS: 1 + 4}
    assert store.snapshot("a:b", "s:x", T0)[("per_day", "p|q", "tokens")] == 2


def test_snapshot_of_named_keys_reports_zero_for_unused_counters(store: Store):
    keys = [SESSION_TOKENS, DAY_COST, ("per_day", "p", "wall_clock_sec")]
    assert store.snapshot("agent", "s1", T0, keys) == dict.fromkeys(keys, 0.0)


def test_charges_no_counter_can_be_made_of_are_rejected(store: Store):
    for bad in (
        charge("per_week", "tokens", 1),
        charge("per_day", "bananas", 1),
        charge("per_day", "tokens", -1),
        charge("per_day", "tokens", float("nan")),
        charge("per_day", "tokens", 1, float("inf")),
        charge("per_day", "tokens", 1, None, ""),
    ):
        with pytest.raises(ValueError):
            store.reserve("agent", "s1", [bad], T0)
    assert store.snapshot("agent", "s1", T0) == {}


def reserve_within_of(store: Store):
    """The store's own reserve_within, or the default (snapshot, then reserve) it would use."""
    from functools import partial

    from governor.store.base import reserve_within

    return getattr(store, "reserve_within", None) or partial(reserve_within, store)


def test_reserve_within_reads_the_counters_before_it_reserves(store: Store):
    reserve_within = reserve_within_of(store)
    store.add("agent", "s1", [charge("per_session", "tokens", 30)], T0)
    keys = [SESSION_TOKENS, DAY_TOKENS, DAY_COST, ("per_session", None, "wall_clock_sec")]
    counters, held = reserve_within("agent", "s1", keys, model_call(50, 0.5, session_cap=100), T0)
    assert held.ok and counters == {SESSION_TOKENS: 30, DAY_TOKENS: 0, DAY_COST: 0,
                                    ("per_session", None, "wall_clock_sec"): 0}
    counters, refused = reserve_within("agent", "s1", keys, model_call(21, 0.5, session_cap=100), T0)
    assert not refused.ok and refused.failed == charge("per_session", "tokens", 21, 100) and refused.observed == 80
    assert counters[SESSION_TOKENS] == 80 and store.snapshot("agent", "s1", T0, keys) == counters  # nothing held
    # a charge on a counter the keys do not name is still checked against its value
    counters, over = reserve_within("agent", "s1", [DAY_COST], [charge("per_session", "tokens", 21, 100)], T0)
    assert not over.ok and counters == {DAY_COST: 0.5}
    store.release(held.id)
    assert store.snapshot("agent", "s1", T0, [SESSION_TOKENS]) == {SESSION_TOKENS: 30}


def test_reserve_within_refuses_keys_and_charges_no_counter_can_be_made_of(store: Store):
    reserve_within = reserve_within_of(store)
    good = [charge("per_day", "tokens", 1)]
    for keys, charges in (
        ([("per_week", None, "tokens")], good),
        ([("per_day", "", "tokens")], good),
        ([DAY_TOKENS], [charge("per_day", "tokens", float("nan"))]),
        ([DAY_TOKENS], [charge("per_day", "tokens", -1)]),
        ([DAY_TOKENS], [charge("per_day", "bananas", 1)]),
    ):
        with pytest.raises(ValueError):
            reserve_within("agent", "s1", keys, charges, T0)
    assert store.snapshot("agent", "s1", T0) == {}


# --- the rolling 24 hours -------------------------------------------------------------


@pytest.mark.parametrize("offset", [0.0, 0.5, 59.999])
def test_usage_leaves_the_day_between_24h_and_24h_plus_a_bucket(store: Store, offset: float):
    t = T0 + offset
    store.add("agent", "s1", [charge("per_day", "tokens", 100)], t)
    bucket_end = T0 + 60  # the end of the bucket t falls in
    for when, expected in (
        (t, 100),
        (t + DAY_SEC - 1, 100),
        (t + DAY_SEC, 100),  # not before 24 hours have passed
        (bucket_end + DAY_SEC - 0.001, 100),  # the bucket overlaps the window
        (bucket_end + DAY_SEC, 0),  # and at most 24 hours and one bucket later, gone
        (t + DAY_SEC + 60, 0),
    ):
        assert store.snapshot("agent", "s1", when, [DAY_TOKENS]) == {DAY_TOKENS: expected}, when - t
    assert store.snapshot("agent", "s1", t + DAY_SEC + 60) == {}


def test_the_day_sums_usage_of_the_last_24_hours(store: Store):
    spread = [(T0 + h * 3600 + 17, float(h + 1)) for h in range(0, 48, 3)]
    for t, amount in spread:
        store.add("agent", "s1", [charge("per_day", "tokens", amount)], t)
        # counted while its bucket overlaps the last 24 hours
        live = sum(a for ts, a in spread if ts <= t and ts // 60 >= (t - DAY_SEC) // 60)
        assert store.snapshot("agent", "s1", t, [DAY_TOKENS]) == {DAY_TOKENS: live}


def test_a_day_cap_frees_up_as_usage_ages_out(store: Store):
    assert store.reserve("agent", "s1", [charge("per_day", "tokens", 900, 1000)], T0).ok
    assert not store.reserve("agent", "s2", [charge("per_day", "tokens", 200, 1000)], T0 + 12 * 3600).ok
    assert store.reserve("agent", "s2", [charge("per_day", "tokens", 200, 1000)], T0 + DAY_SEC + 60).ok


@pytest.mark.parametrize("kind", BACKENDS)
def test_usage_leaves_the_day_bucket_by_bucket(request: pytest.FixtureRequest, tmp_path: Path, kind: str):
    """A token every 20 s for 20 minutes, then 20 minutes of silence, in a 10-minute window."""
    store = open_backend(kind, tmp_path, request, RollingWindow(length=600.0, bucket=60.0))
    try:
        added: list[float] = []
        for step in range(120):
            t = T0 + 20 * step
            if step < 60:
                store.add("agent", "s1", [charge("per_day", "tokens", 1)], t)
                added.append(t)
            live = sum(1 for a in added if (a // 60 + 1) * 60 + 600 > t)  # its bucket overlaps the window
            assert store.snapshot("agent", "s1", t, [DAY_TOKENS]) == {DAY_TOKENS: live}, step
        assert live == 0
    finally:
        store.close()


@pytest.mark.parametrize("commit_after", [600.0, DAY_SEC])
def test_committed_usage_is_dated_at_its_reservation(store: Store, commit_after: float):
    r = store.reserve("agent", "s1", [charge("per_day", "tokens", 100)], T0)
    store.commit(r.id, [charge("per_day", "tokens", 150)], T0 + commit_after)
    assert store.snapshot("agent", "s1", T0 + DAY_SEC, [DAY_TOKENS]) == {DAY_TOKENS: 150}
    assert store.snapshot("agent", "s1", T0 + DAY_SEC + 60, [DAY_TOKENS]) == {DAY_TOKENS: 0}


def test_settling_a_reservation_older_than_the_window_leaves_no_negative_counter(store: Store):
    r = store.reserve("agent", "s1", [charge("per_day", "tokens", 100), charge("per_session", "tokens", 100)], T0)
    store.add("agent", "s1", [charge("per_day", "tokens", 5)], T0 + 2 * DAY_SEC)  # evicts the old bucket
    assert store.release(r.id)
    assert store.snapshot("agent", "s1", T0 + 2 * DAY_SEC) == {SESSION_TOKENS: 0, DAY_TOKENS: 5}

    r = store.reserve("agent", "s1", [charge("per_day", "tokens", 100), charge("per_session", "tokens", 100)], T0)
    store.commit(r.id, [charge("per_day", "tokens", 80), charge("per_session", "tokens", 80)], T0 + 2 * DAY_SEC)
    assert store.snapshot("agent", "s1", T0 + 2 * DAY_SEC) == {SESSION_TOKENS: 80, DAY_TOKENS: 5}


# --- lost reservations, sessions ------------------------------------------------------


def test_settled_reservations_keep_counting_and_are_forgotten(store: Store):
    old = store.reserve("agent", "s1", model_call(100, 1.0), T0)
    new = store.reserve("agent", "s1", model_call(10, 0.5), T0 + 300)
    assert store.settle_reservations(before=T0 + 300) == 1
    assert store.snapshot("agent", "s1", T0 + 300) == {SESSION_TOKENS: 110, DAY_TOKENS: 110, DAY_COST: 1.5}
    with pytest.raises(UnknownReservation):
        store.commit(old.id, None, T0 + 301)
    assert store.release(new.id)
    assert store.settle_reservations(before=T0 + 1000) == 0


def test_session_state_round_trips(store: Store):
    assert store.load_session("s1") is None and store.list_sessions() == []
    state = {"iterations": 3, "personas": {"researcher": {"active": 1}}, "window": ["a", "b"], "ok": True}
    store.save_session("s2", {"iterations": 0})
    store.save_session("s1", state)
    state["iterations"] = 99  # the caller's later edits are not the saved state
    assert store.load_session("s1") == {**state, "iterations": 3}
    store.save_session("s1", {"iterations": 4})
    assert store.load_session("s1") == {"iterations": 4}
    assert store.list_sessions() == ["s1", "s2"]


def test_session_state_must_be_json(store: Store):
    with pytest.raises(TypeError, match="JSON"):
        store.save_session("s1", {"when": object()})
    assert store.load_session("s1") is None


def test_deleting_a_session_forgets_its_state_counters_and_reservations(store: Store):
    store.save_session("s1", {"iterations": 1})
    store.save_session("s2", {"iterations": 2})
    open_one = store.reserve("agent", "s1", model_call(100, 1.0), T0)
    kept = store.reserve("agent", "s2", model_call(10, 0.25), T0)
    assert store.delete_session("s1") is True
    assert store.load_session("s1") is None and store.list_sessions() == ["s2"]
    assert store.snapshot("agent", "s1", T0) == {DAY_TOKENS: 110, DAY_COST: 1.25}  # per-day keeps counting
    assert store.release(open_one.id) is False
    assert store.release(kept.id) is True
    assert store.delete_session("s1") is False


# --- nonces ---------------------------------------------------------------------------


def test_a_nonce_is_taken_once_within_its_ttl(store: Store):
    store.put_nonce("n1", expires_at=T0 + 300, now=T0)
    assert store.take_nonce("n1", T0 + 10) is True
    assert store.take_nonce("n1", T0 + 11) is False
    assert store.take_nonce("never-issued", T0) is False


def test_an_expired_nonce_is_refused_and_consumed(store: Store):
    store.put_nonce("n1", expires_at=T0 + 300, now=T0)
    assert store.take_nonce("n1", T0 + 300) is False
    store.put_nonce("n2", expires_at=T0 + 300, now=T0)
    store.put_nonce("n2", expires_at=T0 + 600, now=T0 + 100)  # re-issued: new expiry
    assert store.take_nonce("n2", T0 + 400) is True


def test_a_closed_store_fails_closed(store: Store):
    store.save_session("s1", {})
    store.close()
    with pytest.raises(StoreUnavailable):
        store.reserve("agent", "s1", model_call(1, 0.0), T0)
    with pytest.raises(StoreUnavailable):
        store.load_session("s1")


# --- extend: a stream's reservation grown as its usage passes it ------------------------


def test_extend_grows_a_reservation_within_every_cap(store: Store):
    r = store.reserve("agent", "s1", model_call(100, 0.5, session_cap=1000, day_cap=5000), T0)
    grown = store.extend(r.id, model_call(300, 1.5, session_cap=1000, day_cap=5000), T0 + 1)
    assert grown.ok and grown.id == r.id
    assert store.snapshot("agent", "s1", T0 + 1) == {SESSION_TOKENS: 400, DAY_TOKENS: 400, DAY_COST: 2.0}
    # the grown amounts are part of the reservation: release takes all of them off
    assert store.release(r.id)
    assert store.snapshot("agent", "s1", T0 + 2, [SESSION_TOKENS, DAY_TOKENS]) == {SESSION_TOKENS: 0,
                                                                                    DAY_TOKENS: 0}


def test_commit_replaces_a_grown_reservation_by_the_actual_usage(store: Store):
    r = store.reserve("agent", "s1", model_call(100, 0.5, session_cap=1000), T0)
    assert store.extend(r.id, model_call(200, 1.0, session_cap=1000), T0 + 1).ok
    store.commit(r.id, model_call(250, 1.25), T0 + 2)
    assert store.snapshot("agent", "s1", T0 + 2) == {SESSION_TOKENS: 250, DAY_TOKENS: 250, DAY_COST: 1.25}


def test_an_extension_past_a_cap_is_refused_and_changes_nothing(store: Store):
    a = store.reserve("agent", "s1", model_call(600, 1.0, session_cap=1000), T0)
    b = store.reserve("agent", "s1", model_call(300, 1.0, session_cap=1000), T0)
    before = store.snapshot("agent", "s1", T0)
    refused = store.extend(a.id, model_call(101, 0.1, session_cap=1000), T0 + 1)
    assert not refused.ok and refused.id is None
    assert refused.key == SESSION_TOKENS and refused.observed == 900
    assert store.snapshot("agent", "s1", T0 + 1) == before
    assert store.extend(a.id, model_call(100, 0.1, session_cap=1000), T0 + 1).ok  # exactly to the cap
    assert store.snapshot("agent", "s1", T0 + 1, [SESSION_TOKENS]) == {SESSION_TOKENS: 1000}
    store.release(b.id)
    store.commit(a.id, None, T0 + 2)  # as reserved: 600 + 100
    assert store.snapshot("agent", "s1", T0 + 2, [SESSION_TOKENS]) == {SESSION_TOKENS: 700}


def test_an_extension_may_draw_on_counters_the_reservation_did_not(store: Store):
    r = store.reserve("agent", "s1", [charge("per_session", "tokens", 10, 100)], T0)
    assert store.extend(r.id, [charge("per_session", "tokens", 5, 100), charge("per_day", "tokens", 15, 100)],
                        T0).ok
    assert store.snapshot("agent", "s1", T0) == {SESSION_TOKENS: 15, DAY_TOKENS: 15}
    assert store.release(r.id)
    assert store.snapshot("agent", "s1", T0, [SESSION_TOKENS, DAY_TOKENS]) == {SESSION_TOKENS: 0, DAY_TOKENS: 0}


def test_extending_a_reservation_not_outstanding_raises(store: Store):
    r = store.reserve("agent", "s1", model_call(10, 0.1), T0)
    store.commit(r.id, None, T0)
    with pytest.raises(UnknownReservation):
        store.extend(r.id, model_call(10, 0.1), T0)
    with pytest.raises(UnknownReservation):
        store.extend("never-made", model_call(10, 0.1), T0)
