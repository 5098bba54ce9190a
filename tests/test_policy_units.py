"""Per-modality prices in the pure decision point: steps carry units (images, audio seconds,
characters) that the pricing table prices per piece; an image or audio call reserves and is
charged its cost against the cost caps and counts against the iteration cap; a unit its
model does not price is refused under a cost cap, with a reason that says which."""

from __future__ import annotations

import pytest

from governor.runtime.prices import price_book
from governor.adapters.refusals import describe
from governor.policy import decide
from governor.policy.compiling import compile_limits
from governor.policy.pricing import PricingError, default_pricing_path, load_pricing, pricing_from_mapping
from governor.policy.reasons import governor_object
from governor.policy.state import SessionState
from governor.policy.steps import Action, ModelCall, Tier, UsageReport

PRICES = price_book()
HD = (("image/1024x1024/hd", 2),)


def limits(cost: float | None = 1.0, iterations: int | None = None, tokens: int | None = None):
    budget = {}
    if cost is not None:
        budget["cost_usd"] = {"per_session": cost}
    if tokens is not None:
        budget["tokens"] = {"per_session": tokens}
    document = {"permissions": {"resource_limits": {"budget": budget}}}
    if iterations is not None:
        document["runtime"] = {"tool_invocation": {"max_iterations": iterations}}
    return compile_limits(document, tier=Tier.R2, pricing=PRICES)


def state(**counters) -> SessionState:
    return SessionState(session="s", started_at=0.0).with_counters(
        {("per_session", None, key): value for key, value in counters.items()})


def charged(decision, dimension: str) -> float:
    return sum(c.amount for c in decision.charges if c.dimension == dimension and c.scope == "per_session")


def test_units_are_priced_per_piece_and_tokens_beside_them():
    assert PRICES.cost("dall-e-3", 0, 0, 0, HD) == pytest.approx(0.16)
    assert PRICES.cost("whisper-1", 0, 0, 0, (("audio_second", 60),)) == pytest.approx(0.006)
    assert PRICES.cost("tts-1", 0, 0, 0, (("character", 1_000_000),)) == pytest.approx(15.0)
    # a unit the family does not price makes the whole cost unknown
    assert PRICES.cost("dall-e-3", 0, 0, 0, (("image/4096x4096/hd", 1),)) is None
    assert PRICES.unpriced_unit("dall-e-3", (("image/1024x1024/hd", 1), ("image/4096x4096/hd", 1))) == \
        "image/4096x4096/hd"
    # nothing consumed costs nothing, priced or not (free steps); anything consumed unpriced is unknown
    assert PRICES.cost("acme-moderation", 0, 0) == 0.0
    assert PRICES.cost("acme-moderation", 1, 0) is None
    assert PRICES.cost("acme-images", 0, 0, 0, HD) is None


def test_a_table_prices_units_and_refuses_malformed_ones():
    table = pricing_from_mapping({"models": {"img": {"units": {"image/1x1/standard": 0.5}},
                                             "tok": {"input": 1, "output": 2, "units": {"character": 0.001}}}})
    assert table.cost("img", 1000, 1000, 0, (("image/1x1/standard", 2),)) == 1.0  # unit-only: tokens free
    assert table.cost("tok", 1_000_000, 0, 0, (("character", 10),)) == pytest.approx(1.01)
    for bad in ({"units": {}}, {"units": {"Image": 1}}, {"units": {"x": -1}}, {"units": {"x": "1"}},
                {"units": ["x"]}, {"input": 1, "units": {"x": True}}):
        with pytest.raises(PricingError):
            pricing_from_mapping({"models": {"m": bad}})


def test_an_image_call_reserves_and_settles_its_units_against_the_cost_cap():
    call = ModelCall("dall-e-3", 0, 0, provider="openai", units=HD)
    decision = decide(limits(cost=1.0), state(), call, 1.0)
    assert decision.action is Action.PERMIT
    assert charged(decision, "cost_usd") == pytest.approx(0.16) and charged(decision, "tokens") == 0
    refused = decide(limits(cost=1.0), state(cost_usd=0.9), call, 1.0)
    assert refused.action is Action.HALT and refused.cause == "on_budget_exhausted"
    assert refused.details["dimension"] == "cost_usd" and refused.details["projected"] == pytest.approx(1.06)
    # a final report of fewer images than reserved settles what was delivered
    report = UsageReport("dall-e-3", 0, 0, units=(("image/1024x1024/hd", 1),)).with_reserved(decision.charges)
    settled = decide(limits(cost=1.0), state(cost_usd=0.16), report, 2.0)
    assert settled.settles and charged(settled, "cost_usd") == pytest.approx(0.08)


def test_media_calls_count_as_iterations():
    call = ModelCall("whisper-1", 0, 0, units=(("audio_second", 10),))
    assert decide(limits(iterations=2), state(), call, 1.0).action is Action.PERMIT
    saturated = SessionState(session="s", started_at=0.0, iterations=2)
    refused = decide(limits(iterations=2), saturated, call, 1.0)
    assert refused.cause == "on_iteration_limit"


def test_an_unpriced_unit_under_a_cost_cap_is_refused_saying_how_to_price_it():
    call = ModelCall("dall-e-3", 0, 0, units=(("image/4096x4096/hd", 1),))
    refused = decide(limits(cost=1.0), state(), call, 1.0)
    assert refused.cause == "on_budget_exhausted"
    assert (refused.details["reason"], refused.details["unit"]) == ("unpriced_unit", "image/4096x4096/hd")
    text = describe(governor_object(refused, "s"))
    assert "model 'dall-e-3' has no price for 'image/4096x4096/hd'" in text
    assert "units: {image/4096x4096/hd: USD per unit}" in text and "--pricing FILE" in text
    # without a cost cap the unpriced unit is not a refusal: only tokens are capped, and it has none
    assert decide(limits(cost=None, tokens=100), state(), call, 1.0).action is Action.PERMIT
    # a model with no price at all still says so
    unknown = decide(limits(cost=1.0), state(), ModelCall("acme-images", 0, 0, units=HD), 1.0)
    assert unknown.details["reason"] == "unpriced_model"


def test_a_free_call_is_admitted_under_a_cost_cap_whatever_its_model():
    decision = decide(limits(cost=1.0), state(), ModelCall("acme-moderation", 0, 0), 1.0)
    assert decision.action is Action.PERMIT and charged(decision, "cost_usd") == 0


def test_embeddings_and_the_media_models_are_priced_by_the_bundled_table():
    # embeddings were unpriced before (refused under any cost cap): now input tokens only
    assert PRICES.cost("text-embedding-3-small", 1_000_000, 0) == pytest.approx(0.02)
    assert PRICES.cost("text-embedding-3-large-2024", 1_000_000, 0) == pytest.approx(0.13)
    # longest prefix: the media variants are not priced as the chat family they start with
    assert PRICES.family_of("gpt-4o-mini-tts") == "gpt-4o-mini-tts"
    assert PRICES.family_of("gpt-4o-transcribe") == "gpt-4o-transcribe"
    assert PRICES.family_of("gpt-image-1.5") == "gpt-image-1.5"
    assert decide(limits(cost=1.0), state(), ModelCall("text-embedding-3-small", 500, 0), 1.0).action is Action.PERMIT
