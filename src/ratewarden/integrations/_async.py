"""What the asyncio adapters share: one guard per event loop, and the check (the settle
is `_lifecycle.AdmittedCall`'s, shared with every adapter).

httpx's async connection pool belongs to the event loop that opened it: an `AsyncGuard`
reused from a second loop (a second `asyncio.run`, say) fails with `RuntimeError: Event
loop is closed` instead of answering. So an adapter that builds its own guard builds one
per running loop; a guard handed in by the caller is used as it is.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from ratewarden.client import AsyncGuard, ClientError, unreachable_answer
from ratewarden.vocabulary import FailMode, fail_mode
from ratewarden.wire.bodies import CheckRequest, CheckResponse
from ratewarden.wire.names import check_request

log = logging.getLogger("ratewarden.integrations")
__all__ = ["LoopGuards", "check_call"]


class LoopGuards:
    """The caller's `AsyncGuard`, else one built from RATEWARDEN_URL/TOKEN per event loop."""

    def __init__(self, guard: AsyncGuard | None, fail: str | None) -> None:
        if guard is not None and fail is not None:
            raise ValueError("give the fail mode to the AsyncGuard: AsyncGuard(fail=...)")
        self._guard = guard
        self._fail = FailMode.OPEN if fail is None else fail_mode(fail)
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


async def check_call(
    guard: AsyncGuard,
    *,
    user: str,
    tool: str,
    call_id: str,
    approved: bool = False,
    args: object = None,
) -> CheckResponse:
    """The daemon's decision; a refused request is answered by the fail mode, not raised.

    Names and ids go through `names.check_request`: a long tool name or an odd id is
    checked, not refused; `args` (a dict or JSON text) are sent within the wire's caps,
    and only while the daemon's policy reads them (the client decides).
    """
    try:
        request = check_request(user=user, tool=tool, call_id=call_id, approved=approved, args=args)
        return await guard.check(request)
    except (ClientError, ValueError) as exc:  # bad input or auth: the agent must go on
        unsent = CheckRequest.model_construct(user=user, tool=tool, call_id=call_id)
        return unreachable_answer(unsent, guard.fail, exc)
