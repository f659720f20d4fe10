"""One timeout for many operations, on one timer.

`asyncio.timeout(t)` arms a timer of its own for each block and cancels it on the way
out: under uvloop about 7 us a block, and every decision passed through two or three of
them (the store deadline, the pipeline's write, its wait for each reply), about a tenth
of what a decision cost the daemon (docs/benchmarks.md). Here every block of one
`Deadlines` has the same timeout, so their deadlines fall due in the order the blocks
began: they wait in a queue, in that order, and one timer at a time is armed, for the
oldest still running. A block costs a clock read and a place in the queue; the timer
fires about once per timeout while blocks keep coming, and leaves the finished ones at
the head of the queue behind.

A block that overruns is cancelled and raises TimeoutError, exactly as under
`asyncio.timeout` (whose cancel and uncancel bookkeeping this repeats): a cancellation
from elsewhere stays a CancelledError.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

# A timer may fire up to the loop's clock resolution early (uvloop's counts whole
# milliseconds): a block due within this much is due now, so the timer is not re-armed
# for a wait the loop cannot make.
SLACK_S = 0.001

_RUNNING, _DONE, _EXPIRED = 0, 1, 2


class Deadlines:
    """Blocks (`async with deadlines():`) that each raise TimeoutError past `timeout_s`."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = timeout_s
        self._running: deque[Deadline] = deque()  # in the order they began, so fall due
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> Deadline:
        return Deadline(self)

    def _begin(self, block: Deadline, loop: asyncio.AbstractEventLoop) -> float:
        if loop is not self._loop:  # a new loop (tests run many): the old one's timer is dead
            self._loop, self._timer = loop, None
            self._running.clear()
        due = loop.time() + self.timeout_s
        self._running.append(block)
        if self._timer is None:
            self._timer = loop.call_at(due, self._expire)
        return due

    def _expire(self) -> None:
        """Cancel every block past its deadline; arm the timer for the next one due."""
        assert self._loop is not None
        self._timer = None
        running = self._running
        now = self._loop.time() + SLACK_S
        while running:
            block = running[0]
            if block.state == _RUNNING and block.due > now:
                self._timer = self._loop.call_at(block.due, self._expire)
                return
            running.popleft()
            if block.state == _RUNNING:
                block.expire()


class Deadline:
    """One block of a `Deadlines`, as an async context manager."""

    __slots__ = ("_cancelling", "_owner", "_task", "due", "state")

    def __init__(self, owner: Deadlines) -> None:
        self._owner = owner
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self.due = 0.0
        self.state = _RUNNING

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be entered inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        # The task's loop, not get_running_loop(): on 3.11 that is a getpid() system call.
        self.due = self._owner._begin(self, task.get_loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None  # a finished block holds no task in the queue
        if self.state != _EXPIRED:
            self.state = _DONE
            return
        assert task is not None
        # asyncio.timeout's rule: ours is the cancellation only if no other was asked for.
        if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def expire(self) -> None:
        self.state = _EXPIRED
        assert self._task is not None
        self._task.cancel()
