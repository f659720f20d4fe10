"""The parts of the LangChain and ADK model-call hooks that read what a host hands
them (docs/budgets.md): hostile names, token counts and usages never cost a call its
check nor crash the agent after the model answered. The hooks themselves run in the
real frameworks: tests/hosts/test_models_langchain.py and test_models_adk.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ratewarden.integrations import adk, langchain
from ratewarden.integrations._lifecycle import AdmittedCall
from ratewarden.integrations._model_calls import (
    max_tokens,
    model_check,
    model_settlement,
    must_settle,
    refusal_text,
    tokens,
)
from ratewarden.vocabulary import MAX_TOKENS, CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, LimitState, ModelUsage


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        (12, 12),
        (0, 0),
        (None, 0),
        (-5, 0),
        (True, 0),
        (12.7, 12),
        ("12", 0),
        (10**12, MAX_TOKENS),
    ],
)
def test_a_token_count_is_what_the_wire_takes(given: object, sent: int) -> None:
    assert tokens(given) == sent


@pytest.mark.parametrize(("given", "sent"), [(4000, 4000), (0, None), (None, None), (-1, None)])
def test_max_output_tokens_left_to_the_policy_unless_positive(given: object, sent: Any) -> None:
    assert max_tokens(given) == sent
    assert max_tokens(10**12) == MAX_TOKENS


@pytest.mark.parametrize(
    "name", ["gpt-4o", "m" * 300, "evil\x00model\n", "", "models/gemini 2.5 flash ✓"]
)
def test_any_model_name_and_call_id_make_a_check_the_daemon_takes(name: str) -> None:
    request = model_check("u\x01ser" * 100, name, -3, "lots", "call/\x7f" * 50)
    again = CheckRequest.model_validate(request.model_dump(exclude_none=True))
    assert again.kind == "model"
    assert again.model == again.tool
    assert again.input_tokens == 0
    assert again.max_output_tokens is None  # the policy's default


def test_a_usage_with_more_cached_than_input_is_settled_within_it() -> None:
    settle = model_settlement(100, 50, 300, 300, duration_ms=-1)
    assert settle.usage == ModelUsage(
        input_tokens=100, output_tokens=50, cache_read_tokens=100, cache_write_tokens=0
    )
    assert settle.duration_ms == 0.0


def test_a_model_call_a_rule_counted_is_settled_even_holding_nothing() -> None:
    """A token rate holds the call until its settle brings the tokens; a rate of calls
    holds nothing (the daemon keeps no record to settle)."""
    rate = LimitState(
        rule="tokens", kind="rate", limit=20000, tokens=True, remaining=1, reset_after=1
    )
    calls = LimitState(rule="calls", kind="rate", limit=10, remaining=1, reset_after=1)
    allowed = CheckResponse(decision="allow", allowed=True, message="", call_id="c")
    assert must_settle(allowed.model_copy(update={"limits": [rate]}))
    assert not must_settle(allowed.model_copy(update={"limits": [calls]}))
    assert not must_settle(allowed)  # no rule covers it (or the client's own fail-open)
    refused = CheckResponse(decision="deny", allowed=False, message="m", call_id="c")
    assert not must_settle(refused.model_copy(update={"limits": [rate]}))


def test_an_ask_is_a_refusal_saying_a_human_must_approve() -> None:
    ask = CheckResponse(decision="ask", allowed=False, message="", call_id="c")
    assert "must approve" in refusal_text(ask, "gpt-4o")
    deny = CheckResponse(decision="deny", allowed=False, message="", call_id="c")
    assert refusal_text(deny, "gpt-4o") == "ratewarden refused this gpt-4o call"


# -- LangChain -----------------------------------------------------------------------------


class ChatModel:
    """What the middleware reads of a chat model: fields, and LangChain's tracing params."""

    def __init__(self, raises: bool = False, **fields: Any) -> None:
        self.__dict__.update(fields)
        self._raises = raises

    def _get_ls_params(self, **settings: Any) -> dict[str, Any]:
        if self._raises:
            raise RuntimeError("a provider's own override failed")
        return {"ls_model_name": getattr(self, "model_name", None)}


def test_the_model_name_from_the_setting_the_trace_params_then_the_fields() -> None:
    assert langchain.model_name(ChatModel(model_name="gpt-4o"), {"model": "o3"}) == "o3"
    assert langchain.model_name(ChatModel(model_name="gpt-4o"), {}) == "gpt-4o"
    assert langchain.model_name(ChatModel(raises=True, model="claude-x"), {}) == "claude-x"
    assert langchain.model_name(object(), {"model": 7}) == "object"


def test_max_output_tokens_from_the_request_then_the_model() -> None:
    model = ChatModel(model_name="m", max_tokens=2000)
    assert langchain.max_output_tokens(model, {"max_tokens": 500}) == 500
    assert langchain.max_output_tokens(model, {}) == 2000
    assert langchain.max_output_tokens(ChatModel(max_output_tokens=300), {}) == 300
    assert langchain.max_output_tokens(ChatModel(max_tokens=True), {}) is None
    assert langchain.max_output_tokens(ChatModel(raises=True), {"max_tokens": -4}) is None


def test_the_input_estimate_reads_text_not_images_and_survives_odd_args() -> None:
    looping: dict[str, Any] = {}
    looping["self"] = looping
    image = {"type": "image", "base64": "A" * 1_000_000}
    request = SimpleNamespace(
        system_message=SimpleNamespace(content="be brief"),
        messages=[
            SimpleNamespace(content=[{"type": "text", "text": "hello"}, image, "there"]),
            SimpleNamespace(content="", tool_calls=[{"name": "t", "args": looping}]),
            SimpleNamespace(content=None),
        ],
        tools=[{"name": "lookup"}, SimpleNamespace(name="t", description="d", args={})],
    )
    texts = list(langchain.input_texts(request))
    assert "be brief" in texts
    assert "hellothere" in texts
    assert sum(map(len, texts)) < 200  # the image's megabyte is not counted


def message(usage: Any) -> Any:
    return SimpleNamespace(usage_metadata=usage)


def test_a_settle_sums_the_usage_of_the_answer_and_reads_cache_details() -> None:
    usage = {
        "input_tokens": 12_345,
        "output_tokens": 6_789,
        "input_token_details": {"cache_read": 2_345, "cache_creation": 10},
    }
    for response in (
        SimpleNamespace(result=[message(usage)]),  # a ModelResponse
        message(usage),  # an AIMessage
        SimpleNamespace(model_response=SimpleNamespace(result=[message(usage)])),  # extended
    ):
        settle = langchain.response_settlement(response, AdmittedCall("c"))
        assert settle.usage == ModelUsage(
            input_tokens=12_345, output_tokens=6_789, cache_read_tokens=2_345, cache_write_tokens=10
        )
        assert settle.status == CallStatus.OK


def test_a_settle_of_junk_usage_never_raises() -> None:
    junk = {"input_tokens": "many", "output_tokens": -3, "input_token_details": "x"}
    settle = langchain.response_settlement(message(junk), AdmittedCall("c"))
    assert settle.usage == ModelUsage()
    huge = {"input_tokens": 10**15, "output_tokens": 10**15}
    assert langchain.response_settlement(message(huge), AdmittedCall("c")).usage == ModelUsage(
        input_tokens=MAX_TOKENS, output_tokens=MAX_TOKENS
    )


def test_an_answer_without_usage_is_settled_without_usage() -> None:
    settle = langchain.response_settlement(message(None), AdmittedCall("c"))
    assert (settle.usage, settle.cost, settle.status) == (None, None, CallStatus.OK)


# -- ADK -----------------------------------------------------------------------------------


def test_adk_usage_reads_prompt_cache_candidates_and_thoughts() -> None:
    usage = SimpleNamespace(
        prompt_token_count=12_345,
        cached_content_token_count=2_345,
        candidates_token_count=6_000,
        thoughts_token_count=789,
        tool_use_prompt_token_count=None,
    )
    settle = adk.usage_settlement(usage, 3.0)
    assert settle.usage == ModelUsage(
        input_tokens=12_345, output_tokens=6_789, cache_read_tokens=2_345
    )
    failed = adk.usage_settlement(SimpleNamespace(), None, CallStatus.ERROR)
    assert (failed.usage, failed.status) == (ModelUsage(), CallStatus.ERROR)
    assert adk.usage_settlement(None, 1.0).usage is None


def test_adk_request_text_reads_parts_calls_and_instructions() -> None:
    part = SimpleNamespace(text="hi", function_call={"name": "t", "args": {}})
    content = SimpleNamespace(parts=[part, SimpleNamespace(text=None)])
    config = SimpleNamespace(system_instruction=["be", "brief"], tools=[{"x": 1}])
    texts = list(adk.request_texts(SimpleNamespace(contents=[content], config=config)))
    assert texts[:3] == ["be", "brief", "hi"]
    assert len(texts) == 5
    assert list(adk.request_texts(SimpleNamespace())) == []


# -- ADK's pairing, with a recording guard -------------------------------------------------


class RecordingGuard:
    """An AsyncGuard's check and settle, recorded; every check allowed, holding budget."""

    fail = "open"

    def __init__(self) -> None:
        self.checks: list[CheckRequest] = []
        self.settles: list[tuple[str, Any]] = []

    async def check(self, request: CheckRequest) -> CheckResponse:
        self.checks.append(request)
        budget = LimitState(rule="daily-spend", kind="budget", limit=1, remaining=1, reset_after=1)
        call_id = request.call_id or ""
        return CheckResponse(
            decision="allow", allowed=True, message="", call_id=call_id, limits=[budget]
        )

    async def settle(self, call_id: str, request: Any = None) -> None:
        self.settles.append((call_id, request))


class Actions:
    """An EventActions: one per model call, unhashable like a pydantic model."""

    __hash__ = None  # type: ignore[assignment]


def context(actions: Actions, user: str = "alice", invocation: str = "inv-1") -> Any:
    return SimpleNamespace(actions=actions, user_id=user, invocation_id=invocation)


def request(max_output: int | None = None) -> Any:
    config = SimpleNamespace(max_output_tokens=max_output, system_instruction="hi", tools=None)
    return SimpleNamespace(model="gpt-4o", contents=[], config=config)


def answer(output: int, partial: bool = False) -> Any:
    usage = SimpleNamespace(prompt_token_count=100, candidates_token_count=output)
    return SimpleNamespace(partial=partial, usage_metadata=usage)


def plugin() -> tuple[adk.RatewardenPlugin, RecordingGuard]:
    guard = RecordingGuard()
    return adk.RatewardenPlugin(guard), guard  # type: ignore[arg-type]


async def test_adk_calls_in_flight_together_are_settled_each_with_its_usage() -> None:
    hook, guard = plugin()
    first, second = Actions(), Actions()
    await hook.before_model_callback(callback_context=context(first), llm_request=request(50))
    await hook.before_model_callback(callback_context=context(second), llm_request=request())
    assert [c.max_output_tokens for c in guard.checks] == [50, None]
    ids = [c.call_id for c in guard.checks]
    await hook.after_model_callback(callback_context=context(second), llm_response=answer(7))
    await hook.after_model_callback(callback_context=context(first), llm_response=answer(5))
    settled = {call_id: settle.usage.output_tokens for call_id, settle in guard.settles}
    assert settled == {ids[0]: 5, ids[1]: 7}
    # A response after the settle (another plugin's replay) settles nothing twice.
    await hook.after_model_callback(callback_context=context(first), llm_response=answer(9))
    assert len(guard.settles) == 2


async def test_adk_a_stream_settles_once_and_a_broken_one_with_what_it_reported() -> None:
    hook, guard = plugin()
    streamed, broken = Actions(), Actions()
    for actions in (streamed, broken):
        await hook.before_model_callback(callback_context=context(actions), llm_request=request())
    for output in (1, 2):
        for actions in (streamed, broken):
            partial = answer(output, partial=True)
            await hook.after_model_callback(callback_context=context(actions), llm_response=partial)
    assert guard.settles == []
    final = SimpleNamespace(partial=False, usage_metadata=None)  # the final reports none
    await hook.after_model_callback(callback_context=context(streamed), llm_response=final)
    await hook.on_model_error_callback(
        callback_context=context(broken), llm_request=request(), error=RuntimeError("x")
    )
    [(_, ok), (_, failed)] = guard.settles
    assert (ok.status, ok.usage.output_tokens) == (CallStatus.OK, 2)
    assert (failed.status, failed.usage.output_tokens) == (CallStatus.ERROR, 2)


async def test_adk_a_call_answered_in_the_models_place_is_released_when_the_run_ends() -> None:
    hook, guard = plugin()
    skipped, other_run = Actions(), Actions()
    await hook.before_model_callback(callback_context=context(skipped), llm_request=request())
    await hook.before_model_callback(
        callback_context=context(other_run, invocation="inv-2"), llm_request=request()
    )
    await hook.after_run_callback(invocation_context=SimpleNamespace(invocation_id="inv-1"))
    [(call_id, released)] = guard.settles
    assert call_id == guard.checks[0].call_id
    assert (released.status, released.cost, released.usage) == (CallStatus.BLOCKED, 0.0, None)


async def test_adk_forgets_a_call_whose_event_is_gone() -> None:
    hook, _ = plugin()
    actions = Actions()
    await hook.before_model_callback(callback_context=context(actions), llm_request=request())
    assert len(hook._model_calls) == 1
    del actions
    assert hook._model_calls == {}


async def test_adk_models_false_checks_nothing() -> None:
    guard = RecordingGuard()
    hook = adk.RatewardenPlugin(guard, models=False)  # type: ignore[arg-type]
    found = await hook.before_model_callback(
        callback_context=context(Actions()), llm_request=request()
    )
    assert found is None
    assert guard.checks == []


@pytest.mark.parametrize(
    ("given", "sent"), [(10**12, MAX_TOKENS), (MAX_TOKENS, MAX_TOKENS), (-5, 0), (1200, 1200)]
)
def test_the_model_check_clamps_its_counts_for_every_adapter(given: int, sent: int) -> None:
    """The one clamp of a model check's token counts (wire.names.model_check_request): an
    adapter hands it the host's estimate and limit as they are (strands, crewai and hermes
    clamped them again before it), and a count past the wire's cap is reserved at the cap
    rather than refused as a bad request."""
    from ratewarden.wire.names import model_check_request

    request = model_check_request(
        user="u", model="gpt-4o", input_tokens=given, max_output_tokens=given
    )
    assert (request.input_tokens, request.max_output_tokens) == (sent, sent)
    CheckRequest.model_validate(request.model_dump())  # the daemon takes it as sent
