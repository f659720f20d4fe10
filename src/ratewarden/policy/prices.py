"""What a model call costs: the policy's `models:` prices, else genai-prices', else the
policy's `defaults.model_price` (docs/budgets.md, "Prices").

A price is in USD per million tokens, which is exactly micro-USD per token: a call's cost
in micro-units is its tokens times its prices. Each price is kept as an integer count of
1e-20 micro-USD per token (genai-prices writes some with 17 decimals), so a cost is an
exact integer sum, rounded **up** to the micro-unit once (a budget never gives money
away). genai-prices' own `calc_price` does the same
sums in Decimal but costs half a millisecond a call (docs/benchmarks.md): its prices are
read once per model name, and priced here. tests/unit/test_prices.py holds the two equal
for every model of its snapshot. A model whose price has a unit this arithmetic does not
know is priced by genai-prices itself (exact, slower).

genai-prices (1.6 MB of data) is imported on the first model call that needs it, never
by a hook or a policy without model calls.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

from ratewarden.policy.durations import MICROS
from ratewarden.wire.bodies import ModelUsage

# Prices are kept in units of 1e-20 micro-USD per token: exact for up to 20 decimals.
PICO = 10**20
_CACHE = 4096  # model names priced per policy: beyond, the least used is priced again

# genai-prices' price keys this arithmetic knows; a model priced in any other (audio,
# images, reasoning...) goes to genai-prices whole. `*_kcount` units other than requests
# count things a usage here never reports (web searches): they add nothing.
_TOKEN_KEYS = {"input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok"}
_REQUESTS = "requests_kcount"


@dataclass(frozen=True, slots=True)
class Tiered:
    """One unit's price: `base` until the input tokens pass a tier's start, then that
    tier's price for every token (genai-prices' "cliff" tiers)."""

    base: int  # in PICO units per token
    tiers: tuple[tuple[int, int], ...] = ()  # (start, price), ascending

    def at(self, input_tokens: int) -> int:
        for start, price in reversed(self.tiers):
            if input_tokens > start:
                return price
        return self.base


@dataclass(frozen=True, slots=True)
class Price:
    """A model's price per token unit. A missing cache price charges those tokens at the
    input price (they stay part of the input), as genai-prices does."""

    input: Tiered
    output: Tiered
    cache_read: Tiered | None = None
    cache_write: Tiered | None = None
    per_request: int = 0  # in PICO units per request
    # Priced by genai-prices itself (a unit the sums above do not know): usage -> micros.
    exact: Callable[[ModelUsage], int] | None = None

    def micros(self, usage: ModelUsage) -> int:
        """What `usage` costs, in micro-USD, rounded up."""
        if self.exact is not None:
            return self.exact(usage)
        return self._summed(
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
        )

    def most(self, input_tokens: int, max_output_tokens: int) -> int:
        """The most a call of `input_tokens` (none cached) answering up to
        `max_output_tokens` can cost, in micro-USD: its reservation."""
        if self.exact is not None:
            return self.exact(
                ModelUsage(input_tokens=input_tokens, output_tokens=max_output_tokens)
            )
        return self._summed(input_tokens, max_output_tokens, 0, 0)

    def _summed(self, total_in: int, output: int, read: int, written: int) -> int:
        uncached = total_in
        pico = self.per_request + output * self.output.at(total_in)
        if self.cache_read is not None:
            uncached -= read
            pico += read * self.cache_read.at(total_in)
        if self.cache_write is not None:
            uncached -= written
            pico += written * self.cache_write.at(total_in)
        pico += uncached * self.input.at(total_in)
        return -(-pico // PICO)


class Inexact(ValueError):
    """A price with more decimals than PICO units hold: priced by genai-prices itself."""


def _pico(value: Decimal | float | int) -> int:
    """USD per million tokens as PICO units per token, exactly."""
    scaled = Decimal(str(value)) * PICO
    if scaled != scaled.to_integral_value():
        raise Inexact(value)
    return int(scaled)


def price_of(line: Mapping[str, float]) -> Price:
    """A policy line (`{input, output, cache_read, cache_write}`, USD per MTok) as a Price."""
    cache_read, cache_write = line.get("cache_read"), line.get("cache_write")
    return Price(
        Tiered(_pico(line.get("input", 0))),
        Tiered(_pico(line.get("output", 0))),
        None if cache_read is None else Tiered(_pico(cache_read)),
        None if cache_write is None else Tiered(_pico(cache_write)),
    )


class Prices:
    """A policy's prices: its lines (exact names first, then globs in file order), then
    genai-prices, then its default; each model's found once and kept (bounded)."""

    def __init__(self, lines: Sequence[tuple[str, Price]] = (), default: Price | None = None):
        self.exact = {pattern: price for pattern, price in lines if not _is_glob(pattern)}
        self.globs = [(pattern, price) for pattern, price in lines if _is_glob(pattern)]
        self.default = default
        self.of: Callable[[str], Price | None] = lru_cache(maxsize=_CACHE)(self._find)

    def known(self, model: str) -> bool:
        """Whether `model` has a price of its own (a line or genai-prices), not the default."""
        return self._own(model) is not None

    def _find(self, model: str) -> Price | None:
        return self._own(model) or self.default

    def _own(self, model: str) -> Price | None:
        found = self.exact.get(model)
        if found is not None:
            return found
        for pattern, price in self.globs:
            if fnmatch.fnmatchcase(model, pattern):
                return price
        return genai_price(model)


def _is_glob(pattern: str) -> bool:
    return any(mark in pattern for mark in "*?[")


@lru_cache(maxsize=_CACHE)
def genai_price(model: str) -> Price | None:
    """genai-prices' price of `model` in force now (None: it does not know the model)."""
    from datetime import UTC, datetime

    from genai_prices import data_snapshot

    try:
        _provider, info = data_snapshot.get_snapshot().find_provider_model(model, None, None, None)
    except LookupError:
        return None
    model_price = info.get_prices(datetime.now(tz=UTC))
    return _from_genai(model_price)


def _from_genai(model_price: Any) -> Price:
    keys = {k for k, v in vars(model_price).items() if not k.startswith("_") and v is not None}
    unknown = {k for k in keys - _TOKEN_KEYS - {_REQUESTS} if not k.endswith("_kcount")}
    if unknown:
        return Price(Tiered(0), Tiered(0), exact=_priced_by_genai(model_price))
    try:
        return _summed(vars(model_price).get)
    except Inexact:
        return Price(Tiered(0), Tiered(0), exact=_priced_by_genai(model_price))


def _summed(get: Callable[[str], Any]) -> Price:
    cache_read, cache_write, requests = (
        get("cache_read_mtok"),
        get("cache_write_mtok"),
        get(_REQUESTS),
    )
    return Price(
        _tiered(get("input_mtok")),
        _tiered(get("output_mtok")),
        None if cache_read is None else _tiered(cache_read),
        None if cache_write is None else _tiered(cache_write),
        per_request=0 if requests is None else _pico(Decimal(requests) * 1000),
    )


def _tiered(value: Any) -> Tiered:
    if value is None:
        return Tiered(0)
    if isinstance(value, Decimal | int | float):
        return Tiered(_pico(value))
    tiers = tuple(sorted((int(t.start), _pico(t.price)) for t in value.tiers))
    return Tiered(_pico(value.base), tiers)


def _priced_by_genai(model_price: Any) -> Callable[[ModelUsage], int]:
    def micros(usage: ModelUsage) -> int:
        from genai_prices import Usage

        found = model_price.calc_price(Usage(**usage.model_dump()))
        micros: int = math.ceil(found["total_price"] * MICROS)
        return micros

    return micros
