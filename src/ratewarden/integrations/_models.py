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

from ratewarden.integrations._lifecycle import usage_settlement
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import CheckRequest
from ratewarden.wire.names import model_check_request

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
    user: str,
    model: str,
    input_tokens: int | None = None,
    max_output_tokens: int | None = None,
    *,
    session: str | None = None,
    team: str | None = None,
    call_id: str | None = None,
) -> CheckRequest:
    """The check of a model call (names made acceptable, counts bounded); None fields
    are left to the daemon."""
    return model_check_request(
        user=user,
        model=model,
        input_tokens=input_tokens,
        max_output_tokens=max_output_tokens,
        session=session,
        team=team,
        call_id=call_id,
    )


# A model call that raised before the provider answered: nothing used, nothing charged.
FAILED = usage_settlement(status=CallStatus.ERROR)
