"""One admitted call on the host side, from the daemon's allow to the host's settle.

Every adapter and the MCP guard hold an allowed call that holds something (a concurrency
slot, budget money) until the tool has run, then settle it: the call id it was checked
under, when it started, and at the end its status and how long it took. `AdmittedCall`
is that record, and `settlement` the one spelling of the settle it ends with:

- the duration is the milliseconds since `start` on a monotonic clock (`perf_counter`),
  never negative; a call that never started (cancelled before it went to the MCP server)
  has none;
- a call that never ran (`CallStatus.BLOCKED`: allowed by ratewarden, stopped by a later
  hook) took no time and costs nothing (`duration_ms=0`, `cost=0`): what it held is
  released and no estimate is charged;
- a host that measures the call itself (Strands, hermes) passes its own duration to
  `settlement`;
- a call the daemon answered with `send_result` (a loop rule keyed on results counts it)
  is settled with the `result_digest` of what the tool returned, as the host hands it
  over (never the result itself); the digest is computed only then, since hashing a
  large result costs. A call that raised, or never ran, has no result to digest.

What to settle is here; when, and through which guard (a `Guard`, an `AsyncGuard`, the
MCP gateway's pool), is each adapter's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from ratewarden.arguments import result_digest
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import ModelUsage, SettleRequest
from ratewarden.wire.names import bounded_tokens

__all__ = ["NO_RESULT", "AdmittedCall", "call_tool_result", "settlement", "usage_settlement"]

Clock = Callable[[], float]  # seconds on a monotonic clock
# No result to digest (None is a tool's result like any other).
NO_RESULT: Final[Any] = object()


def settlement(status: str, duration_ms: float | None, result: Any = NO_RESULT) -> SettleRequest:
    """The settle of a call that ended with `status` after `duration_ms` (None: unknown),
    with the digest of `result` when there is one (pass it only for a `send_result` call)."""
    if status == CallStatus.BLOCKED:  # it never ran: release what it holds, charge nothing
        return SettleRequest(status=status, duration_ms=0.0, cost=0.0)
    duration = None if duration_ms is None else max(duration_ms, 0.0)
    digest = None if result is NO_RESULT else result_digest(result)
    return SettleRequest(status=status, duration_ms=duration, result_digest=digest)


def usage_settlement(
    input_tokens: int = 0,
    output_tokens: int = 0,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    *,
    status: str = CallStatus.OK,
    duration_ms: float | None = None,
) -> SettleRequest:
    """The settle of a model call that used these tokens (input includes cached ones;
    a cache count past what the input holds is cut to it): docs/budgets.md.

    Each count is bounded here, once for every adapter, to what the wire takes
    (0..MAX_TOKENS): a host's sum of input and cache counts may pass the cap, and a
    provider's negative count is none."""
    given, read, write = (
        bounded_tokens(input_tokens),
        bounded_tokens(cache_read_tokens),
        bounded_tokens(cache_write_tokens),
    )
    usage = ModelUsage(
        input_tokens=given,
        output_tokens=bounded_tokens(output_tokens),
        cache_read_tokens=min(read, given),
        cache_write_tokens=min(write, max(0, given - read)),
    )
    duration = None if duration_ms is None else max(duration_ms, 0.0)
    return SettleRequest(status=status, usage=usage, duration_ms=duration)


def call_tool_result(result: Any) -> Any:
    """What a settle digests of an MCP `CallToolResult` (plain JSON, or a model of one):
    its `content`, `structuredContent` and `isError`, never `_meta` (a server's trace ids
    and timings, which differ on every call: the result's, its blocks', an embedded
    resource's), in one spelling for the MCP proxy, the gateway and ContextForge.
    Anything else is digested as it is."""
    if not isinstance(result, Mapping) and callable(getattr(result, "model_dump", None)):
        result = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not isinstance(result, Mapping):
        return result
    content = result.get("content")
    blocks = content if isinstance(content, list) else []
    structured = result.get("structuredContent", result.get("structured_content"))
    return {
        "content": [_without_meta(block) for block in blocks],
        "structuredContent": structured,
        "isError": bool(result.get("isError") or result.get("is_error")),
    }


def _without_meta(block: Any) -> Any:
    """A content block without its `_meta`, and an embedded resource's contents without
    theirs (MCP's `ResourceContents` has one too): where the protocol puts `_meta`."""
    if isinstance(block, Mapping):
        kept = {key: value for key, value in block.items() if key != "_meta"}
        if isinstance(kept.get("resource"), Mapping):
            kept["resource"] = {k: v for k, v in kept["resource"].items() if k != "_meta"}
        return kept
    if callable(getattr(block, "model_dump", None)):
        return _without_meta(block.model_dump(mode="json", by_alias=True, exclude_none=True))
    return block


class AdmittedCall:
    """An allowed call waiting for its tool to finish: its id, its guard (whatever the
    adapter settles through; None when the adapter holds its own), its start, and whether
    the daemon wants its result's digest (the check answer's `send_result`).

    Started when made, unless `started=False` (the MCP guard starts the clock when the
    call goes to the server, not when the daemon allowed it)."""

    __slots__ = ("_clock", "call_id", "guard", "send_result", "started")

    def __init__(
        self,
        call_id: str,
        guard: Any = None,
        *,
        send_result: bool = False,
        started: bool = True,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.call_id = call_id
        self.guard = guard
        self.send_result = send_result
        self._clock = clock
        self.started: float | None = clock() if started else None

    def start(self) -> None:
        """The call begins to run now."""
        self.started = self._clock()

    def elapsed_ms(self) -> float | None:
        """Milliseconds since the call started; None if it never did."""
        return None if self.started is None else (self._clock() - self.started) * 1000

    def settlement(self, status: str, result: Any = NO_RESULT) -> SettleRequest:
        """Its settle, ending now with `status`; with the digest of the tool's `result`
        when the daemon asked for one (`send_result`), else the result is not looked at."""
        return settlement(status, self.elapsed_ms(), result if self.send_result else NO_RESULT)

    def __repr__(self) -> str:
        return f"AdmittedCall({self.call_id!r}, started={self.started!r})"
