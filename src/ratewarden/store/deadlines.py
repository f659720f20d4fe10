"""One timeout for many operations, on one timer, counting only the time the daemon ran.

`asyncio.timeout(t)` arms a timer of its own for each block and cancels it on the way
out: under uvloop about 7 us a block, and every decision passed through two or three of
them (the store deadline, the pipeline's write, its wait for each reply), about a tenth
of what a decision cost the daemon (docs/benchmarks.md). Here every block of one
`Deadlines` has the same timeout, so their deadlines fall due in the order the blocks
began: they wait in a queue, in that order, and one timer at a time is armed. A block
costs a clock read and a place in the queue.

**A stalled daemon is not a slow store.** A deadline is there to catch a store that does
not answer; but when the daemon itself stops running (its process stopped or starved of
CPU, its event loop behind on a burst of work), an answer that arrived in time sits
unread in the socket until it runs again, and a deadline on the wall clock would expire
first. Every such timeout was a decision by the fail mode: a free call, when failing
open. So a deadline counts only the time in which the daemon could have read its answer:

- while blocks run, the timer ticks `TICKS` times per timeout; a tick that fires late
  shows that the loop could not run for that long (its process stopped, or a long loop
  turn), and the time the loop's thread waited for a CPU since the last tick (Linux
  tells it in /proc/thread-self/schedstat) shows a process starved of CPU in slices too
  short to make a tick late. The larger of the two is *stalled* time, which no block
  running then counts (stalls shorter than a tick may go unseen: each costs at most a
  tenth of the timeout);
- a block past its timeout is not cancelled while the store has answered another block
  within the last timeout (`answered`, which the guarded store calls on each success):
  a store that answers is not hung, and what keeps the block waiting is the daemon's own
  backlog (replies read but not yet handed out, callers not yet run);
- whatever the stalls and the answers, a block is cancelled at `STALL_CAP` timeouts of
  wall clock, so a daemon that never runs freely still answers, by the fail mode,
  within the cap.

On an idle loop nothing is stalled, and a block whose store stopped answering is
cancelled at its timeout exactly as before (a store that froze is cancelled within one
timeout of its last answer).

A block that overruns is cancelled and raises TimeoutError, exactly as under
`asyncio.timeout` (whose cancel and uncancel bookkeeping this repeats): a cancellation
from elsewhere stays a CancelledError. After a timeout, `Deadline.stalled_s` says how
much of the wait the daemon was stalled, and `Deadline.cut_short` whether the cap ended
it rather than the timeout (which is then no verdict on the store).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from types import TracebackType

# A timer may fire up to the loop's clock resolution early or late (uvloop's counts whole
# milliseconds): a block due within this much is due now, so the timer is not re-armed
# for a wait the loop cannot make; and a tick this late is on time, not a stall.
SLACK_S = 0.001
# Ticks per timeout while blocks run: what the stalls are seen by. More would see shorter
# stalls, for a timer callback more each time (at 100 ms, 100 a second under load).
TICKS = 10
# However much of it the daemon was stalled, no block waits longer than this many
# timeouts (1 s at the default 100 ms store timeout).
STALL_CAP = 10

# Linux's scheduler statistics for the calling thread: time on a CPU, time waiting for one
# (runnable, not running), in nanoseconds, and time slices.
SCHEDSTAT = "/proc/thread-self/schedstat"

_RUNNING, _DONE, _EXPIRED = 0, 1, 2
_NEVER = float("inf")


def cpu_wait_s() -> float:
    """Seconds the calling thread has waited for a CPU since it began; 0.0 where the
    kernel does not tell (read once a tick, about 15 us)."""
    try:
        with open(SCHEDSTAT, "rb") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Deadlines:
    """Blocks (`async with deadlines():`) that each raise TimeoutError past `timeout_s`
    of time in which the daemon ran, or past `STALL_CAP` times that in all."""

    def __init__(self, timeout_s: float, cpu_wait: Callable[[], float] = cpu_wait_s) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._cpu_wait = cpu_wait  # seconds the loop's thread has waited for a CPU
        self._cpu_waited: float | None = None  # ... at the last tick (None: not ticking)
        self.timeout_s = timeout_s
        self.cap_s = timeout_s * STALL_CAP
        self._tick_s = timeout_s / TICKS
        self._running: deque[Deadline] = deque()  # in the order they began, so fall due
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = _NEVER  # when the armed timer should fire
        self._stalled = 0.0  # seconds the loop was seen stalled, in all: ticks' lateness
        self._answered = -_NEVER  # when the store last answered (`answered`)
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> Deadline:
        return Deadline(self)

    def _begin(self, block: Deadline, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:  # a new loop (tests run many): the old one's timer is dead
            self._loop, self._timer, self._timer_due = loop, None, _NEVER
            self._answered = -_NEVER
            self._running.clear()
        now = loop.time()
        block.began = now
        # Stalled time so far, with the stall going on now: a tick that is overdue.
        # (Inline, not a method: every store operation passes here; docs/benchmarks.md.)
        overdue = now - self._timer_due - SLACK_S
        block.stalled_before = self._stalled + overdue if overdue > 0 else self._stalled
        self._running.append(block)
        if self._timer is None:
            self._arm(now + self._tick_s)

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        self._timer_due = when
        self._timer = self._loop.call_at(when, self._tick)

    def _tick(self) -> None:
        """Count the stall this tick shows, cancel every block now due, tick again while
        blocks run."""
        assert self._loop is not None
        now = self._loop.time()
        self._stalled += max(now - self._timer_due - SLACK_S, self._starved(), 0.0)
        self._timer, self._timer_due = None, _NEVER
        running = self._running
        while running:
            block = running[0]
            if block.state == _RUNNING:
                due = self._due(block)
                if due > now + SLACK_S:
                    self._arm(min(due, now + self._tick_s))
                    return
                capped = now + SLACK_S >= block.began + self.cap_s
                if not capped and now - self._answered < self.timeout_s:
                    # Not hung: what keeps this block waiting is the daemon's own backlog.
                    self._arm(now + self._tick_s)
                    return
                stalled = self._stalled - block.stalled_before
                block.expire(now - block.began, stalled, capped)
            running.popleft()
        self._cpu_waited = None  # no more ticks: the next first one has no interval

    def _starved(self) -> float:
        """How long the loop's thread waited for a CPU since the last tick."""
        waited, before = self._cpu_wait(), self._cpu_waited
        self._cpu_waited = waited
        return 0.0 if before is None else waited - before

    def answered(self) -> None:
        """What the blocks wait for (the store) has just answered one of them."""
        if self._loop is not None:
            self._answered = self._loop.time()

    def _due(self, block: Deadline) -> float:
        """When `block` is due, as things stand: its timeout after its start plus what
        was stalled since, at most the cap. Later blocks are never due before earlier
        ones (stalled time grows no faster than the clock), so the queue stays in order."""
        stalled = self._stalled - block.stalled_before
        return block.began + min(self.timeout_s + stalled, self.cap_s)


class Deadline:
    """One block of a `Deadlines`, as an async context manager."""

    __slots__ = (
        "_cancelling",
        "_owner",
        "_task",
        "began",
        "cut_short",
        "stalled_before",
        "stalled_s",
        "state",
    )
    began: float  # when the block began, on the loop's clock
    stalled_before: float  # the owner's stalled total then

    def __init__(self, owner: Deadlines) -> None:
        self._owner = owner
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        # `began` and `stalled_before` are set as the block begins (`Deadlines._begin`):
        # only a block that began is read for them, and every store operation makes one.
        self.stalled_s = 0.0  # set when it expires: how long of its wait was stalled
        self.cut_short = False  # ... and whether the cap ended it, not the timeout
        self.state = _RUNNING

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be entered inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        # The task's loop, not get_running_loop(): on 3.11 that is a getpid() system call.
        self._owner._begin(self, task.get_loop())
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

    def expire(self, waited_s: float, stalled_s: float, capped: bool) -> None:
        """Cancel the block, `waited_s` after it began, `stalled_s` of that stalled;
        `capped`: the cap ended it, not the timeout."""
        self.state = _EXPIRED
        self.stalled_s = stalled_s
        self.cut_short = capped
        assert self._task is not None
        self._task.cancel()
