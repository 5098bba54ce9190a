"""The governor's price book (docs/reference/pricing.md): the prices the decision point
charges, assembled once at load time in the shell and handed to the pure policy as one
`PricingTable` (governor.policy.pricing).

Layers, the first that prices a model wins:

1. the operator's overrides, `governor run --pricing FILE` (families, a `default` price or a
   `fallback` model for what nothing else prices);
2. the bundled overrides, policies/pricing.yaml: what genai-prices lacks or prices in a way
   the governor's one-token-figure usage cannot use (per-image DALL-E prices, audio seconds,
   characters spoken, training tokens, Realtime and image models at their audio or image
   rates, embeddings and moderation, the Bedrock model ids genai-prices' aws provider lacks);
3. genai-prices (PyPI, pydantic/genai-prices), its bundled data (never updated over the
   network here), at the prices in effect on the book's date (`as_of`: the governor's start or
   reload): standard prices, the text rates (an audio or image rate only when a model has no
   text rate), its long-context tiers (more input tokens than a tier's start: that tier's prices
   on all the call's tokens),
   the first time-of-day price (an off-peak discount is never taken);
4. nothing: the model is unpriced, refused wherever cost is governed, with a message saying
   how to price it.

Each price names its source (`genai-prices 0.2.3`, `bundled sha256:...`,
`overrides sha256:...`); a cost event's detail carries it (`price_source`) and the record's
`limits.cost_model.sources` lists the layers.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from governor.policy.pricing import ModelPrice, PricingError, PricingTable, default_pricing_path, pricing_from_mapping

GENAI_PRICES = "genai-prices"
MAX_MODEL_NAME = 256  # longer names are no model's: unpriced without a lookup (each costs ~0.2-1 ms)
# A Bedrock model id (an optional cross-region prefix, then the vendor): genai-prices keeps them
# under its aws provider, which no name matches by itself (it has no model_match), and another
# provider's pattern may claim the name first (anthropic's "claude"); so these ask aws first.
BEDROCK_ID = re.compile(r"(?:(?:us|eu|apac|global|jp|au|ca|us-gov)\.)?"
                        r"(?:anthropic|meta|amazon|mistral|cohere|ai21|deepseek|qwen|writer|openai)\.", re.I)


def genai_prices_version() -> str:
    return metadata.version(GENAI_PRICES)


class GenaiPrices:
    """A model name to its genai-prices price on `as_of`, as the governor's ModelPrice (None:
    genai-prices does not know it, or prices it in nothing the governor counts)."""

    def __init__(self, as_of: datetime) -> None:
        from genai_prices.data import providers

        # walked without genai-prices' DataSnapshot, whose lookup caches grow with every name
        # asked (an agent's invented model names would grow them without bound); the price
        # book's own memo is bounded (governor.policy.pricing)
        self.providers = providers
        self.aws = next((p for p in providers if p.id == "aws"), None)
        self.as_of = as_of if as_of.tzinfo is not None else as_of.replace(tzinfo=UTC)
        self.source = f"{GENAI_PRICES} {genai_prices_version()}"

    def __call__(self, model: str) -> ModelPrice | None:
        """The agent's model name (its bytes): an absurd one, or one genai-prices chokes on, is
        unpriced (refused wherever cost is governed), never an error."""
        if not model or len(model) > MAX_MODEL_NAME:
            return None
        try:  # as genai-prices looks a name up without a provider: the first provider whose names match
            if self.aws is not None and BEDROCK_ID.match(model):
                provider = self.aws
            else:
                provider = next((p for p in self.providers
                                 if p.model_match is not None and p.model_match.is_match(model)), None)
            info = provider.find_model(model, all_providers=self.providers) if provider is not None else None
        except Exception:  # not a name genai-prices can read
            return None
        return None if info is None else self.converted(info.id, self.standard(info))

    def standard(self, info: Any) -> Any:
        """The price in effect on the book's date: the last conditional price whose start date
        has come (time-of-day prices are discounts: never taken)."""
        from genai_prices.types import StartDateConstraint

        prices = info.prices
        if not isinstance(prices, list):
            return prices
        chosen = prices[0].prices
        for conditional in prices:
            constraint = conditional.constraint
            if constraint is None or (isinstance(constraint, StartDateConstraint) and constraint.active(self.as_of)):
                chosen = conditional.prices
        return chosen

    def converted(self, family: str, price: Any) -> ModelPrice | None:
        from genai_prices.types import TieredPrices

        def rate(name: str) -> float | None:
            value = getattr(price, name, None)
            if value is None:
                return None
            return float(value.base if isinstance(value, TieredPrices) else value)

        def first(*names: str) -> float | None:
            rates = [r for r in (rate(name) for name in names) if r is not None]
            return rates[0] if rates else None

        units = {}
        if (per_million_chars := rate("input_mchars")) is not None:
            units["character"] = per_million_chars / 1_000_000
        if (per_hour := first("input_audio_hours", "audio_hours")) is not None:
            units["audio_second"] = per_hour / 3600
        text_in = rate("input_mtok")
        given_in = text_in if text_in is not None else max(
            [r for r in (rate("input_audio_mtok"), rate("input_image_mtok")) if r is not None], default=None)
        text_out = rate("output_mtok")
        given_out = text_out if text_out is not None else max(
            [r for r in (rate("output_audio_mtok"), rate("output_image_mtok")) if r is not None], default=None)
        if given_in is None and given_out is None and not units:
            return None  # priced per request or per search only: nothing the governor counts
        input_price = given_in if given_in is not None else (0.0 if units else given_out)
        output_price = given_out if given_out is not None else input_price  # no output rate: never under-count
        cached = rate("cache_read_mtok")
        input_price, output_price = float(input_price or 0.0), float(output_price or 0.0)
        cached_price = float(cached if cached is not None and cached <= input_price else input_price)
        return ModelPrice(family, input_price, output_price, cached_price, units, self.source,
                          self.tiers(price, text_in, text_out, (input_price, output_price, cached_price)))

    @staticmethod
    def tiers(price: Any, text_in: float | None, text_out: float | None,
              base: tuple[float, float, float]) -> tuple[tuple[int, float, float, float], ...]:
        """The long-context tiers of the text rates (genai-prices' TieredPrices): each start with
        the input, output and cached-input prices above it (a rate without tiers keeps its base)."""
        from genai_prices.types import TieredPrices

        if text_in is None or text_out is None:
            return ()
        rates = [getattr(price, name, None) for name in ("input_mtok", "output_mtok", "cache_read_mtok")]
        starts = sorted({tier.start for r in rates if isinstance(r, TieredPrices) for tier in r.tiers})

        def at(rate: Any, start: int, fallback: float) -> float:
            if not isinstance(rate, TieredPrices):
                return fallback
            applicable = rate.base
            for tier in rate.tiers:
                if tier.start <= start:
                    applicable = tier.price
            return float(applicable)

        out = []
        for start in starts:
            tier_in, tier_out = at(rates[0], start, base[0]), at(rates[1], start, base[1])
            tier_cached = at(rates[2], start, base[2]) if rates[2] is not None else tier_in
            out.append((start, tier_in, tier_out, min(tier_cached, tier_in)))
        return tuple(out)


def _layer(path: Path, label: str) -> tuple[PricingTable, str | None, str]:
    """An overrides file: its table, its fallback model, and its name with its digest."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PricingError(f"cannot read pricing overrides {path}: {exc.strerror or exc}") from exc
    named = f"{label} sha256:{hashlib.sha256(raw).hexdigest()}"
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PricingError(f"pricing overrides {path} are not valid YAML/JSON: {exc}") from exc
    table = pricing_from_mapping(data, str(path), named=named, overrides=True)
    fallback = data.get("fallback") if isinstance(data, dict) else None
    if fallback is not None and (not isinstance(fallback, str) or not fallback.strip()):
        raise PricingError(f"{path}: fallback must name a model whose price covers unpriced models, got {fallback!r}")
    return table, fallback, named


def price_book(overrides: str | Path | None = None, *, as_of: datetime | None = None,
               bundled: str | Path | None = None) -> PricingTable:
    """The governor's prices: `overrides` (the operator's file) over the bundled overrides over
    genai-prices on `as_of` (default: now). PricingError says what is wrong."""
    as_of = as_of or datetime.now(UTC)
    genai = GenaiPrices(as_of)
    bundled_table, bundled_fallback, bundled_name = _layer(Path(bundled or default_pricing_path()), "bundled")
    families = dict(bundled_table.families)
    default = bundled_table.default
    fallback = bundled_fallback
    sources = {GENAI_PRICES: f"{genai.source}, prices as of {as_of.date().isoformat()}", "bundled": bundled_name}
    if overrides is not None:
        operator, operator_fallback, operator_name = _layer(Path(overrides), f"overrides {Path(overrides).name}")
        families.update(operator.families)
        if operator.default is not None or operator_fallback is not None:
            default, fallback = operator.default, operator_fallback
        sources["overrides"] = operator_name
    table = PricingTable(families, default, resolver=genai, sources=sources)
    if fallback is not None:
        price = table.price_for(fallback)
        if price is None:
            raise PricingError(f"fallback {fallback!r}: no layer prices this model (docs/reference/pricing.md)")
        named = ModelPrice(f"fallback:{price.family}", price.input, price.output, price.cached_input, price.units,
                           f"fallback {fallback} ({price.source})")
        table = PricingTable(families, named, resolver=genai, sources={**sources, "fallback": fallback})
    return table
