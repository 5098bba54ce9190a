"""The cost model: the repository's pricing table and the family matching rule."""

from __future__ import annotations

import pytest

from governor.policy.pricing import PricingError, load_pricing, pricing_from_mapping
from tests.test_policy_support import PRICING, REPO


@pytest.mark.parametrize(
    "model, family",
    [
        ("gpt-4o", "gpt-4o"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),  # the longer family wins
        ("gpt-4.1-nano-2025-04-14", "gpt-4.1-nano"),
        ("gpt-4.1-mini", "gpt-4.1-mini"),
        ("gpt-4.1-2025-04-14", "gpt-4.1"),
        ("o1-2024-12-17", "o1"),
        ("o3-mini-2025-01-31", "o3-mini"),
        ("o3-2025-04-16", "o3"),
        ("o4-mini-2025-04-16", "o4-mini"),
        ("gpt-5-2025-08-07", "gpt-5"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("gpt-5-nano", "gpt-5-nano"),
        ("claude-opus-4-20250514", "claude-opus-4-0"),  # genai-prices' model ids from here on
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4-0"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-3-7-sonnet-20250219", "claude-3-7-sonnet-latest"),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku-latest"),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku-latest"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("Claude-Sonnet-4-20250514", "claude-sonnet-4-0"),  # case-insensitive
        ("openai/gpt-4o-mini", "gpt-4o-mini"),  # a provider prefix is dropped
        ("claude-sonnet-4@20250514", "claude-sonnet-4-0"),  # Vertex-style version suffix
        ("gpt-4.5-preview", "gpt-4.5-preview"),  # genai-prices has it (gpt-4 is not its prefix)
        ("gpt-4omni", None),
        ("llama-3-70b", None),
    ],
)
def test_family_is_the_longest_prefix_on_a_separator(model, family):
    assert PRICING.family_of(model) == family


def test_repository_table_covers_the_current_families():
    required = {
        "gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "o1", "o3", "o3-mini", "o4-mini",
        "gpt-5", "gpt-5-mini", "gpt-5-nano", "claude-opus-4", "claude-sonnet-4", "claude-3-7-sonnet",
        "claude-3-5-haiku", "claude-haiku-4-5",
    }
    # genai-prices prices them now; the bundled overrides only what it lacks
    assert all(PRICING.price_for(family) is not None for family in required)
    assert all(PRICING.source_of(family).startswith("genai-prices ") for family in required)
    assert not required & set(PRICING.families)
    assert PRICING.default is None  # unpriced models are refused unless a default is opted into
    for family, price in PRICING.families.items():
        # generating models price their output; embeddings have none, moderation is free,
        # and DALL-E, tts-1 and whisper-1 are priced per unit (image, character, audio second);
        # fine-tuning is priced per training token (its input)
        assert 0 <= price.cached_input <= price.input
        assert (price.output > 0 or "embedding" in family or "moderation" in family or price.units
                or (family.startswith("training:") and price.input > 0)), family


def test_cost_arithmetic():
    # gpt-4o: $2.50 in, $1.25 cached in, $10 out per million
    assert PRICING.cost("gpt-4o", 1_000_000, 1_000_000, 400_000) == pytest.approx(0.6 * 2.5 + 0.4 * 1.25 + 10.0)
    assert PRICING.cost("nobody-knows", 1, 1) is None
    # cached tokens can never exceed the input they are part of
    assert PRICING.cost("gpt-4o", 100, 0, 1000) == pytest.approx(100 * 1.25 / 1e6)


def test_cached_price_defaults_to_the_full_input_price():
    table = pricing_from_mapping({"models": {"m": {"input": 4.0, "output": 8.0}}})
    assert table.price_for("m").cached_input == 4.0


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "top level must be a mapping"),
        ({"models": {}}, "non-empty mapping"),
        ({"models": {"m": {"input": 1}}}, "missing 'output'"),
        ({"models": {"m": {"input": -1, "output": 1}}}, "must be a non-negative number"),
        ({"models": {"m": {"input": "1", "output": 1}}}, "must be a non-negative number"),
        ({"models": {"m": {"input": 1, "output": 1, "cache": 1}}}, "unknown field"),
        ({"models": {"GPT": {"input": 1, "output": 1}}}, "lower-case"),
        ({"models": {"m": {"input": 1, "output": 1}}, "currency": "EUR"}, "currency must be USD"),
        ({"models": {"m": {"input": 1, "output": 1}}, "extra": 1}, "unknown top-level"),
        ({"models": {"m": {"input": 1, "output": 1}}, "default": {"input": 1}}, "default: missing 'output'"),
    ],
)
def test_malformed_tables_are_refused_with_the_reason(data, message):
    with pytest.raises(PricingError, match=message):
        pricing_from_mapping(data)


def test_load_pricing_errors_name_the_file(tmp_path):
    with pytest.raises(PricingError, match="cannot read pricing table"):
        load_pricing(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: {gpt: [unclosed")
    with pytest.raises(PricingError, match="not valid YAML"):
        load_pricing(broken)


def test_json_tables_load_too(tmp_path):
    path = tmp_path / "pricing.json"
    path.write_text('{"models": {"m": {"input": 1, "output": 2}}, "default": {"input": 3, "output": 4}}')
    table = load_pricing(path)
    assert table.cost("m-2025", 1_000_000, 0) == 1.0 and table.cost("other", 0, 1_000_000) == 4.0


def test_repository_file_is_the_one_loaded():
    def figures(families):
        return {name: (p.input, p.output, p.cached_input, dict(p.units)) for name, p in families.items()}

    assert figures(load_pricing(REPO / "policies" / "pricing.yaml").families) == figures(PRICING.families)
