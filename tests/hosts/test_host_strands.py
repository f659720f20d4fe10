"""Strands Agents: RatewardenHook inside a real strands-agents 1.62.0 Agent, offline.

The host proofs run `tests/hosts/drivers/strands_agent.py` with the python of the strands host
venv (tests/helpers/hostenv.py) against a real `ratewarden serve`: a scripted model, real tools
(a Strands `@tool`, and the tools of a real MCP server over stdio), and the counts taken
from what the tools wrote, not from the hook. The adapter tests below them run in this
venv, where strands is not installed, with stand-in events: the module must import and
work without strands.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ratewarden.client import ClientError, Guard
from ratewarden.integrations.strands import RatewardenHook
from ratewarden.wire.bodies import CheckRequest, CheckResponse
from tests.hosts.scenario import (
    TERMINAL_POLICY,
    clean_environment,
    host_python,
    nowhere,
    read_usage,
    run_driver,
    running_daemon,
)

DRIVER = Path(__file__).parent / "drivers" / "strands_agent.py"
RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
UNAVAILABLE = "Tool guard unavailable; terminal calls are paused"

# One terminal call in flight per user: without a settle after each call, the second
# sequential call would be refused, so ten allowed calls prove ten settles.
SETTLE_POLICY = (
    TERMINAL_POLICY
    + """\
  - name: terminal-one-at-a-time
    match: {tool: terminal}
    concurrency: 1
"""
)

# Each rule matches on metadata only, so a tool meets it only if its metadata arrived.
MCP_POLICY = """\
version: 1
rules:
  - name: read-only-quota
    match: {read_only: true}
    per: [user, tool]
    rate: 1/minute
  - name: destructive-needs-a-human
    match: {destructive: true}
    rate: 0/minute
    on_exceed: ask
  - name: notes-off
    match: {tags: [notes]}
    rate: 0/minute
    message: "Notes are switched off"
"""


@pytest.fixture(scope="module")
def strands_python() -> Path:
    return host_python("strands")


def drive(python: Path, url: str, work: Path, **config: Any) -> dict[str, Any]:
    """Run the driver once; its report, with what the model received."""
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = run_driver(
        python,
        DRIVER,
        {**config, "work": str(work)},
        timeout=90,
        env=clean_environment(RATEWARDEN_URL=url),
    )
    return report


def usage(url: str, user: str) -> dict[str, dict[str, Any]]:
    return read_usage(url, user)


# -- the host proofs ---------------------------------------------------------------------


@pytest.mark.timeout(600)  # the first run builds the host venv
@pytest.mark.parametrize("ids", ["unique", "repeat"])
def test_eleventh_terminal_call_is_refused_and_ten_ran(
    strands_python: Path, tmp_path: Path, ids: str
) -> None:
    """`repeat`: every toolUseId is `call_0`, as some model servers send; still counted."""
    with running_daemon(SETTLE_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            strands_python, daemon.url, tmp_path, scenario="terminal", user="slack:U42", ids=ids
        )
        seen = usage(daemon.url, "slack:U42")

    results = report["tool_results"]
    assert len(results) == 11
    assert all(r["status"] == "success" for r in results[:10]), results
    assert results[10]["status"] == "error"
    assert RATE_MESSAGE in results[10]["text"]
    assert len(report["ran"]) == 10  # what the tool itself wrote
    assert report["model_turns"] == 12  # the model read the refusal and answered
    assert report["unreachable"] == 0
    assert seen["terminal-per-minute"]["used"] == 10  # counted for slack:U42
    assert seen["terminal-one-at-a-time"]["used"] == 0  # every slot released by a settle


def test_without_settle_the_cap_refuses_the_second_call(
    strands_python: Path, tmp_path: Path
) -> None:
    """The control for the proof above: a hook that never settles keeps its slot."""
    with running_daemon(SETTLE_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            strands_python,
            daemon.url,
            tmp_path,
            scenario="terminal",
            user="slack:U43",
            calls=2,
            settle=False,
        )
    first, second = report["tool_results"]
    assert first["status"] == "success"
    assert "Concurrency limit: max 1 terminal calls at once" in second["text"]
    assert len(report["ran"]) == 1


def test_each_settle_carries_the_digest_of_the_tool_result(
    strands_python: Path, tmp_path: Path
) -> None:
    """Issue #29 item 2: a call the daemon answered with `send_result` is settled with the
    digest of the ToolResult's status and content, as the model read them (not its
    toolUseId, which differs on every call): identical calls, identical digests."""
    from ratewarden.arguments import result_digest

    with running_daemon(SETTLE_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            strands_python, daemon.url, tmp_path, scenario="digest", user="slack:U44", calls=2
        )
    assert len(report["ran"]) == 2
    first, second = report["raw_results"]
    assert first == second == {"status": "success", "content": [{"text": "ran gh run view 7"}]}
    digests = [settle.get("result_digest") for settle in report["settles"]]
    assert digests == [result_digest(first)] * 2


def test_mcp_annotations_reach_the_daemon(strands_python: Path, tmp_path: Path) -> None:
    plan = ["lookup", "lookup", "wipe", "mystery", "note"]
    with running_daemon(MCP_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            strands_python, daemon.url, tmp_path, scenario="mcp", user="slack:U42", plan=plan
        )
    assert report["annotations"]["lookup"] == {"readOnlyHint": True}  # as Strands holds them
    lookup, lookup_again, wipe, mystery, note = (r["text"] for r in report["tool_results"])
    assert lookup == "lookup done"  # read-only: not destructive, so no human needed
    assert "Rate limit: max 1 lookup calls per minute" in lookup_again  # read_only arrived
    assert wipe.startswith("Rate limit: max 0 wipe calls per minute")  # destructiveHint
    assert "A human must approve this call" in wipe  # on_exceed: ask
    assert "A human must approve this call" in mystery  # unannotated: destructive (MCP)
    assert note == "Notes are switched off"  # tags from the hook's own metadata
    assert report["ran"] == ["lookup"]


@pytest.mark.parametrize(("fail", "runs"), [(None, 2), ("closed", 0)])
def test_unreachable_daemon(
    strands_python: Path, tmp_path: Path, fail: str | None, runs: int
) -> None:
    nobody = nowhere()
    report = drive(
        strands_python, nobody, tmp_path, scenario="terminal", user="u", calls=2, fail=fail
    )
    assert len(report["ran"]) == runs
    assert report["unreachable"] == 2
    texts = [r["text"] for r in report["tool_results"]]
    if fail == "closed":
        assert all(UNAVAILABLE in text for text in texts), texts
    else:
        assert texts == ["ran echo 0", "ran echo 1"]


# -- the adapter, without strands ----------------------------------------------------------


class RefusingGuard(Guard):
    """A daemon that refuses every check as a misconfigured one would (401)."""

    def __init__(self, fail: str = "open") -> None:
        super().__init__(nowhere(), fail=fail)
        self.asked: list[CheckRequest] = []

    def check(self, request: CheckRequest) -> CheckResponse:
        self.asked.append(request)
        raise ClientError(401, "missing or wrong bearer token")


def before(tool: str, state: dict[str, Any], use_id: str = "tooluse_7", spec: Any = None) -> Any:
    selected = None if spec is None else SimpleNamespace(tool_spec=spec)
    return SimpleNamespace(
        selected_tool=selected,
        tool_use={"toolUseId": use_id, "name": tool, "input": {}},
        invocation_state=state,
        cancel_tool=False,
    )


def after(event: Any, cancel_message: str | None = None, duration: float | None = 0.25) -> Any:
    return SimpleNamespace(
        selected_tool=event.selected_tool,
        tool_use=event.tool_use,
        invocation_state=event.invocation_state,
        result={"toolUseId": event.tool_use["toolUseId"], "status": "success", "content": []},
        exception=None,
        cancel_message=cancel_message,
        duration=None if cancel_message else duration,
    )


@pytest.fixture
def hook_daemon(tmp_path: Path) -> Iterator[str]:
    policy = """\
version: 1
rules:
  - name: slow-one-at-a-time
    match: {tool: slow}
    concurrency: 1
  - name: fast-per-minute
    match: {tool: fast}
    rate: 100/minute
"""
    with running_daemon(policy, tmp_path / "daemon") as daemon:
        yield daemon.url


def test_request_carries_user_session_team_and_metadata() -> None:
    hook = RatewardenHook(
        guard=RefusingGuard(),
        user=lambda state: state["who"],
        metadata={"lookup": {"destructiveHint": False, "tags": ["search", "", 5]}},
    )
    spec = {"name": "lookup", "annotations": {"readOnlyHint": True, "openWorldHint": "yes"}}
    state = {"who": "slack:U42", "session_id": "s1", "team_id": "t1", "user_id": "ignored"}
    request = hook.request_for(before("lookup", state, spec=spec))
    assert request is not None
    assert (request.user, request.tool, request.session, request.team) == (
        "slack:U42",
        "lookup",
        "s1",
        "t1",
    )
    assert request.call_id is not None
    assert request.call_id.startswith("tooluse_7~")
    assert request.metadata is not None
    assert request.metadata.read_only is True  # the MCP annotation
    assert request.metadata.destructive is False  # the operator's, in MCP's name
    assert request.metadata.open_world is None  # not a boolean: ignored, not guessed
    assert request.metadata.tags == ["search"]
    hook.guard.close()


def test_every_attempt_gets_its_own_call_id() -> None:
    hook = RatewardenHook(guard=RefusingGuard())
    ids = {hook.request_for(before("t", {})).call_id for _ in range(3)}  # type: ignore[union-attr]
    assert len(ids) == 3
    hook.guard.close()


def test_default_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATEWARDEN_USER", "ops-bot")
    hook = RatewardenHook(guard=RefusingGuard())
    request = hook.request_for(before("t", {"agent": object()}))
    assert request is not None
    assert request.user == "ops-bot"
    hook.guard.close()


async def test_settles_exactly_the_calls_that_hold_a_slot(
    hook_daemon: str, caplog: pytest.LogCaptureFixture
) -> None:
    hook = RatewardenHook(guard=Guard(hook_daemon))
    state = {"user_id": "alice"}
    first, second = before("slow", state, "a"), before("slow", state, "b")
    await hook.before_tool_call(first)
    await hook.before_tool_call(second)  # first still running: refused
    assert first.cancel_tool is False
    assert second.cancel_tool == "Concurrency limit: max 1 slow calls at once"
    await hook.after_tool_call(after(second, cancel_message=second.cancel_tool))  # not ours
    await hook.after_tool_call(after(first))
    third = before("slow", state, "c")
    await hook.before_tool_call(third)  # the settle freed the slot
    assert third.cancel_tool is False
    # Allowed by us, then cancelled by a later hook: its slot is released all the same.
    await hook.after_tool_call(after(third, cancel_message="cancelled by another hook"))
    fourth = before("slow", state, "d")
    await hook.before_tool_call(fourth)
    assert fourth.cancel_tool is False
    # A call whose rules hold nothing is not settled (the daemon would answer 404).
    caplog.set_level(logging.WARNING)
    fast = before("fast", state, "e")
    await hook.before_tool_call(fast)
    await hook.after_tool_call(after(fast))
    assert "e" not in hook._held
    assert not [r for r in caplog.records if r.name.startswith("ratewarden")]
    hook.guard.close()


@pytest.mark.parametrize(("fail", "cancel"), [("open", False), ("closed", UNAVAILABLE)])
async def test_a_refused_check_is_answered_by_the_fail_mode(fail: str, cancel: str | bool) -> None:
    hook = RatewardenHook(guard=RefusingGuard(fail))
    event = before("terminal", {"user_id": "u"})
    await hook.before_tool_call(event)
    assert event.cancel_tool == cancel
    too_long = before("terminal", {"user_id": "u" * 300})  # past the API's limit
    await hook.before_tool_call(too_long)
    assert too_long.cancel_tool == cancel
    hook.guard.close()


async def test_a_call_another_hook_cancelled_is_not_checked() -> None:
    guard = RefusingGuard()
    hook = RatewardenHook(guard=guard)
    event = before("terminal", {"user_id": "u"})
    event.cancel_tool = "no"
    await hook.before_tool_call(event)
    assert guard.asked == []
    assert event.cancel_tool == "no"
    guard.close()


def test_guard_and_fail_together_is_an_error() -> None:
    guard = RefusingGuard()
    with pytest.raises(ValueError, match="fail="):
        RatewardenHook(guard=guard, fail="closed")
    guard.close()
