"""Issue #29 item 2: every adapter that settles sends the digest of the tool's result when
the daemon's check answer said `send_result`, and only then.

Each adapter is driven through its host's hooks as the host calls them, with the
framework's objects stood in (the frameworks are not installed in this venv; the host
tests under tests/hosts run the real ones). The daemon is a stand-in answering every
check allowed, holding a concurrency slot (so each call is settled either way) and with
`send_result` as the test says; it keeps the settle bodies it receives, which are what
the assertions read: `result_digest == arguments.result_digest(<what the tool returned,
as the host hands it over>)`, or no `result_digest` at all.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from ratewarden.arguments import result_digest
from ratewarden.client import AsyncGuard, Guard
from ratewarden.wire.bodies import CheckResponse
from tests.helpers.sdk_stand_ins import (
    ToolContext,
    ToolDecision,
    ToolGuardrail,
    ToolGuardrailFunctionOutput,
    ToolPermissionResult,
    stand_in,
)

URL = "http://daemon.test"
# A concurrency slot: the call holds something, so it is settled whatever send_result says.
SLOT = {"rule": "one-at-a-time", "kind": "concurrency", "limit": 1, "remaining": 0,
        "reset_after": 0.0}  # fmt: skip


@dataclass
class FakeDaemon:
    """The daemon's check, capabilities and settle routes; the settle bodies it received."""

    send_result: bool
    settles: list[dict[str, Any]] = field(default_factory=list)
    checks: int = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/capabilities":
            return httpx.Response(200, json={"policy_version": "v", "send_args": False})
        if path == "/v1/check":
            self.checks += 1
            body = json.loads(request.content)
            answer = CheckResponse(
                decision="allow",
                allowed=True,
                message="",
                call_id=body.get("call_id") or f"call-{self.checks}",
                limits=[SLOT],
                send_result=self.send_result,
            )
            return httpx.Response(200, json=answer.model_dump(mode="json"))
        if path.startswith("/v1/calls/") and path.endswith("/settle"):
            self.settles.append(json.loads(request.content or b"{}"))
            call_id = path.removeprefix("/v1/calls/").removesuffix("/settle")
            return httpx.Response(200, json={"call_id": call_id, "outcome": "settled"})
        return httpx.Response(404, json={"error": "not_found", "message": path, "fields": []})

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def guard(self) -> Guard:
        return Guard(URL, transport=self.transport)

    def async_guard(self) -> AsyncGuard:
        return AsyncGuard(URL, transport=self.transport)

    def assert_settled_with(self, result: Any) -> None:
        """One settle, carrying `result`'s digest exactly when the check asked for it."""
        [settle] = self.settles
        if self.send_result:
            assert settle["result_digest"] == result_digest(result)
        else:
            assert "result_digest" not in settle
        assert settle["status"] == "ok"


@pytest.fixture(params=[True, False], ids=["send_result", "no_send_result"])
def daemon(request: pytest.FixtureRequest) -> FakeDaemon:
    return FakeDaemon(send_result=request.param)


class WeakContext:
    """A host context object that can be a weak key (hashed by identity), as ADK's is."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


# -- LangChain --------------------------------------------------------------------------------


def _langchain_request() -> Any:
    tool_call = {"name": "ci_status", "args": {"run": 7}, "id": "call_1"}
    runtime = SimpleNamespace(context={"user_id": "u"}, config={})
    return SimpleNamespace(tool_call=tool_call, runtime=runtime)


def test_langchain_settles_with_the_tool_messages_content(daemon: FakeDaemon) -> None:
    from ratewarden.integrations.langchain import RatewardenMiddleware

    message = SimpleNamespace(content="CI run 7: running", status="success")  # a ToolMessage
    middleware = RatewardenMiddleware(daemon.guard())
    assert middleware.wrap_tool_call(_langchain_request(), lambda request: message) is message
    daemon.assert_settled_with("CI run 7: running")


async def test_langchain_async_settles_with_the_tool_messages_content(daemon: FakeDaemon) -> None:
    from ratewarden.integrations.langchain import RatewardenMiddleware

    content = [{"type": "text", "text": "CI run 7: running"}]  # content blocks
    message = SimpleNamespace(content=content, status="success")

    async def handler(request: Any) -> Any:
        return message

    middleware = RatewardenMiddleware(daemon.async_guard())
    assert await middleware.awrap_tool_call(_langchain_request(), handler) is message
    daemon.assert_settled_with(content)


def test_langchain_sends_no_digest_for_a_tool_that_raised(daemon: FakeDaemon) -> None:
    from ratewarden.integrations.langchain import RatewardenMiddleware

    def handler(request: Any) -> Any:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        RatewardenMiddleware(daemon.guard()).wrap_tool_call(_langchain_request(), handler)
    [settle] = daemon.settles
    assert settle["status"] == "error"
    assert "result_digest" not in settle


# -- Google ADK -------------------------------------------------------------------------------


async def test_adk_settles_with_the_tool_response(daemon: FakeDaemon) -> None:
    from ratewarden.integrations.adk import RatewardenPlugin

    plugin = RatewardenPlugin(daemon.async_guard())
    tool = SimpleNamespace(name="ci_status")
    context = WeakContext(
        tool_confirmation=None,
        function_call_id="fc-1",
        user_id="u",
        actions=SimpleNamespace(requested_tool_confirmations={}),
    )
    args = {"run": 7}
    assert (
        await plugin.before_tool_callback(tool=tool, tool_args=args, tool_context=context) is None
    )
    response = {"status": "running", "run": 7}
    after = plugin.after_tool_callback
    assert await after(tool=tool, tool_args=args, tool_context=context, result=response) is None
    daemon.assert_settled_with(response)


# -- CrewAI -----------------------------------------------------------------------------------


def test_crewai_settles_with_the_tool_result(daemon: FakeDaemon) -> None:
    from ratewarden.integrations.crewai import RatewardenHooks

    hooks = RatewardenHooks(guard=daemon.guard(), user="u")
    tool_input = {"run": 7}  # CrewAI hands one dict to both hooks of a call
    before = SimpleNamespace(tool_name="ci_status", tool_input=tool_input, crew=None)
    assert hooks.before_tool_call(before) is None
    after = SimpleNamespace(
        tool_name="ci_status",
        tool_input=tool_input,
        crew=None,
        tool_result="CI run 7: running",
        raw_tool_result="CI run 7: running",
    )
    assert hooks.after_tool_call(after) is None
    daemon.assert_settled_with("CI run 7: running")


# -- OpenAI Agents SDK ------------------------------------------------------------------------


@pytest.mark.parametrize("settled_by", ["output_guardrail", "run_hooks"])
async def test_openai_agents_settles_with_the_tools_output(
    daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch, settled_by: str
) -> None:
    stand_in(
        monkeypatch,
        "agents",
        ToolGuardrailFunctionOutput=ToolGuardrailFunctionOutput,
        ToolInputGuardrail=ToolGuardrail,
        ToolOutputGuardrail=ToolGuardrail,
    )
    from ratewarden.integrations import openai_agents

    check = openai_agents.make_ratewarden_guardrail(daemon.async_guard()).guardrail_function
    context = ToolContext("ci_status", "call_1", {"user_id": "u"})
    assert (await check(SimpleNamespace(context=context))).allowed
    output = "CI run 7: running"
    if settled_by == "output_guardrail":
        settle = openai_agents._make_settle_guardrail().guardrail_function
        assert (await settle(SimpleNamespace(context=context, output=output))).allowed
    else:
        await openai_agents.RatewardenRunHooks().on_tool_end(context, None, None, output)
    daemon.assert_settled_with(output)


# -- Strands ----------------------------------------------------------------------------------


async def test_strands_settles_with_the_tool_results_status_and_content(
    daemon: FakeDaemon,
) -> None:
    from ratewarden.integrations.strands import RatewardenHook

    hook = RatewardenHook(guard=daemon.guard())
    tool_use = {"name": "ci_status", "toolUseId": "tooluse_1", "input": {"run": 7}}
    before = SimpleNamespace(
        cancel_tool=False, tool_use=tool_use, invocation_state={"user_id": "u"}, selected_tool=None
    )
    await hook.before_tool_call(before)
    assert before.cancel_tool is False
    content = [{"text": "CI run 7: running"}]
    result = {"toolUseId": "tooluse_1", "status": "success", "content": content}
    after = SimpleNamespace(
        tool_use=tool_use, cancel_message=None, result=result, exception=None, duration=0.25
    )
    await hook.after_tool_call(after)
    # The toolUseId names the call, not what it returned: it is left out of the digest.
    daemon.assert_settled_with({"status": "success", "content": content})


# -- pydantic-ai-middleware -------------------------------------------------------------------


async def test_pydantic_ai_settles_with_the_tools_result(
    daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in(
        monkeypatch,
        "pydantic_ai_middleware",
        ToolDecision=ToolDecision,
        ToolPermissionResult=ToolPermissionResult,
    )
    from ratewarden.integrations.pydantic_ai import RatewardenMiddleware

    middleware = RatewardenMiddleware(daemon.async_guard())
    deps = {"user_id": "u"}
    allowed = await middleware.before_tool_call("ci_status", {"run": 7}, deps)
    assert allowed.decision == ToolDecision.ALLOW
    result = {"run": 7, "state": "running"}
    assert await middleware.after_tool_call("ci_status", {"run": 7}, result, deps) is result
    daemon.assert_settled_with(result)


# -- hermes (the plugin; its directory plugin registers the same hooks) -----------------------


def test_hermes_plugin_settles_with_the_post_tool_call_result(daemon: FakeDaemon) -> None:
    from ratewarden.integrations.hermes import RatewardenPlugin

    plugin = RatewardenPlugin(guard=daemon.guard(), user=lambda hook: "u")
    call = {"tool_name": "ci_status", "tool_call_id": "call_0", "session_id": "s"}
    assert plugin.pre_tool_call(**call, args={"run": 7}) is None
    result = '{"output": "CI run 7: running", "exit_code": 0}'  # hermes' result: JSON text
    plugin.post_tool_call(**call, args={"run": 7}, result=result, status="ok", duration_ms=12)
    daemon.assert_settled_with(result)


def test_hermes_plugin_sends_no_digest_for_a_blocked_call(daemon: FakeDaemon) -> None:
    from ratewarden.integrations.hermes import RatewardenPlugin

    plugin = RatewardenPlugin(guard=daemon.guard(), user=lambda hook: "u")
    call = {"tool_name": "ci_status", "tool_call_id": "call_0", "session_id": "s"}
    plugin.pre_tool_call(**call)
    plugin.post_tool_call(**call, result='{"error": "blocked"}', status="blocked", duration_ms=0)
    [settle] = daemon.settles
    assert (settle["status"], settle.get("result_digest")) == ("blocked", None)


# -- ContextForge -----------------------------------------------------------------------------


@dataclass
class _PluginResult:  # cpex.framework's ToolPreInvokeResult, ToolPostInvokeResult
    continue_processing: bool = True
    violation: Any = None


async def test_contextforge_settles_with_the_call_tool_result(
    daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in(
        monkeypatch,
        "cpex.framework",
        PluginViolation=dict,
        ToolPreInvokeResult=_PluginResult,
        ToolPostInvokeResult=_PluginResult,
    )
    from ratewarden.integrations import contextforge
    from ratewarden.integrations._async import LoopGuards

    # As __init__ does with a configured guard (its base class is the gateway's Plugin).
    plugin = contextforge.RatewardenPlugin.__new__(contextforge.RatewardenPlugin)
    plugin.settings = contextforge.PluginSettings.read({"default_user": "u"})
    plugin._guards = LoopGuards(daemon.async_guard(), None)
    context = SimpleNamespace(state={}, user_email="u@example.com", global_context=None)
    pre = await plugin.tool_pre_invoke(SimpleNamespace(name="ci_status", args={}), context)
    assert pre.continue_processing
    result = {
        "content": [{"type": "text", "text": "CI run 7: running", "_meta": {"at": "12:00:01"}}],
        "isError": False,
        "_meta": {"trace": "t-1"},
    }
    await plugin.tool_post_invoke(SimpleNamespace(name="ci_status", result=result), context)
    daemon.assert_settled_with(
        {
            "content": [{"type": "text", "text": "CI run 7: running"}],
            "structuredContent": None,
            "isError": False,
        }
    )


# -- the MCP result's digest ------------------------------------------------------------------


def test_an_mcp_result_is_digested_without_its_meta_in_one_spelling() -> None:
    """The proxy's plain JSON, another server's `_meta`, and a model's snake_case fields
    (ContextForge's) digest alike; what the model reads changing changes the digest."""
    from ratewarden.integrations._lifecycle import call_tool_result

    block = {"type": "text", "text": "ok"}
    wire: dict[str, Any] = {
        "content": [block],
        "structuredContent": {"state": "ok"},
        "isError": False,
        "_meta": {"trace": "a"},
    }
    other_meta = {**wire, "_meta": {"trace": "b"}, "content": [{**block, "_meta": {}}]}
    snake = SimpleNamespace(
        model_dump=lambda **_: {
            "content": [{"type": "text", "text": "ok"}],
            "structured_content": {"state": "ok"},
            "is_error": False,
        }
    )
    digests = {result_digest(call_tool_result(r)) for r in (wire, other_meta, snake)}
    assert len(digests) == 1
    changed = {**wire, "content": [{"type": "text", "text": "failed"}]}
    assert result_digest(call_tool_result(changed)) not in digests
    assert result_digest(call_tool_result({**wire, "isError": True})) not in digests


def test_an_embedded_resources_own_meta_is_not_digested() -> None:
    """An embedded resource's contents carry a `_meta` of their own (MCP's
    ResourceContents): a server's trace id there is the same result too, in the wire's
    JSON and in the SDK's models; the resource's text changing is another."""
    import mcp.types as mcp_types

    from ratewarden.integrations._lifecycle import call_tool_result

    def wire(meta: str, text: str = "log") -> dict[str, Any]:
        contents = {"uri": "file:///build.log", "text": text, "_meta": {"trace": meta}}
        block = {"type": "resource", "resource": contents, "_meta": {"trace": meta}}
        return {"content": [block], "isError": False, "_meta": {"trace": meta}}

    def model(meta: str) -> Any:
        contents = mcp_types.TextResourceContents(
            uri="file:///build.log", text="log", _meta={"trace": meta}
        )
        block = mcp_types.EmbeddedResource(type="resource", resource=contents)
        return mcp_types.CallToolResult(content=[block], _meta={"trace": meta})

    results = [wire("a"), wire("b"), model("c"), model("d")]
    digests = {result_digest(call_tool_result(r)) for r in results}
    assert len(digests) == 1
    assert result_digest(call_tool_result(wire("a", text="other log"))) not in digests


# -- results a canonical JSON cannot carry ----------------------------------------------------


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("a host object that cannot be shown")


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


UNENCODABLE = {
    "huge-int": {"n": 10**5000},  # past Python's int-to-text limit: ValueError
    "deep": _nested(100_000),  # RecursionError in the encoder and in str()
    "unprintable": _Unprintable(),  # neither JSON nor text
}


@pytest.mark.parametrize("result", list(UNENCODABLE.values()), ids=list(UNENCODABLE))
def test_a_result_nothing_can_encode_still_has_a_digest(result: Any) -> None:
    digest = result_digest(result)
    assert len(digest) == 32
    assert digest == result_digest(result)


@pytest.mark.parametrize("result", list(UNENCODABLE.values()), ids=list(UNENCODABLE))
def test_langchain_returns_and_settles_a_result_nothing_can_encode(result: Any) -> None:
    from ratewarden.integrations.langchain import RatewardenMiddleware

    daemon = FakeDaemon(send_result=True)
    message = SimpleNamespace(content=result, status="success")
    middleware = RatewardenMiddleware(daemon.guard())
    assert middleware.wrap_tool_call(_langchain_request(), lambda request: message) is message
    [settle] = daemon.settles  # settled, so its slot is free, and the tool's result kept
    assert settle["status"] == "ok"
    assert len(settle["result_digest"]) == 32


def test_a_set_in_a_result_digests_alike_in_every_process() -> None:
    """A tool may return a set (a pydantic-ai or ADK tool's own value): its order is its
    process's string hashing, so the same set read as text would be another result in
    another agent process (or after a restart), and a loop its counter shares with that
    process would never count. A set is digested as its members in canonical order."""
    import subprocess

    script = (
        "from ratewarden.arguments import result_digest;"
        "print(result_digest({'open': {'pr-1', 'pr-2', 'pr-3', 'pr-4'},"
        " 'n': frozenset({'a', 'b'})}))"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={"PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(1, 6)
    }
    assert len(digests) == 1
    as_list = {"open": ["pr-1", "pr-2", "pr-3", "pr-4"], "n": ["a", "b"]}
    assert digests == {result_digest(as_list) + "\n"}
