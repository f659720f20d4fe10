"""What the asyncio adapters share: one guard per event loop, call ids, check and settle.

httpx's async connection pool belongs to the event loop that opened it: an `AsyncGuard`
reused from a second loop (a second `asyncio.run`, say) fails with `RuntimeError: Event
loop is closed` instead of answering. So an adapter that builds its own guard builds one
per running loop; a guard handed in by the caller is used as it is.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref

from ratewarden.client import AsyncGuard, ClientError, unreachable_answer
from ratewarden.wire import CheckRequest, CheckResponse, SettleRequest

log = logging.getLogger("ratewarden.integrations")
MAX_CALL_ID = 128  # the API's limit on call_id


class LoopGuards:
    """The caller's `AsyncGuard`, else one built from RATEWARDEN_URL/TOKEN per event loop."""

    def __init__(self, guard: AsyncGuard | None, fail: str | None) -> None:
        if guard is not None and fail is not None:
            raise ValueError("give the fail mode to the AsyncGuard: AsyncGuard(fail=...)")
        if fail not in (None, "open", "closed"):
            raise ValueError(f"fail must be 'open' or 'closed', got {fail!r}")
        self._guard = guard
        self._fail = fail or "open"
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGuard] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> AsyncGuard:
        if self._guard is not None:
            return self._guard
        loop = asyncio.get_running_loop()
        guard = self._by_loop.get(loop)
        if guard is None:  # read the environment now, not at import
            guard = self._by_loop[loop] = AsyncGuard(fail=self._fail)
        return guard


def new_call_id(host: str, tool_call_id: object = None) -> str:
    """A fresh call id, naming the host's tool-call id when there is one.

    The host's id alone is not used: the daemon replays an allowed call_id without
    counting it again, and a model that reuses its tool-call ids (scripted and some
    self-hosted models do) would then never be counted. The suffix keeps each check
    its own call while the id still leads back to the host's logs.
    """
    nonce = uuid.uuid4().hex[:16]
    if isinstance(tool_call_id, str) and tool_call_id:
        return f"{tool_call_id[: MAX_CALL_ID - len(nonce) - 1]}~{nonce}"
    return f"{host}-{nonce}"


async def check_call(
    guard: AsyncGuard, *, user: str, tool: str, call_id: str, approved: bool = False
) -> CheckResponse:
    """The daemon's decision; a refused request is answered by the fail mode, not raised."""
    try:
        request = CheckRequest(user=user, tool=tool, call_id=call_id, approved=approved)
        return await guard.check(request)
    except (ClientError, ValueError) as exc:  # bad input or auth: the agent must go on
        unsent = CheckRequest.model_construct(user=user, tool=tool, call_id=call_id)
        return unreachable_answer(unsent, guard.fail, exc)


async def settle_call(
    guard: AsyncGuard, call_id: str, *, status: str, duration_ms: float | None
) -> None:
    """Report a finished call: releases its slots and charges its estimate."""
    duration = None if duration_ms is None else max(duration_ms, 0.0)
    await guard.settle(call_id, SettleRequest(status=status, duration_ms=duration))
