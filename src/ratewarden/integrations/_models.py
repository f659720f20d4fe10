"""A model call on the host side: the check before the model is asked, the settle after.

Every adapter that can see a model request (LangChain's `wrap_model_call`, ADK's model
callbacks, pydantic-ai's capability, the LiteLLM proxy hook...) asks the daemon the same
way (docs/budgets.md):

- the check names the model, the input tokens (counted when the host counts them, else
  estimated here from the text it sends: `estimate_tokens`) and the most output tokens
  the request allows (None: the policy's `defaults.max_output_tokens`); the daemon prices
  the call's maximum and reserves it;
- the settle sends what the provider reported (`usage_settlement`), which the daemon
  prices again: the call is charged its real usage and the rest of the reservation is
  released. A call that failed before the provider answered used nothing (`FAILED`);
  a call settled without usage is charged its whole reservation.

Only the request and the settle are spelled here; when and through which guard is each
adapter's own.
"""

from __future__ import annotations

from collections.abc import Iterable

from ratewarden.vocabulary import CallKind, CallStatus
from ratewarden.wire.bodies import CheckRequest, ModelUsage, SettleRequest

__all__ = ["FAILED", "estimate_tokens", "model_request", "usage_settlement"]

# Characters per token in the estimate: about four for English text in the common
# tokenizers (OpenAI's and Anthropic's guides say so). An estimate only sizes the
# reservation; the settle charges what the provider counted.
CHARS_PER_TOKEN = 4


def estimate_tokens(texts: str | Iterable[str]) -> int:
    """The input tokens of `texts` (a prompt, or its messages' texts), estimated."""
    chars = len(texts) if isinstance(texts, str) else sum(len(text) for text in texts)
    return -(-chars // CHARS_PER_TOKEN)


def model_request(
    user: str | None,
    model: str,
    input_tokens: int | None = None,
    max_output_tokens: int | None = None,
    *,
    session: str | None = None,
    team: str | None = None,
    call_id: str | None = None,
) -> CheckRequest:
    """The check of a model call; None fields are left to the daemon."""
    return CheckRequest(
        user=user,
        kind=CallKind.MODEL,
        tool=model,
        model=model,
        input_tokens=input_tokens,
        max_output_tokens=max_output_tokens,
        session=session,
        team=team,
        call_id=call_id,
    )


def usage_settlement(
    input_tokens: int = 0,
    output_tokens: int = 0,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    *,
    status: str = CallStatus.OK,
    duration_ms: float | None = None,
) -> SettleRequest:
    """The settle of a model call that used these tokens (input includes cached ones)."""
    usage = ModelUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=min(cache_read_tokens, input_tokens),
        cache_write_tokens=min(cache_write_tokens, max(0, input_tokens - cache_read_tokens)),
    )
    duration = None if duration_ms is None else max(duration_ms, 0.0)
    return SettleRequest(status=status, usage=usage, duration_ms=duration)


# A model call that raised before the provider answered: nothing used, nothing charged.
FAILED = usage_settlement(status=CallStatus.ERROR)
