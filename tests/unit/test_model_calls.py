"""integrations/_model_calls.py: what a hostile or careless host hands a model check
becomes a request the wire takes, and an allowed call is settled once.

A fake guard records the requests (the adapters' end-to-end proofs run the real
frameworks against a real daemon: tests/hosts/test_models_*.py)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from ratewarden.client import ClientError
from ratewarden.integrations._lifecycle import usage_settlement
from ratewarden.integrations._model_calls import (
    UNKNOWN_MODEL,
    ModelCall,
    check_model,
    estimated_tokens,
    text_leaves,
    token_count,
)
from ratewarden.vocabulary import MAX_TOKENS, CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest


class FakeGuard:
    """Answers every check with `decision` (or raises `error`); records what it is sent."""

    def __init__(self, decision: str = "allow", error: Exception | None = None) -> None:
        self.fail = "open"
        self.decision = decision
        self.error = error
        self.checks: list[CheckRequest] = []
        self.settles: list[tuple[str, SettleRequest]] = []

    async def check(self, request: CheckRequest) -> CheckResponse:
        if self.error is not None:
            raise self.error
        self.checks.append(request)
        allowed = self.decision == "allow"
        return CheckResponse(
            decision=self.decision,
            allowed=allowed,
            message="" if allowed else "no",
            call_id=request.call_id or "",
        )

    async def settle(self, call_id: str, request: SettleRequest) -> None:
        self.settles.append((call_id, request))


def check(guard: FakeGuard, **given: Any) -> tuple[CheckResponse, ModelCall | None]:
    fields = {"user": "alice", "model": "gpt-4o", "input_tokens": 10, "max_output_tokens": 100}
    return asyncio.run(check_model(guard, host="test", **{**fields, **given}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        (12, 12),
        (12.9, 12),
        (-5, 0),
        (MAX_TOKENS * 10, MAX_TOKENS),
        (math.inf, MAX_TOKENS),
        (-math.inf, None),
        (math.nan, None),
        (True, None),  # a bool is no count
        ("8000", None),  # nor is text: the daemon's default then
        (None, None),
    ],
)
def test_a_token_count_is_one_the_wire_takes(given: object, sent: int | None) -> None:
    assert token_count(given) == sent


def test_odd_counts_reach_the_daemon_bounded() -> None:
    guard = FakeGuard()
    check(guard, input_tokens=-3, max_output_tokens=10**12)
    [request] = guard.checks
    assert (request.input_tokens, request.max_output_tokens) == (0, MAX_TOKENS)
    assert request.kind == "model"


@pytest.mark.parametrize("model", ["", None, 42])
def test_a_model_without_a_name_is_checked_as_unknown(model: object) -> None:
    guard = FakeGuard()
    check(guard, model=model)
    assert guard.checks[0].model == UNKNOWN_MODEL


def test_a_long_or_odd_model_name_is_mapped_not_refused() -> None:
    guard = FakeGuard()
    odd = "gpt-4o\x00" + "x" * 1000
    check(guard, model=odd, user="bob\n")
    [request] = guard.checks
    assert request.model is not None
    assert request.model != odd
    assert len(request.model) <= 256
    assert "\x00" not in request.model
    assert request.user != "bob\n"
    # The same name maps the same way: one counter per model.
    check(guard, model=odd)
    assert guard.checks[1].model == request.model


def test_a_refused_request_is_answered_by_the_fail_mode() -> None:
    guard = FakeGuard(error=ClientError(422, "bad"))
    answer, call = check(guard)
    assert answer.allowed
    assert answer.degraded
    assert call is None  # a fail-open answer holds nothing to settle
    guard.fail = "closed"
    answer, call = check(guard)
    assert not answer.allowed
    assert call is None


def test_a_denied_call_has_nothing_to_settle() -> None:
    answer, call = check(FakeGuard("deny"))
    assert not answer.allowed
    assert call is None


def test_an_allowed_call_is_settled_once_with_bounded_usage() -> None:
    guard = FakeGuard()
    _, call = check(guard)
    assert call is not None
    usage = {"input_tokens": 100, "output_tokens": -4, "cache_read_tokens": 500, "extra": "x"}
    asyncio.run(call.settle(usage))
    asyncio.run(call.settle_failed())  # too late: settled already
    [(call_id, settle)] = guard.settles
    assert call_id == call.call_id
    assert settle.usage is not None
    assert settle.usage.output_tokens == 0
    assert settle.usage.cache_read_tokens == 100  # never more than the input
    assert settle.status == CallStatus.OK


def test_a_call_without_usage_is_settled_without_usage() -> None:
    """The daemon then charges its whole reservation."""
    guard = FakeGuard()
    _, call = check(guard)
    assert call is not None
    asyncio.run(call.settle(None))
    [(_, settle)] = guard.settles
    assert settle.usage is None
    assert settle.cost is None


def test_a_failed_call_used_nothing_and_a_cut_one_is_unknown() -> None:
    guard = FakeGuard()
    _, failed = check(guard)
    _, cut = check(guard)
    assert failed is not None
    assert cut is not None
    asyncio.run(failed.settle_failed())
    asyncio.run(cut.settle_unknown())
    (_, first), (_, second) = guard.settles
    assert first.usage is not None
    assert first.usage.input_tokens == first.usage.output_tokens == 0
    assert first.status == CallStatus.ERROR
    assert second.usage is None
    assert second.status == CallStatus.CANCELLED


def test_text_leaves_skip_names_and_end_on_cycles() -> None:
    items: list[Any] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "arguments": '{"a": 1}', "id": "x"},
    ]
    items.append(items)  # a cycle
    found = list(text_leaves(items, frozenset({"type", "role", "call_id", "id"})))
    assert found.count("hi") >= 1
    assert '{"a": 1}' in found
    assert not {"message", "user", "c1", "x", "function_call"} & set(found)


def test_a_request_the_estimate_cannot_read_is_checked_without_input_tokens() -> None:
    def unreadable() -> Any:
        yield "fine"
        raise TypeError("a part pydantic cannot dump")

    assert estimated_tokens(lambda: ["12345678"]) == 2
    assert estimated_tokens(unreadable) is None


def test_a_user_lookup_that_returns_no_string_still_checks() -> None:
    guard = FakeGuard()
    check(guard, user=77)
    assert guard.checks[0].user == "77"


@pytest.mark.parametrize(
    ("counts", "sent"),
    [
        # A host's sum of input and cache counts past the cap is cut to it, the caches
        # within the input (the check each adapter used to make on its own).
        ((MAX_TOKENS + 5, 10**12, MAX_TOKENS, 7), (MAX_TOKENS, MAX_TOKENS, MAX_TOKENS, 0)),
        ((-3, -4, -5, -6), (0, 0, 0, 0)),  # a provider's negative count is none
        ((100, 20, 30, 90), (100, 20, 30, 70)),  # cache reads first, writes in what is left
    ],
)
def test_every_adapters_usage_settle_is_bounded_in_one_place(
    counts: tuple[int, int, int, int], sent: tuple[int, int, int, int]
) -> None:
    usage = usage_settlement(*counts).usage
    assert usage is not None
    found = (usage.input_tokens, usage.output_tokens)
    assert (*found, usage.cache_read_tokens, usage.cache_write_tokens) == sent
