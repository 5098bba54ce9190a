"""The cost model: token counts to cost_usd (Runtime §2 requires it documented).

cost = (input - cached_input) * input_price + cached_input * cached_input_price
       + output * output_price, prices in USD per million tokens.

A model name is matched to a family by longest prefix on a separator boundary:
the name is lower-cased, anything up to a last `/` is dropped (`openai/gpt-4o`), and
family F matches when the name is F or starts with F followed by `-`, `@` or `:`.
So `gpt-4o-2024-08-06` is gpt-4o, `gpt-4o-mini-2024-07-18` is gpt-4o-mini (the
longer family wins) and `claude-sonnet-4-20250514` is claude-sonnet-4, while
`gpt-4.5` is not gpt-4.

A model that matches no family has no price. The table may declare a `default`
price to cover such models; that is an explicit opt-in. Without it an unpriced
model's cost is unknown, which the decision point treats as unbounded wherever
cost is governed (see governor.policy.engine).

Batch work (the OpenAI Batch API, Anthropic Message Batches) is priced as `<model>@batch`:
at the family's price times BATCH_DISCOUNT (both providers bill batches at half price),
unless the table names that exact batch family (`gpt-4o-mini@batch: {...}`), which wins as
the longer match.

Loading the table is I/O and happens once, in `load_pricing`, never while deciding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

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

    def cost(self, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0) -> float:
        cached = min(max(cached_input_tokens, 0), max(input_tokens, 0))
        fresh = max(input_tokens, 0) - cached
        return (fresh * self.input + cached * self.cached_input + max(output_tokens, 0) * self.output) / PER


class PricingTable:
    """Model families with prices, and an optional default for the rest."""

    __slots__ = ("_families", "_by_length", "default", "_memo")

    def __init__(self, families: Mapping[str, ModelPrice], default: ModelPrice | None = None):
        self._families = {name.lower(): price for name, price in families.items()}
        self._by_length = sorted(self._families, key=len, reverse=True)
        self.default = default
        # model name -> price: the lookup is pure, so remembering it changes nothing
        self._memo: dict[str, ModelPrice | None] = {}

    @property
    def families(self) -> Mapping[str, ModelPrice]:
        return dict(self._families)

    def family_of(self, model: str) -> str | None:
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
        family = self.family_of(model)
        price = self._families[family] if family is not None else self.default
        if price is not None and model.lower().endswith(BATCH_TIER) and not (family or "").endswith(BATCH_TIER):
            price = ModelPrice(price.family + BATCH_TIER, price.input * BATCH_DISCOUNT, price.output * BATCH_DISCOUNT,
                               price.cached_input * BATCH_DISCOUNT)
        if len(self._memo) < 4096:
            self._memo[model] = price
        return price

    def cost(self, model: str, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0) -> float | None:
        """USD for this usage, or None when the model has no price. No usage costs nothing,
        priced or not (a free step: a read of a batch, a file upload)."""
        if input_tokens <= 0 and output_tokens <= 0:
            return 0.0
        price = self.price_for(model)
        if price is None:
            return None
        return price.cost(input_tokens, output_tokens, cached_input_tokens)


def _price(where: str, family: str, entry: Any) -> ModelPrice:
    if not isinstance(entry, Mapping):
        raise PricingError(f"{where}: expected a mapping with input, output (and cached_input), got {entry!r}")
    unknown = set(entry) - {"input", "output", "cached_input"}
    if unknown:
        raise PricingError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: input, output, cached_input")
    values = {}
    for key in ("input", "output", "cached_input"):
        if key not in entry:
            if key == "cached_input":
                continue
            raise PricingError(f"{where}: missing {key!r} (USD per million tokens)")
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise PricingError(f"{where}.{key}: must be a non-negative number, got {value!r}")
        values[key] = float(value)
    # no declared cache discount: cached tokens cost the full input price (never under-counts)
    values.setdefault("cached_input", values["input"])
    return ModelPrice(family, **values)


def pricing_from_mapping(data: Any, source: str = "pricing") -> PricingTable:
    if not isinstance(data, Mapping):
        raise PricingError(f"{source}: top level must be a mapping")
    unknown = set(data) - {"currency", "unit", "as_of", "models", "default"}
    if unknown:
        raise PricingError(f"{source}: unknown top-level field(s) {sorted(unknown)}")
    if data.get("currency", "USD") != "USD":
        raise PricingError(f"{source}: currency must be USD, got {data.get('currency')!r}")
    if data.get("unit", "per_million_tokens") != "per_million_tokens":
        raise PricingError(f"{source}: unit must be per_million_tokens, got {data.get('unit')!r}")
    models = data.get("models")
    if not isinstance(models, Mapping) or not models:
        raise PricingError(f"{source}: 'models' must be a non-empty mapping of family -> prices")
    families = {}
    for name, entry in models.items():
        if not isinstance(name, str) or not name.strip() or name != name.strip().lower():
            raise PricingError(f"{source}: model family {name!r} must be a lower-case name")
        families[name] = _price(f"{source}: models.{name}", name, entry)
    default = data.get("default")
    return PricingTable(families, _price(f"{source}: default", "default", default) if default is not None else None)


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
