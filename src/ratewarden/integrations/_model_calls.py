"""What the adapters that guard model calls in-process share: a check the daemon always
takes, a settle that never raises on what a provider reported, and the text a refused
model call answers with.

A host hands the adapter whatever its model object and the provider said: a model name
of 300 characters, a token count of `None`, `-1`, `"12"` or `1e12`, a usage whose cached
tokens exceed its input. None of that may cost the call its check (failing open, an
unchecked call) nor crash the agent after the model answered (an unsettled reservation):

- `model_check` maps names and ids the way `names.check_request` does for tool calls,
  and bounds token counts to what the wire takes (`tokens`);
- `model_settlement` reads every count through `tokens` and keeps the cached parts
  within the input (`_models.usage_settlement` does the last part);
- `refusal_text` is the daemon's message, or a plain sentence when it gave none.

The settle itself, and when, is each adapter's own (docs/budgets.md).
"""

from __future__ import annotations

from ratewarden import vocabulary
from ratewarden.integrations._models import model_request, usage_settlement
from ratewarden.vocabulary import MAX_TOKENS, CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest
from ratewarden.wire.names import subject, usable_call_id

__all__ = ["model_check", "model_settlement", "must_settle", "refusal_text", "tokens"]


def tokens(value: object) -> int:
    """A token count as the wire takes it: an int from 0 to MAX_TOKENS; anything else
    (None, a bool, a float, a string, a negative count) is 0, a huge one MAX_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, min(value, MAX_TOKENS))


def max_tokens(value: object) -> int | None:
    """The most output tokens a request allows: None (the policy's default) unless the
    host set a positive int; bounded to MAX_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return min(value, MAX_TOKENS)


def model_check(
    user: str,
    model: str,
    input_tokens: object,
    max_output_tokens: object,
    call_id: str,
) -> CheckRequest:
    """The check of a model call, every part in a shape the daemon takes."""
    return model_request(
        subject(user),
        subject(model or "model"),
        tokens(input_tokens),
        max_tokens(max_output_tokens),
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
    """Whether an allowed model call waits for its settle: it holds budget money or a
    slot, or a rule counted it (a token rate counts the tokens the settle reports, and
    its answer lists it as a `rate`, like a rate of calls). A call no rule covers, or
    allowed by the client's own fail-open answer (no limits), is not settled."""
    return answer.allowed and (answer.holds or bool(answer.limits))


def refusal_text(answer: CheckResponse, model: str) -> str:
    """What the agent reads in place of the model's answer."""
    if answer.decision == "ask":  # no human approves a model call: refused, said so
        reason = answer.message or vocabulary.ASK_REASON.format(tool=model)
        return vocabulary.needs_approval(reason)
    return answer.message or vocabulary.REFUSED.format(tool=model)
