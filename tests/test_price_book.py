"""The price book (governor/runtime/prices.py, docs/reference/pricing.md): genai-prices as the
source, the bundled and the operator's overrides over it, prices by date, an explicit choice
for unpriced models; a signed record whose cost events and limits name the price source and
its version. The real runtime (policy, SQLite store, journal, signed record) decides."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from importlib import metadata

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.adapters.refusals import describe
from governor.evidence import generate_key, verify_record
from governor.passport import AdmissionConfig, admit, sign_passport
from governor.policy import ModelCall, Tier, compile_limits
from governor.policy.pricing import PricingError
from governor.runtime.core import Runtime
from governor.runtime.prices import price_book
from governor.store import open_store
from tests.test_policy_support import budget, passport

VERSION = metadata.version("genai-prices")
CAPPED = passport(**budget(cost_usd={"per_session": 0.01}))


def runtime_for(document, tmp_path, pricing) -> Runtime:
    tmp_path.mkdir(parents=True, exist_ok=True)
    signed = sign_passport(document, Ed25519PrivateKey.generate())
    report = admit(signed, AdmissionConfig(now=time.time()))
    assert report.verified, report.to_dict()
    limits = compile_limits(report.pinned.document, tier=Tier.R2, pricing=pricing, passport_digest=report.digest)
    return Runtime(limits=limits, store=open_store(tmp_path / "state.db"), data_dir=tmp_path, key=generate_key(),
                   governor_id="did:web:localhost:governor", agent_id=report.pinned.id, pinned=report.pinned)


async def refused_and_recorded(runtime: Runtime, model: str) -> tuple[dict, dict]:
    """A call over the $0.01 cap refused, then the session's signed record."""
    try:
        admission = await runtime.admit("s", ModelCall(model, 1_000_000, 1_000))
        assert admission.decision.blocks, admission.decision
        record = await runtime.end_session("s")
    finally:
        await runtime.close()
    assert verify_record(record, public_key=runtime.key.public_key()).ok  # signed, and the chain holds
    return admission.governor_object, record


async def test_a_record_names_genai_prices_and_its_version(tmp_path):
    gov, record = await refused_and_recorded(runtime_for(CAPPED, tmp_path, price_book()), "gpt-4o-mini")
    assert gov["dimension"] == "cost_usd" and "reason" not in gov  # priced, over the cap
    [event] = [e for e in record["events"] if e["cause"] == "on_budget_exhausted"]
    assert event["detail"]["price_source"] == f"genai-prices {VERSION}"
    assert event["detail"]["projected"] == pytest.approx(1_000_000 * 0.15 / 1e6 + 1_000 * 0.60 / 1e6)
    sources = record["limits"]["cost_model"]["sources"]
    assert sources["genai-prices"].startswith(f"genai-prices {VERSION}, prices as of ")
    assert sources["bundled"].startswith("bundled sha256:")


async def test_an_override_is_applied_and_named_by_its_digest(tmp_path):
    overrides = tmp_path / "prices.yaml"
    overrides.write_text("models:\n  gpt-4o-mini: {input: 0.001, output: 0.002}\n")
    digest = hashlib.sha256(overrides.read_bytes()).hexdigest()
    book = price_book(overrides)
    assert book.price_for("gpt-4o-mini-2024-07-18").input == 0.001  # the family's prefix, over genai-prices
    assert book.source_of("gpt-4o") == f"genai-prices {VERSION}"  # what it does not override
    assert book.cost("gpt-4o-mini", 1_000_000, 1_000_000) == pytest.approx(0.003)
    # under the $0.01 cap now: admitted; the dearer gpt-4o is refused, naming genai-prices
    runtime = runtime_for(CAPPED, tmp_path / "data", book)
    admitted = await runtime.admit("s", ModelCall("gpt-4o-mini", 1_000_000, 1_000))
    assert not admitted.decision.blocks
    await runtime.finish("s", admitted.ticket)
    gov, record = await refused_and_recorded(runtime, "gpt-4o")
    assert record["limits"]["cost_model"]["sources"]["overrides"] == f"overrides prices.yaml sha256:{digest}"
    overrides.write_text("models:\n  gpt-4o: {input: 0, output: 100}\n")
    assert price_book(overrides).source_of("gpt-4o") == \
        f"overrides prices.yaml sha256:{hashlib.sha256(overrides.read_bytes()).hexdigest()}"


def test_a_model_is_priced_at_the_price_in_effect_on_the_books_date():
    # genai-prices: o3 was $10 in / $40 out per million until 2025-06-10, $2 / $8 from then on
    before = price_book(as_of=datetime(2025, 6, 1, tzinfo=UTC)).price_for("o3-2025-04-16")
    after = price_book(as_of=datetime(2025, 6, 10, tzinfo=UTC)).price_for("o3-2025-04-16")
    assert (before.input, before.output) == (10.0, 40.0)
    assert (after.input, after.output) == (2.0, 8.0)
    assert before.source == after.source == f"genai-prices {VERSION}"


async def test_an_unpriced_model_under_a_cost_cap_is_refused_saying_how_to_price_it(tmp_path):
    gov, record = await refused_and_recorded(runtime_for(CAPPED, tmp_path, price_book()), "acme-1")
    assert gov["reason"] == "unpriced_model" and gov["model"] == "acme-1"
    text = describe(gov)
    assert "model 'acme-1' has no price" in text and "--pricing FILE" in text
    assert "models: {acme-1: {input: USD, output: USD}}" in text and "fallback: MODEL" in text
    assert record["limits"]["cost_model"]["unpriced_models"] == "refused where cost is governed"


async def test_a_named_fallback_prices_every_unpriced_model(tmp_path):
    overrides = tmp_path / "prices.yaml"
    overrides.write_text("fallback: gpt-4o-mini\n")
    book = price_book(overrides)
    price = book.price_for("acme-1")
    assert (price.input, price.output) == (0.15, 0.60)
    assert price.source == f"fallback gpt-4o-mini (genai-prices {VERSION})"
    gov, record = await refused_and_recorded(runtime_for(CAPPED, tmp_path / "data", book), "acme-1")
    [event] = [e for e in record["events"] if e["cause"] == "on_budget_exhausted"]
    assert event["detail"]["price_source"] == price.source and "reason" not in event["detail"]
    assert record["limits"]["cost_model"]["unpriced_models"] == f"priced at {price.source}"


@pytest.mark.parametrize("text, message", [
    ("fallback: acme-1\n", "fallback 'acme-1': no layer prices this model"),
    ("fallback: [gpt-4o]\n", "fallback must name a model"),
    ("fallback: gpt-4o\ndefault: {input: 1, output: 1}\n", "either a default price or a fallback model"),
    ("models: {gpt-4o: {input: -1, output: 1}}\n", "must be a non-negative number"),
    ("models: {gpt-4o: [unclosed\n", "not valid YAML"),
    ("surprise: 1\n", "unknown top-level"),
    (b"\xff\xfe\x00", "not valid YAML"),
])
def test_a_bad_overrides_file_is_refused_naming_it(tmp_path, text, message):
    overrides = tmp_path / "prices.yaml"
    overrides.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PricingError, match=message):
        price_book(overrides)


def test_an_absent_overrides_file_is_refused_naming_it(tmp_path):
    with pytest.raises(PricingError, match="cannot read pricing overrides .*absent.yaml"):
        price_book(tmp_path / "absent.yaml")


def test_the_bundled_overrides_keep_only_what_genai_prices_lacks():
    book = price_book()
    # per-image DALL-E prices, training tokens, Realtime at its audio rates: bundled
    assert book.source_of("dall-e-3").startswith("bundled sha256:")
    assert book.price_for("dall-e-3").units["image/1024x1024/hd"] == 0.08
    assert book.source_of("training:gpt-4o-mini").startswith("bundled sha256:")
    assert book.price_for("gpt-realtime").input == 32.0
    # characters spoken and audio seconds come from genai-prices' own units
    assert book.source_of("tts-1") == f"genai-prices {VERSION}"
    assert book.price_for("tts-1").units["character"] == pytest.approx(15 / 1e6)
    assert book.price_for("whisper-1").units["audio_second"] == pytest.approx(0.36 / 3600)
    # a batch is half price whichever layer prices its model
    assert book.price_for("gpt-4o-mini@batch").input == pytest.approx(0.075)


def test_bedrock_ids_are_priced_by_genai_prices_aws_provider_before_any_other():
    """A Bedrock model id is looked up in genai-prices' aws provider first (it has no name pattern
    of its own, and anthropic's "claude" would claim Claude ids at the first-party price)."""
    book = price_book()
    for model, price in (("us.meta.llama3-1-8b-instruct-v1:0", (0.22, 0.22)), ("amazon.nova-pro-v1:0", (0.8, 3.2)),
                         ("arn:aws:bedrock:us-west-2:1:inference-profile/eu.amazon.nova-lite-v1:0", (0.06, 0.24)),
                         ("anthropic.claude-opus-4-5-20251101-v1:0", (5.5, 27.5))):  # the regional price
        found = book.price_for(model)
        assert (found.input, found.output) == price and found.source == f"genai-prices {VERSION}", (model, found)
    assert book.price_for("amazon.nova-pro-v1:0").cached_input == pytest.approx(0.2)
    # Claude on Bedrock at its regional price, not anthropic's first-party one: from aws where it
    # has the id, from the bundled overrides where it lacks it
    assert book.price_for("us.anthropic.claude-sonnet-4-5-20250929-v1:0").input == 3.3
    undated = book.price_for("us.anthropic.claude-sonnet-4-5")
    assert undated.input == 3.3 and undated.source.startswith("bundled sha256:")
    assert book.price_for("claude-sonnet-4-5").input == 3.0  # the first-party name is anthropic's
    # more vendors on Bedrock are priced now (they were refused under a cost cap): Mistral, Writer
    assert book.price_for("mistral.pixtral-large-2502-v1:0").source == f"genai-prices {VERSION}"


def test_no_bundled_override_repeats_a_price_genai_prices_has():
    """The hand-kept table does not grow back: every bundled entry is one genai-prices lacks, or
    prices differently on purpose (audio and image models at the dearer rate)."""
    import yaml

    from governor.policy.pricing import default_pricing_path
    from governor.runtime.prices import GenaiPrices

    genai = GenaiPrices(datetime.now(UTC))
    bundled = yaml.safe_load(default_pricing_path().read_text())["models"]
    repeated = []
    for name, entry in bundled.items():
        price = genai(name)
        if price is not None and (price.input, price.output) == (entry.get("input"), entry.get("output")) \
                and price.cached_input == entry.get("cached_input", entry.get("input")):
            repeated.append(name)
    assert not repeated, repeated


@pytest.mark.parametrize("name", [
    "x" * 100_000, "", "\x00", "gpt-4o(.*", "../../etc/passwd", "gpt-4o\n", "ģρτ-4ο", "claude-" * 40, "@batch", "/",
    "us.meta.", "eu.anthropic." + "claude-" * 30, "amazon.\x00nova",  # Bedrock-shaped: asked of genai-prices' aws
])
def test_a_hostile_model_name_is_unpriced_or_priced_never_an_error(name):
    book = price_book()
    price = book.price_for(name)  # the agent's bytes reach the lookup
    assert price is None or price.source
    assert book.cost(name, 10, 10) is None or book.cost(name, 10, 10) >= 0


@pytest.mark.parametrize("model, input_tokens, cached, output_tokens", [
    ("gpt-4o-2024-08-06", 120_000, 20_000, 3_000),
    ("claude-sonnet-4-5-20250929", 100_000, 0, 2_000),
    ("claude-sonnet-4-5-20250929", 300_000, 50_000, 2_000),  # past its 200k tier: every token at the tier's rate
    ("gemini-2.5-pro", 250_000, 0, 10_000),
    ("o3-2025-04-16", 1_000, 0, 1_000),
])
def test_the_book_charges_what_genai_prices_computes_for_text(model, input_tokens, cached, output_tokens):
    from genai_prices import Usage, calc_price

    when = datetime(2026, 1, 1, tzinfo=UTC)
    expected = calc_price(Usage(input_tokens=input_tokens, cache_read_tokens=cached, output_tokens=output_tokens),
                          model, genai_request_timestamp=when).total_price
    assert price_book(as_of=when).cost(model, input_tokens, output_tokens, cached) == pytest.approx(float(expected))


def test_a_fitted_call_past_a_long_context_tier_is_fitted_at_the_tiers_output_price():
    from governor.policy import decide
    from tests.test_policy_units import state

    limits = compile_limits(budget(cost_usd={"per_session": 2.0}), tier=Tier.R2, pricing=price_book())
    step = ModelCall("claude-sonnet-4-5", 300_000, 100_000, output_floor=1_000)
    decision = decide(limits, state(), step, 1.0)
    assert not decision.blocks, decision
    charged = sum(c.amount for c in decision.charges if c.dimension == "cost_usd" and c.scope == "per_session")
    assert 1.8 < charged <= 2.0  # fitted to the cap at $6 in / $22.50 out per million, not refused


def test_an_override_prices_its_model_not_another_model_it_prefixes(tmp_path):
    overrides = tmp_path / "prices.yaml"
    overrides.write_text("models:\n  gpt-4o: {input: 1, output: 2}\n  acme: {input: 3, output: 4}\n")
    book = price_book(overrides)
    assert book.price_for("gpt-4o-2024-08-06").input == 1  # genai-prices knows it as gpt-4o: overridden
    assert book.price_for("gpt-4o-mini").input == 0.15  # another model to genai-prices: its own price
    assert book.price_for("acme-large").input == 3  # genai-prices does not know it: the family's
    assert book.price_for("gpt-4o@batch").input == 0.5  # the override at the batch discount
