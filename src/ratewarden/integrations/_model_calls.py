"""A model call on the host side: the check before the model is asked, the settle after,
and what the host hands us made into numbers the wire takes.

Every adapter that can see a model request (LangChain's `wrap_model_call`, ADK's model
callbacks, pydantic-ai's capability, the OpenAI Agents model wrapper, the LiteLLM proxy
hook...) asks the daemon the same way (docs/budgets.md):

- the check names the model, the input tokens (counted when the host counts them, else
  estimated from the text it sends: `estimate_tokens`) and the most output tokens the
  request allows (None: the policy's `defaults.max_output_tokens`); the daemon prices the
  call's maximum and reserves it (`wire.names.model_check_request`; `model_check` with
  every part made a shape the daemon takes: a host's odd model name mapped, a count
  clamped);
- the settle sends what the provider reported (`usage_settlement`, `model_settlement` for
  a provider's usage of any type), which the daemon prices again: the call is charged its
  real usage and the rest of the reservation is released. A call that failed before the
  provider answered used nothing (`FAILED`); a call settled without usage is charged its
  whole reservation.

The asyncio adapters (pydantic-ai's capability, the OpenAI Agents model wrapper) share
`check_model` (a refused request answered by the fail mode as a tool call's is:
`_async.check_call`) and `ModelCall` (an allowed call waiting for the provider's answer:
`settle`, `settle_failed`). The adapters that keep their own call between two hooks
(LangChain's middleware, ADK's callbacks, Strands, CrewAI, hermes, the LiteLLM proxy)
build the same check and settle from the parts: `must_settle` and `refusal_text` (what the
agent reads in place of the model's answer) too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard, ClientError, unreachable_answer
from ratewarden.integrations._async import log
from ratewarden.integrations._lifecycle import AdmittedCall, usage_settlement
from ratewarden.vocabulary import MAX_TOKENS, CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest
from ratewarden.wire.names import bounded_tokens, model_check_request, subject, usable_call_id

__all__ = [
    "FAILED",
    "ModelCall",
    "check_model",
    "estimate_tokens",
    "estimated_tokens",
    "max_tokens",
    "model_check",
    "model_settlement",
    "must_settle",
    "refusal_text",
    "text_leaves",
    "token_count",
    "tokens",
    "usage_settlement",
]

# Characters per token in the estimate: about four for English text in the common
# tokenizers (OpenAI's and Anthropic's guides say so). An estimate only sizes the
# reservation; the settle charges what the provider counted.
CHARS_PER_TOKEN = 4


def estimate_tokens(texts: str | Iterable[str]) -> int:
    """The input tokens of `texts` (a prompt, or its messages' texts), estimated."""
    chars = len(texts) if isinstance(texts, str) else sum(len(text) for text in texts)
    return -(-chars // CHARS_PER_TOKEN)


# A model call that raised before the provider answered: nothing used, nothing charged.
FAILED = usage_settlement(status=CallStatus.ERROR)

UNKNOWN_MODEL = "unknown-model"  # a host that names no model: priced by the policy's default


def token_count(value: object) -> int | None:
    """`value` as a token count the wire takes (clamped to 0..MAX_TOKENS); None when it
    is no number (a host's `max_tokens` of None, a string): the daemon's default then."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return MAX_TOKENS if value > 0 else None
    return bounded_tokens(int(value))


def estimated_tokens(texts: Callable[[], Iterable[str]]) -> int | None:
    """The input tokens of the text `texts()` yields, estimated; None (the daemon counts
    0) if reading the host's request raised: a message the estimate cannot read must not
    stop the agent."""
    try:
        return estimate_tokens(list(texts()))
    except Exception as exc:
        log.warning("ratewarden could not estimate a model request's tokens: %r", exc)
        return None


async def check_model(
    guard: AsyncGuard,
    *,
    user: str,
    model: object,
    input_tokens: object,
    max_output_tokens: object,
    host: str,
    call_id: object = None,
) -> tuple[CheckResponse, ModelCall | None]:
    """The daemon's decision on one model call, and the call to settle when it holds
    something (an allowed call the daemon counted; a fail-open one holds nothing)."""
    name = model if isinstance(model, str) and model else UNKNOWN_MODEL
    checked_id = vocabulary.call_id(host, call_id)
    try:
        request = model_check_request(
            user=subject(str(user)),
            model=subject(name),
            input_tokens=token_count(input_tokens),
            max_output_tokens=token_count(max_output_tokens),
            call_id=usable_call_id(checked_id),
        )
        answer = await guard.check(request)
    except (ClientError, ValueError) as exc:  # bad input or auth: the agent must go on
        unsent = CheckRequest.model_construct(user=user, tool=name, call_id=checked_id)
        answer = unreachable_answer(unsent, guard.fail, exc)
    if answer.allowed and (answer.holds or not answer.degraded):
        return answer, ModelCall(answer.call_id or checked_id, guard)
    return answer, None


class ModelCall:
    """An allowed model call waiting for the provider: settled once, by whichever of
    `settle` and `settle_failed` comes first."""

    __slots__ = ("_admitted", "_settled")

    def __init__(self, call_id: str, guard: AsyncGuard) -> None:
        self._admitted = AdmittedCall(call_id, guard)
        self._settled = False

    @property
    def call_id(self) -> str:
        return self._admitted.call_id

    async def settle(self, usage: Mapping[str, object] | None) -> None:
        """Charge the provider's `usage` (input, output, cache_read, cache_write tokens);
        None (the provider said nothing): the whole reservation is charged."""
        if usage is None:
            await self._send(self._admitted.settlement(CallStatus.OK))
            return
        counts = {key: token_count(value) or 0 for key, value in usage.items()}
        await self._send(
            usage_settlement(
                counts.get("input_tokens", 0),
                counts.get("output_tokens", 0),
                counts.get("cache_read_tokens", 0),
                counts.get("cache_write_tokens", 0),
                duration_ms=self._admitted.elapsed_ms(),
            )
        )

    async def settle_failed(self) -> None:
        """The call raised before the provider answered: it used nothing."""
        await self._send(FAILED)

    async def settle_unknown(self, status: str = CallStatus.CANCELLED) -> None:
        """The call stopped while the provider may have been answering (a stream closed
        half-read, a task cancelled): what it used is unknown, so the whole reservation
        is charged (a budget never gives money away)."""
        await self._send(self._admitted.settlement(status))

    async def _send(self, request: SettleRequest) -> None:
        if self._settled:
            return
        self._settled = True
        guard = self._admitted.guard
        await guard.settle(self._admitted.call_id, request)


def text_leaves(value: object, skip: frozenset[str] = frozenset(), depth: int = 0) -> Iterator[str]:
    """Every string in `value` (a message, a list of items, a dict; a pydantic model is
    dumped), but for the values of the keys in `skip` (ids, roles, types): what an
    input token estimate counts. Bounded in depth, so a cyclic structure ends."""
    if depth > 32:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key not in skip:
                yield from text_leaves(item, skip, depth + 1)
    elif isinstance(value, Sequence | set | frozenset) and not isinstance(value, bytes | bytearray):
        for item in value:
            yield from text_leaves(item, skip, depth + 1)
    elif callable(dump := getattr(value, "model_dump", None)):
        try:
            dumped: Any = dump(mode="json", exclude_none=True)
        except Exception:  # a model that cannot be dumped counts nothing
            return
        yield from text_leaves(dumped, skip, depth + 1)


# -- the parts for adapters that keep their own call (LangChain, ADK) ----------------------


def tokens(value: object) -> int:
    """A token count the wire takes (`token_count`), 0 for what is no number."""
    return token_count(value) or 0


def max_tokens(value: object) -> int | None:
    """The most output tokens a request allows: None (the policy's default) unless the
    host set a positive number; bounded to MAX_TOKENS."""
    return token_count(value) or None


def model_check(
    user: str,
    model: str,
    input_tokens: object,
    max_output_tokens: object,
    call_id: str,
) -> CheckRequest:
    """The check of a model call, every part in a shape the daemon takes."""
    return model_check_request(
        user=subject(user),
        model=subject(model or UNKNOWN_MODEL),
        input_tokens=tokens(input_tokens),
        max_output_tokens=max_tokens(max_output_tokens),
        call_id=usable_call_id(call_id),
    )


def model_settlement(
    input_tokens: object = 0,
    output_tokens: object = 0,
    cache_read_tokens: object = 0,
    cache_write_tokens: object = 0,
    *,
    status: str = CallStatus.OK,
    duration_ms: float | None = None,
) -> SettleRequest:
    """The settle of a model call that used these tokens, as reported (any type)."""
    return usage_settlement(
        tokens(input_tokens),
        tokens(output_tokens),
        tokens(cache_read_tokens),
        tokens(cache_write_tokens),
        status=status,
        duration_ms=duration_ms,
    )


def must_settle(answer: CheckResponse) -> bool:
    """Whether an allowed model call waits for its settle: it holds budget money, a
    slot, or a token rate waiting for its tokens (`CheckResponse.holds`). A call no such
    rule covers, or allowed by the client's own fail-open answer (no limits), is not
    settled: the daemon kept nothing to settle."""
    return answer.holds


def refusal_text(answer: CheckResponse, model: str) -> str:
    """What the agent reads in place of the model's answer."""
    if answer.decision == "ask":  # no human approves a model call: refused, said so
        reason = answer.message or vocabulary.ASK_REASON.format(tool=model)
        return vocabulary.needs_approval(reason)
    return answer.message or vocabulary.REFUSED.format(tool=model)
