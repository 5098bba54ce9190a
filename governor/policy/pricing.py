"""The cost model: token counts to cost_usd (Runtime §2 requires it documented).

cost = (input - cached_input) * input_price + cached_input * cached_input_price
       + output * output_price, prices in USD per million tokens.

A model name is matched to a family by longest prefix on a separator boundary:
the name is lower-cased, anything up to a last `/` is dropped (`openai/gpt-4o`), and
family F matches when the name is F or starts with F followed by `-`, `@` or `:`.
So `gpt-4o-2024-08-06` is gpt-4o, `gpt-4o-mini-2024-07-18` is gpt-4o-mini (the
longer family wins) and `claude-sonnet-4-20250514` is claude-sonnet-4, while
`gpt-4.5` is not gpt-4.

Besides tokens a family may price units (`units`: USD per unit): images of a size and
quality (`image/1024x1024/standard`), seconds of audio (`audio_second`), characters spoken
(`character`). A step's units (ModelCall.units, UsageReport.units) add count * price; a
unit its family does not price makes the whole cost unknown (None), as an unpriced model
does. A family priced only per unit needs no token prices (its tokens then cost nothing).

A model that matches no family has no price. The table may declare a `default`
price to cover such models; that is an explicit opt-in. Without it an unpriced
model's cost is unknown, which the decision point treats as unbounded wherever
cost is governed (see governor.policy.engine).

Batch work (the OpenAI Batch API, Anthropic Message Batches) is priced as `<model>@batch`:
at the family's price times BATCH_DISCOUNT (both providers bill batches at half price),
unless the table names that exact batch family (`gpt-4o-mini@batch: {...}`), which wins as
the longer match.

Loading the table is I/O and happens once, in `load_pricing`, never while deciding.

The governor's price book (governor.runtime.prices) layers tables: the operator's overrides
(`--pricing FILE`), then the bundled overrides (policies/pricing.yaml: what genai-prices
lacks), then `resolver`, a pure lookup into the genai-prices data built in the shell at load
time, then the `default` (a named fallback). Every price names its `source` (genai-prices and
its version, or the file's digest), which a cost event's detail and the record carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

_SEPARATORS = ("-", "@", ":")
PER = 1_000_000.0
BATCH_TIER = "@batch"  # the suffix of a batch's model name (governor.adapters.openai_async, anthropic_batches)
BATCH_DISCOUNT = 0.5


class PricingError(ValueError):
    """The pricing table is unreadable or malformed; says where."""


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens for one model family."""

    family: str
    input: float
    output: float
    cached_input: float
    units: Mapping[str, float] = field(default_factory=dict)  # USD per unit (images, audio seconds, ...)
    source: str = ""  # where the price comes from: "genai-prices 0.2.3", "overrides sha256:...", ...
    # long-context tiers (genai-prices'): ((start, input, output, cached_input), ...) by start;
    # a call with more than `start` input tokens pays that tier's prices on all its tokens
    tiers: tuple[tuple[int, float, float, float], ...] = ()

    def output_at(self, input_tokens: int) -> float:
        """The output price a call with this many input tokens pays (its tier's)."""
        for start, _, output, _ in reversed(self.tiers):
            if input_tokens > start:
                return output
        return self.output

    def cost(self, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0) -> float:
        cached = min(max(cached_input_tokens, 0), max(input_tokens, 0))
        fresh = max(input_tokens, 0) - cached
        prices = (self.input, self.output, self.cached_input)
        for start, *tier in reversed(self.tiers):
            if input_tokens > start:
                prices = tuple(tier)  # type: ignore[assignment]
                break
        return (fresh * prices[0] + cached * prices[2] + max(output_tokens, 0) * prices[1]) / PER

    def units_cost(self, units: tuple[tuple[str, float], ...]) -> float | None:
        """USD for these units, or None when one of them has no price here."""
        total = 0.0
        for unit, count in units:
            price = self.units.get(unit)
            if price is None:
                return None
            total += max(count, 0) * price
        return total


class PricingTable:
    """Model families with prices, and an optional default for the rest."""

    __slots__ = ("_families", "_by_length", "default", "_memo", "resolver", "sources")

    def __init__(self, families: Mapping[str, ModelPrice], default: ModelPrice | None = None, *,
                 resolver: Callable[[str], ModelPrice | None] | None = None, sources: Mapping[str, str] | None = None):
        self._families = {name.lower(): price for name, price in families.items()}
        self._by_length = sorted(self._families, key=len, reverse=True)
        self.default = default
        # a model no family matches, looked up in a price source (genai-prices) before the default:
        # pure (data loaded by the shell), so remembering its answer changes nothing
        self.resolver = resolver
        self.sources = dict(sources or {})  # layer -> what it is (its version or digest), for the record
        # model name -> price: the lookup is pure, so remembering it changes nothing
        self._memo: dict[str, ModelPrice | None] = {}

    @property
    def families(self) -> Mapping[str, ModelPrice]:
        return dict(self._families)

    def family_of(self, model: str) -> str | None:
        """The family that prices `model`: a table's by prefix, else the resolver's (None: neither)."""
        family = self._family(model)
        if family is None and self.resolver is not None:
            price = self._resolved(model)
            return price.family if price is not None else None
        return family

    def _resolved(self, model: str) -> ModelPrice | None:
        assert self.resolver is not None
        name = model.strip().rsplit("/", 1)[-1]
        return self.resolver(name[:-len(BATCH_TIER)] if name.lower().endswith(BATCH_TIER) else name)

    def _family(self, model: str) -> str | None:
        name = model.strip().lower().rsplit("/", 1)[-1]
        for family in self._by_length:
            if name == family or (name.startswith(family) and name[len(family)] in _SEPARATORS):
                return family
        return None

    def price_for(self, model: str) -> ModelPrice | None:
        try:
            return self._memo[model]
        except KeyError:
            pass
        family = self._family(model)
        price = self._families[family] if family is not None else None
        if self.resolver is not None:
            resolved = self._resolved(model)
            if price is None or (resolved is not None and family is not None
                                 and resolved.family != getattr(self.resolver(family), "family", family)):
                # an override family prices the names it prefixes, except those genai-prices knows
                # as another model: `gpt-4o` overridden leaves gpt-4o-mini at its own price
                price = resolved if resolved is not None else price
                family = None if resolved is not None else family
        if price is None:
            price = self.default
        if price is not None and model.lower().endswith(BATCH_TIER) and not (family or "").endswith(BATCH_TIER):
            price = ModelPrice(price.family + BATCH_TIER, price.input * BATCH_DISCOUNT, price.output * BATCH_DISCOUNT,
                               price.cached_input * BATCH_DISCOUNT, price.units, price.source,
                               tuple((start, *(p * BATCH_DISCOUNT for p in tier)) for start, *tier in price.tiers))
        if len(self._memo) < 4096:
            self._memo[model] = price
        return price

    def cost(self, model: str, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0,
             units: tuple[tuple[str, float], ...] = ()) -> float | None:
        """USD for this usage, or None when the model (or one of its units) has no price.
        Nothing consumed costs nothing, priced or not (a free step: moderation, token counting)."""
        price = self.price_for(model)
        if price is None:
            return None if input_tokens or output_tokens or units else 0.0
        cost = price.cost(input_tokens, output_tokens, cached_input_tokens)
        if units:
            extra = price.units_cost(units)
            return None if extra is None else cost + extra
        return cost

    def source_of(self, model: str) -> str | None:
        """Where the model's price comes from (None: it has none)."""
        price = self.price_for(model)
        return None if price is None else price.source or "pricing table"

    def unpriced_unit(self, model: str, units: tuple[tuple[str, float], ...]) -> str | None:
        """The first of `units` the model's price lacks (None: all priced, or the model has no
        price at all): what the refusal of an unpriced modality names."""
        price = self.price_for(model)
        if price is None:
            return None
        return next((unit for unit, _ in units if unit not in price.units), None)


def _price(where: str, family: str, entry: Any, source: str = "") -> ModelPrice:
    if not isinstance(entry, Mapping):
        raise PricingError(f"{where}: expected a mapping with input, output (and cached_input), got {entry!r}")
    unknown = set(entry) - {"input", "output", "cached_input", "units"}
    if unknown:
        raise PricingError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: input, output, cached_input, units")
    units = _units(where, entry.get("units"))
    values = {}
    for key in ("input", "output", "cached_input"):
        if key not in entry:
            if key == "cached_input":
                continue
            if units:  # priced per unit only: its tokens (if any are reported) cost nothing
                values[key] = 0.0
                continue
            raise PricingError(f"{where}: missing {key!r} (USD per million tokens)")
        value = entry[key]
        if not _amount(value):
            raise PricingError(f"{where}.{key}: must be a non-negative number, got {value!r}")
        values[key] = float(value)
    # no declared cache discount: cached tokens cost the full input price (never under-counts)
    values.setdefault("cached_input", values["input"])
    return ModelPrice(family, units=units, source=source, **values)


def _amount(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _units(where: str, entry: Any) -> dict[str, float]:
    """A family's unit prices: {unit: USD per unit}, e.g. {"image/1024x1024/hd": 0.08}."""
    if entry is None:
        return {}
    if not isinstance(entry, Mapping) or not entry:
        raise PricingError(f"{where}.units: expected a non-empty mapping of unit -> USD per unit, got {entry!r}")
    units = {}
    for unit, value in entry.items():
        if not isinstance(unit, str) or not unit.strip() or unit != unit.strip().lower():
            raise PricingError(f"{where}.units: unit {unit!r} must be a lower-case name")
        if not _amount(value):
            raise PricingError(f"{where}.units.{unit}: must be a non-negative number (USD per unit), got {value!r}")
        units[unit] = float(value)
    return units


def pricing_from_mapping(data: Any, source: str = "pricing", *, named: str = "",
                         overrides: bool = False) -> PricingTable:
    """A table from its parsed document; `named` is what each of its prices says of its source.
    `overrides`: a layer over other prices (governor.runtime.prices), which may be empty and may
    name a `fallback` model instead of a `default` price."""
    if not isinstance(data, Mapping):
        raise PricingError(f"{source}: top level must be a mapping")
    unknown = set(data) - {"currency", "unit", "as_of", "models", "default", *(("fallback",) if overrides else ())}
    if unknown:
        raise PricingError(f"{source}: unknown top-level field(s) {sorted(unknown)}")
    if data.get("currency", "USD") != "USD":
        raise PricingError(f"{source}: currency must be USD, got {data.get('currency')!r}")
    if data.get("unit", "per_million_tokens") != "per_million_tokens":
        raise PricingError(f"{source}: unit must be per_million_tokens, got {data.get('unit')!r}")
    models = data.get("models")
    if overrides and models is None:
        models = {}
    if not isinstance(models, Mapping) or (not models and not overrides):
        raise PricingError(f"{source}: 'models' must be a non-empty mapping of family -> prices")
    families = {}
    for name, entry in models.items():
        if not isinstance(name, str) or not name.strip() or name != name.strip().lower():
            raise PricingError(f"{source}: model family {name!r} must be a lower-case name")
        families[name] = _price(f"{source}: models.{name}", name, entry, named)
    default = data.get("default")
    if default is not None and data.get("fallback") is not None:
        raise PricingError(f"{source}: declare either a default price or a fallback model, not both")
    return PricingTable(families, _price(f"{source}: default", "default", default, named) if default is not None else None)


def default_pricing_path() -> Path:
    """The bundled pricing table (policies/pricing.yaml, shipped in the package as governor/data)."""
    return (Path(__file__).resolve().parent.parent / "data" / "pricing.yaml").resolve()


def load_pricing(path: str | Path) -> PricingTable:
    """Read a pricing table (YAML or JSON) once; PricingError says what is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PricingError(f"cannot read pricing table {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PricingError(f"pricing table {path} is not valid YAML/JSON: {exc}") from exc
    return pricing_from_mapping(data, str(path))
