"""The token-rate counter kind as the engine and the stores read it (issue 31, item 2):
what it is not (a rate kind, a loop hold, a hold that expires) and what it is (an op
whose hold line is recorded whenever the call is allowed, one key at settle)."""

from __future__ import annotations

from ratewarden.limiter.ops import (
    HOLDING,
    RATE_KINDS,
    SETTLED_KINDS,
    CounterOp,
    Hold,
    Kind,
    Role,
    decode_holds,
)
from ratewarden.limiter.script import SOURCE, hold_keys, hold_values

KEY = "rw:{tokens|user=alice}:tk"


def test_a_token_rate_is_neither_a_rate_kind_nor_a_loop_hold_nor_held() -> None:
    assert Kind.TOKENS.value == "tk"
    assert Kind.TOKENS not in RATE_KINDS
    assert Kind.TOKENS not in HOLDING  # nothing expires or is released; record TTL unchanged
    assert Kind.TOKENS in SETTLED_KINDS
    assert not Hold(Kind.TOKENS, KEY, 100, "tokens", (1_000, 60_000, 0)).loop


def test_its_hold_line_is_recorded_whatever_its_verdict_or_role() -> None:
    for role in Role:
        op = CounterOp(KEY, Kind.TOKENS, role, 1_000, 60_000, rule="tokens")
        assert op.consumes(admitted=False)
        assert decode_holds(op.hold_line) == [Hold(Kind.TOKENS, KEY, 0, "tokens")]
    assert CounterOp(KEY, Kind.TOKENS, Role.ENFORCE, 1, 60_000).hold_line == ""


def test_a_settle_reaches_it_by_one_key_with_its_tokens_and_window() -> None:
    hold = Hold(Kind.TOKENS, KEY, 321, "tokens", (1_000, 60_000, 0))
    assert hold_keys([hold]) == [KEY]
    assert hold_values(hold) == ("tk", 321, 1_000, 60_000, 0)
    assert "local function token_window(" in SOURCE
    assert "tk = token_window" in SOURCE
