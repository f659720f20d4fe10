"""The asyncio adapters' shared pieces, in this venv (no host framework installed).

The adapters themselves are proven inside their real frameworks by
tests/hosts/test_host_pydantic_ai.py and tests/hosts/test_host_openai_agents.py; here: one guard per
event loop, call ids, and that a refused request never raises into the agent.
"""

from __future__ import annotations

import asyncio
import importlib

import pytest

from ratewarden.client import AsyncGuard, ClientError
from ratewarden.integrations._async import LoopGuards, check_call
from ratewarden.vocabulary import MAX_CALL_ID
from ratewarden.vocabulary import call_id as new_call_id
from ratewarden.wire.bodies import CheckRequest, CheckResponse
from tests.hosts.scenario import nowhere


def test_one_guard_per_event_loop_built_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    guards = LoopGuards(None, "closed")
    monkeypatch.setenv("RATEWARDEN_URL", nowhere())  # read at first use, not before

    async def twice() -> tuple[AsyncGuard, AsyncGuard]:
        return guards.get(), guards.get()

    first, again = asyncio.run(twice())
    second, _ = asyncio.run(twice())
    assert first is again  # one loop, one guard
    assert second is not first  # httpx's async pool cannot outlive its loop
    assert first.fail == second.fail == "closed"


async def test_a_given_guard_is_used_as_it_is() -> None:
    guard = AsyncGuard(nowhere())
    assert LoopGuards(guard, None).get() is guard
    await guard.aclose()


def test_fail_is_checked_and_belongs_to_the_guard_when_one_is_given() -> None:
    with pytest.raises(ValueError, match="fail must be"):
        LoopGuards(None, "sometimes")
    with pytest.raises(ValueError, match=r"AsyncGuard\(fail=...\)"):
        LoopGuards(AsyncGuard(nowhere()), "closed")


def test_call_ids_lead_with_the_hosts_id_and_never_repeat() -> None:
    first, second = new_call_id("host", "call_1"), new_call_id("host", "call_1")
    assert first.startswith("call_1~")
    assert first != second  # a model reusing its ids is still counted
    assert new_call_id("pydantic-ai").startswith("pydantic-ai~")  # no id: the host's name
    assert len(new_call_id("host", "x" * 500)) == MAX_CALL_ID


class RefusingGuard(AsyncGuard):
    """A daemon refusing every check, as a misconfigured one would (401)."""

    async def check(self, request: CheckRequest) -> CheckResponse:
        raise ClientError(401, "missing or wrong bearer token")


@pytest.mark.parametrize(("fail", "allowed"), [("open", True), ("closed", False)])
async def test_a_refused_request_is_answered_by_the_fail_mode(fail: str, allowed: bool) -> None:
    guard = RefusingGuard(nowhere(), fail=fail)
    answer = await check_call(guard, user="u", tool="terminal", call_id="c1")
    assert (answer.allowed, answer.degraded) == (allowed, True)
    await guard.aclose()


async def test_input_the_api_refuses_never_raises_into_the_agent() -> None:
    guard = AsyncGuard(nowhere(), fail="closed")
    answer = await check_call(guard, user="u" * 300, tool="terminal", call_id="c1")
    assert answer.message == "Tool guard unavailable; terminal calls are paused"
    await guard.aclose()


@pytest.mark.parametrize(
    "module", ["ratewarden.integrations.pydantic_ai", "ratewarden.integrations.openai_agents"]
)
def test_the_adapters_import_without_their_framework(module: str) -> None:
    importlib.import_module(module)


async def test_settling_a_call_that_is_not_ours_does_nothing() -> None:
    from ratewarden.integrations.openai_agents import settle_tool_call

    await settle_tool_call(object())
