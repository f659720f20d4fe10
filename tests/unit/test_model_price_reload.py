"""A reload that takes a model's price away between a call's check and its settle: the
settle cannot price the usage, so it charges what the check reserved (engine.settle's
documented rule), never nothing, and the budget holds no reservation afterwards."""

from __future__ import annotations

from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.service.convert import to_call
from ratewarden.store import MemoryStore
from ratewarden.wire.bodies import CheckRequest, ModelUsage

PRICED = b"""\
version: 1
defaults: {max_output_tokens: 1000}
models:
  "house-model": {input: 1.0, output: 4.0}
rules:
  - name: model-spend
    match: {kind: model}
    per: [user]
    budget: 10.00/day
"""
UNPRICED = PRICED.replace(b'  "house-model": {input: 1.0, output: 4.0}\n', b"").replace(
    b"models:\n", b""
)


async def test_a_price_removed_before_the_settle_charges_the_reservation() -> None:
    engine = Engine(parse_policy(PRICED), MemoryStore(FakeClock()))
    body = CheckRequest.model_validate(
        {"user": "u", "kind": "model", "model": "house-model", "input_tokens": 1000}
    )
    decision = await engine.check(to_call(body))
    assert decision.allowed
    reserved = next(v.reserved for v in decision.limits if v.rule == "model-spend")
    assert reserved == 0.005  # 1 000 x 1.0 + 1 000 x 4.0 per million tokens

    engine.policy = parse_policy(UNPRICED)  # as a reload swaps it
    settled = await engine.settle(decision.call_id, usage=ModelUsage(input_tokens=10))
    assert settled.outcome == "settled"
    assert settled.charged == {"model-spend": 0.005}  # the reservation, not 10 tokens' 0.00001
    usage = {u.rule: u for u in await engine.usage("u", "house-model")}
    assert usage["model-spend"].reserved == 0
