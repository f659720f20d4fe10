"""Model prices (policy/prices.py, docs/budgets.md "Prices"): our integer sums are
genai-prices' own `calc_price`, rounded up to the micro-unit, for every model it knows;
the policy's lines beat it, its default catches the rest, and nothing is refused only
when nothing prices a model."""

from __future__ import annotations

import math
import random
import warnings
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from genai_prices import Usage, calc_price, data_snapshot

from ratewarden.calls import Call
from ratewarden.policy import parse_policy
from ratewarden.policy.errors import PolicyError
from ratewarden.policy.prices import PICO, Price, Prices, Tiered, _from_genai, price_of
from ratewarden.vocabulary import CallKind
from ratewarden.wire.bodies import ModelUsage


def genai_micros(model_price: object, usage: ModelUsage) -> int | None:
    """genai-prices' price of `usage`, in micro-USD rounded up (None: it refuses it)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = model_price.calc_price(Usage(**usage.model_dump()))  # type: ignore[attr-defined]
    except ValueError:
        return None
    micros: int = math.ceil(found["total_price"] * Decimal(1_000_000))
    return micros


def random_usage(rnd: random.Random) -> ModelUsage:
    total = rnd.choice([0, 1, 7, 1000, 128_000, 200_000, 200_001, rnd.randrange(2_000_000)])
    read = rnd.randrange(total + 1)
    written = rnd.randrange(total - read + 1)
    out = rnd.choice([0, 1, rnd.randrange(200_000)])
    return ModelUsage(
        input_tokens=total, output_tokens=out, cache_read_tokens=read, cache_write_tokens=written
    )


def test_every_model_of_the_snapshot_is_priced_as_genai_prices_prices_it() -> None:
    """2 330 models (0.2.3), tiered ones included: equal to the micro-unit on every usage."""
    rnd = random.Random(31)
    now = datetime.now(tz=UTC)
    compared = 0
    for provider in data_snapshot.get_snapshot().providers:
        for model in provider.models:
            model_price = model.get_prices(now)
            ours = _from_genai(model_price)
            for _ in range(12):
                usage = random_usage(rnd)
                want = genai_micros(model_price, usage)
                if want is None:
                    continue
                assert ours.micros(usage) == want, (provider.id, model.id, usage)
                compared += 1
    assert compared > 20_000


def test_the_oracle_is_calc_price_itself_for_a_named_model() -> None:
    usage = ModelUsage(input_tokens=12_345, output_tokens=6_789, cache_read_tokens=2_345)
    price = Prices().of("gpt-4o")
    assert price is not None
    found = calc_price(Usage(**usage.model_dump()), "gpt-4o").total_price
    assert found == Decimal("0.09582125")  # 10 000 x 2.5 + 2 345 x 1.25 + 6 789 x 10, per M
    assert price.micros(usage) == 95_822  # rounded up: a budget never gives money away


def test_a_cliff_tier_prices_every_token_at_the_tier_reached() -> None:
    # 3 USD per MTok (6 past 200 000 input tokens) in, 15 out.
    price = Price(Tiered(3 * PICO, ((200_000, 6 * PICO),)), Tiered(15 * PICO))
    assert price.micros(ModelUsage(input_tokens=200_000)) == 600_000  # at the start: base
    assert price.micros(ModelUsage(input_tokens=200_001)) == 1_200_006  # past it: all of it
    # The most a call can cost reads the tier its input reaches, output at the output price.
    assert price.most(200_001, 1000) == 1_200_006 + 15_000


def test_a_missing_cache_price_charges_cached_tokens_as_input() -> None:
    line = price_of({"input": 2.0, "output": 8.0})
    usage = ModelUsage(input_tokens=1000, output_tokens=10, cache_read_tokens=900)
    assert line.micros(usage) == 2000 + 80
    cached = price_of({"input": 2.0, "output": 8.0, "cache_read": 0.5})
    assert cached.micros(usage) == 100 * 2 + 900 // 2 + 80


POLICY = b"""\
version: 1
defaults: {max_output_tokens: 100}
models:
  gpt-4o: {input: 1, output: 1}
  "my-local-*": {input: 0, output: 0}
  "my-*": {input: 9, output: 9}
rules:
  - {name: spend, match: {kind: any}, budget: 5.00/day}
"""


def model_call(model: str, **tokens: int) -> Call:
    return Call("u", model, "c", kind=CallKind.MODEL, **tokens)  # type: ignore[arg-type]


def test_policy_lines_beat_genai_prices_exact_names_first_then_globs_in_order() -> None:
    policy = parse_policy(POLICY)
    assert policy.most_cost(model_call("gpt-4o", input_tokens=1000)) == 1000 + 100
    assert policy.most_cost(model_call("my-local-llama", input_tokens=10**6)) == 0
    assert policy.most_cost(model_call("my-other", input_tokens=1)) == 9 + 900
    assert policy.most_cost(model_call("gpt-4o-mini")) == math.ceil(100 * 0.6)  # genai-prices
    assert policy.most_cost(model_call("no-such-model-anywhere")) is None


def test_a_default_price_catches_what_nothing_else_prices() -> None:
    policy = parse_policy(
        POLICY.replace(
            b"max_output_tokens: 100}",
            b"max_output_tokens: 100, model_price: {input: 100, output: 200}}",
        )
    )
    assert policy.most_cost(model_call("no-such-model-anywhere", max_output_tokens=5)) == 1000
    assert policy.usage_cost("gpt-4o", ModelUsage(input_tokens=3)) == 3  # its line still wins


@pytest.mark.parametrize(
    ("policy", "problem"),
    [
        (
            "rules:\n  - {name: r, match: {model: no-such-model}, budget: 1/day}",
            "rules[0].match.model: no price is known for model 'no-such-model'",
        ),
        ("models: {m: {input: -1, output: 0}}", "models.m.input: Input should be greater"),
        ("models: {m: {input: 1e-11, output: 0}}", "a price has at most ten decimals"),
        ("models: {m: {input: .nan, output: 0}}", "models.m.input"),
        ("models: {m: {input: 1}}", "models.m.output: required field is missing"),
        ("models: {m: {input: 1, output: 1, audio: 3}}", "models.m.audio: unknown field"),
        ("defaults: {max_output_tokens: 0}", "defaults.max_output_tokens"),
        ("defaults: {max_output_tokens: '10'}", "defaults.max_output_tokens"),
        (
            "rules:\n  - {name: r, match: {kind: model, tool: t}, budget: 1/day}",
            "tool: asks about a tool call, and kind: model covers model calls",
        ),
        (
            "rules:\n  - {name: r, match: {kind: any, destructive: true}, budget: 1/day}",
            "destructive: asks about a tool call, and kind: any covers model calls",
        ),
        (
            "rules:\n  - {name: r, match: {kind: tool, model: gpt-4o}, budget: 1/day}",
            "model: names model calls; kind: tool says otherwise",
        ),
        ("rules:\n  - {name: r, match: {kind: models}, budget: 1/day}", "match.kind"),
        (
            "rules:\n  - {name: r, match: {kind: any}, budget: 1/day, currency: EUR}",
            "rules[0].currency: model calls are priced in USD: a EUR budget cannot count them",
        ),
        (
            "rules:\n  - {name: r, rate: 10 tokens/minute, algorithm: token_bucket}",
            "a token rate counts in fixed windows",
        ),
        (
            "rules:\n  - {name: r, match: {kind: tool}, rate: 10 tokens/minute}",
            "a token rate counts model calls' tokens: not kind: tool",
        ),
        (
            "rules:\n  - {name: r, rate: 10 tokens/minute}\n"
            "overrides:\n  - {rule: r, users: [a], rate: 5/minute}",
            "overrides[0].rate: rule 'r' counts tokens",
        ),
    ],
)
def test_bad_model_policies_name_the_field(policy: str, problem: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(f"version: 1\n{policy}\n".encode())
    assert problem in str(raised.value)


def test_a_rule_covers_tool_calls_unless_it_says_otherwise() -> None:
    policy = parse_policy(
        b"""\
version: 1
rules:
  - {name: tools, rate: 10/minute}
  - {name: models, match: {kind: model}, rate: 10/minute}
  - {name: gpt, match: {model: "gpt-*"}, rate: 10/minute}
  - {name: both, match: {kind: any}, budget: 5/day}
  - {name: tokens, rate: 1000 tokens/minute}
  - {name: alice, match: {user: alice}, concurrency: 2}
"""
    )
    tool = Call("alice", "gpt-4o", "c")  # a tool that happens to be named as a model
    model = model_call("gpt-4o")
    assert [a.rule.name for a in policy.applicable(tool)] == ["tools", "both", "alice"]
    assert [a.rule.name for a in policy.applicable(model)] == ["models", "gpt", "both", "tokens"]
    other = model_call("claude-x")
    assert [a.rule.name for a in policy.applicable(other)] == ["models", "both", "tokens"]


def test_metric_labels_of_models_are_the_policys_patterns() -> None:
    policy = parse_policy(POLICY)
    assert policy.metric_model("gpt-4o") == "gpt-4o"
    assert policy.metric_model("my-local-llama") == "my-local-*"
    assert policy.metric_model("some-model-the-policy-never-names") == "other"


def test_a_price_past_twenty_decimals_is_priced_by_genai_prices_itself() -> None:
    from genai_prices.types import ModelPrice

    model_price = ModelPrice(input_mtok=Decimal("0.1" + "0" * 24 + "1"), output_mtok=Decimal(2))
    ours = _from_genai(model_price)
    assert ours.exact is not None  # not our sums: they would round the price
    usage = ModelUsage(input_tokens=10**7, output_tokens=3)
    assert ours.micros(usage) == genai_micros(model_price, usage) == 1_000_007  # rounded up
