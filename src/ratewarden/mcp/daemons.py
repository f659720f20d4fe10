"""The gateway's daemons: several `ratewarden serve` on one store, asked in turn.

Every daemon on one Redis decides alike (the counters, the call records and the policy
are shared), so any of them can take a check or a settle. Each request goes to the next
daemon in turn; one that cannot be reached is skipped for the next, so losing a daemon
costs the calls nothing but a connect attempt. A check retried on another daemon keeps
its call id: if the first one did decide it (its answer was lost on the way), the second
replays that decision instead of counting the call twice.

Only when none answers does the fail mode decide (`unreachable_answer`); a daemon that
answers with a refusal of the request itself (a bad token, 4xx) is not skipped: the
others share its configuration, and the fail mode answers as for one daemon.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ratewarden.client import AsyncClient, ClientError, DaemonUnavailable, unreachable_answer
from ratewarden.vocabulary import ADAPTER_TIMEOUT_S, fail_mode
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest, SettleResponse

__all__ = ["DaemonPool"]
log = logging.getLogger("ratewarden.mcp")
T = TypeVar("T")


class DaemonPool:
    """`check` and `settle` as `AsyncGuard` has them, spread over the daemons at `urls`."""

    def __init__(
        self,
        urls: Sequence[str],
        token: str | None,
        *,
        timeout: float = ADAPTER_TIMEOUT_S,
        fail: str = "open",
    ) -> None:
        if not urls:
            raise ValueError("the gateway needs at least one daemon URL")
        self.fail = fail_mode(fail)
        self.urls = list(urls)
        self._clients = [AsyncClient(url, token, timeout=timeout) for url in self.urls]
        self._turn = itertools.cycle(range(len(self._clients)))

    async def check(self, request: CheckRequest) -> CheckResponse:
        try:
            return await self._ask(lambda client: client.check(request))
        except (DaemonUnavailable, ClientError) as exc:
            return unreachable_answer(request, self.fail, exc)

    async def settle(
        self, call_id: str, request: SettleRequest | None = None
    ) -> SettleResponse | None:
        """Report a finished call; an outage or an unknown call is logged, not raised."""
        try:
            return await self._ask(lambda client: client.settle(call_id, request))
        except (DaemonUnavailable, ClientError) as exc:
            log.warning("ratewarden settle of %s failed: %s", call_id, exc)
            return None

    async def _ask(self, send: Callable[[AsyncClient], Awaitable[T]]) -> T:
        """`send` to the next daemon, and on to each other one while none answers."""
        first = next(self._turn)
        order = [(first + step) % len(self._clients) for step in range(len(self._clients))]
        for index in order[:-1]:
            try:
                return await send(self._clients[index])
            except DaemonUnavailable as exc:
                log.warning("ratewarden daemon %s unreachable (%s)", self.urls[index], exc)
        return await send(self._clients[order[-1]])

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()
