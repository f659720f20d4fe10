"""ratewarden.mcp.guard: annotations to metadata, and one session's checks, asks and
settles against the daemon's app in-process (the guard imports no MCP SDK)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from ratewarden.client import AsyncGuard
from ratewarden.mcp.guard import (
    GuardAction,
    SessionGuard,
    ToolCatalog,
    can_elicit,
    refusal_result,
    tool_metadata,
)
from ratewarden.wire.bodies import ToolMetadata
from tests.helpers.app import build_app, serving

POLICY = """\
version: 1
rules:
  - name: one-at-a-time
    match: {tool: slow}
    concurrency: 1
  - name: no-destructive
    match: {destructive: true, tool: "drop_*"}
    deny: "No destructive tools here"
  - name: deploy-asks
    match: {tool: deploy}
    ask: "deploy needs a human's approval"
"""


def test_a_tools_hints_become_metadata() -> None:
    tool = {"name": "read", "annotations": {"readOnlyHint": True, "title": "Read"}}
    assert tool_metadata(tool) == ToolMetadata(read_only=True)
    both = {"annotations": {"destructiveHint": False, "openWorldHint": True}}
    assert tool_metadata(both) == ToolMetadata(destructive=False, open_world=True)


@pytest.mark.parametrize(
    "tool",
    [{"name": "x"}, {"annotations": None}, {"annotations": {"title": "X"}},
     {"annotations": {"readOnlyHint": "yes"}}, {"annotations": []}],
)  # fmt: skip
def test_an_unannotated_tool_is_unclassified(tool: dict[str, object]) -> None:
    assert tool_metadata(tool) is None


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [({"elicitation": {}}, True), ({"elicitation": {"form": {}}}, True),
     ({"elicitation": {"url": {}}}, False), ({"sampling": {}}, False), (None, False),
     ({"elicitation": None}, False)],
)  # fmt: skip
def test_form_elicitation_is_what_an_ask_needs(capabilities: object, expected: bool) -> None:
    assert can_elicit(capabilities) is expected


def test_the_catalog_reads_pages_and_a_full_listing_replaces_it() -> None:
    catalog = ToolCatalog()
    catalog.read({"tools": [{"name": "a", "annotations": {"readOnlyHint": True}}]})
    catalog.read({"tools": [{"name": "b"}, "junk", {"name": 3}], "nextCursor": "x"})
    assert catalog.metadata("a") == ToolMetadata(read_only=True)
    assert catalog.metadata("b") is None
    catalog.replace([{"tools": [{"name": "b", "annotations": {"destructiveHint": True}}]}])
    assert catalog.metadata("a") is None  # no longer listed
    assert catalog.metadata("b") == ToolMetadata(destructive=True)


def test_a_refusal_is_an_error_result_with_the_message() -> None:
    assert refusal_result("No.") == {"content": [{"type": "text", "text": "No."}], "isError": True}


@pytest.fixture
async def guard() -> AsyncIterator[AsyncGuard]:
    async with serving(build_app(POLICY)) as http:
        transport = http._transport
        assert isinstance(transport, httpx.ASGITransport)
        yield AsyncGuard("http://test", transport=transport)


async def never_asked(tool: str, message: str) -> bool:
    raise AssertionError("asked")


async def test_annotations_reach_the_policy(guard: AsyncGuard) -> None:
    session = SessionGuard(guard, user="u")
    session.catalog.read({"tools": [{"name": "drop_x", "annotations": {"destructiveHint": True}}]})
    verdict = await session.check(1, {"name": "drop_x"}, never_asked)
    assert verdict.decision is GuardAction.REFUSE
    assert verdict.message.startswith("No destructive tools here")
    session.catalog.replace(
        [{"tools": [{"name": "drop_x", "annotations": {"readOnlyHint": True}}]}]
    )
    assert (await session.check(2, {"name": "drop_x"}, never_asked)).decision is GuardAction.FORWARD


async def test_a_call_holds_its_slot_until_answered(guard: AsyncGuard) -> None:
    session = SessionGuard(guard, user="u")
    assert (await session.check(1, {"name": "slow"}, never_asked)).decision is GuardAction.FORWARD
    session.sent(1)
    busy = await session.check(2, {"name": "slow"}, never_asked)
    assert busy.decision is GuardAction.REFUSE
    assert session.waiting(1)
    settle = session.finish(1, error=True)
    assert settle is not None
    await settle()
    assert not session.waiting(1)
    assert (await session.check(3, {"name": "slow"}, never_asked)).decision is GuardAction.FORWARD


async def test_a_cancelled_or_abandoned_call_frees_its_slot(guard: AsyncGuard) -> None:
    session = SessionGuard(guard, user="u")
    await session.check("a", {"name": "slow"}, never_asked)
    await session.cancel("a")
    assert (await session.check("b", {"name": "slow"}, never_asked)).decision is GuardAction.FORWARD
    await session.close()  # "b" is abandoned
    other = SessionGuard(guard, user="u")
    assert (await other.check("c", {"name": "slow"}, never_asked)).decision is GuardAction.FORWARD


async def test_an_ask_goes_to_the_user_when_the_client_can_elicit(guard: AsyncGuard) -> None:
    asked: list[tuple[str, str]] = []

    async def yes(tool: str, message: str) -> bool:
        asked.append((tool, message))
        return True

    session = SessionGuard(guard, user="u")
    session.initialize({"capabilities": {"elicitation": {}}})
    assert (await session.check(1, {"name": "deploy"}, yes)).decision is GuardAction.FORWARD
    assert asked == [("deploy", "deploy needs a human's approval")]


async def test_an_ask_is_refused_when_declined_or_when_no_one_can_be_asked(
    guard: AsyncGuard,
) -> None:
    async def no(tool: str, message: str) -> bool:
        return False

    session = SessionGuard(guard, user="u")
    session.initialize({"capabilities": {"elicitation": {"form": {}}}})
    declined = await session.check(1, {"name": "deploy"}, no)
    assert declined.decision is GuardAction.REFUSE
    assert "did not approve" in declined.message
    # A 2026-07-28 client declares elicitation in each request's _meta, but cannot take a
    # request outside one: it is not asked.
    meta: dict[str, object] = {
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}
    }
    unasked = await SessionGuard(guard, user="u").check(
        2, {"name": "deploy", "_meta": meta}, never_asked
    )
    assert unasked.decision is GuardAction.REFUSE
    assert unasked.message.startswith("deploy needs a human's approval")
    assert "A human must approve this call" in unasked.message


async def test_an_unnamed_call_goes_to_the_server_for_its_error(guard: AsyncGuard) -> None:
    session = SessionGuard(guard, user="u")
    assert (await session.check(1, {}, never_asked)).decision is GuardAction.FORWARD
    assert not session.waiting(1)


async def test_a_call_cancelled_while_asked_is_dropped_and_settled(guard: AsyncGuard) -> None:
    session = SessionGuard(guard, user="u")
    session.initialize({"capabilities": {"elicitation": {}}})

    async def cancelled_meanwhile(tool: str, message: str) -> bool:
        await session.cancel(1)  # the client gave up while its user was being asked
        return True

    verdict = await session.check(1, {"name": "deploy"}, cancelled_meanwhile)
    assert verdict.decision is GuardAction.DROP
    assert not session.waiting(1)
