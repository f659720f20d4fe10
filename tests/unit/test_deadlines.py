"""`Deadlines`: the same answers as `asyncio.timeout`, on one timer for many blocks;
and time in which the daemon was stalled does not count.

The first tests run on asyncio's loop and on uvloop (the daemon's), on the loop's real
clock: the blocks' waits are whole multiples of the timeout apart, so which blocks
overrun never depends on scheduling. The stalls are played on a loop whose clock the
test moves (`StallingLoop`), so they are exact.
"""

from __future__ import annotations

import asyncio
import re
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

import pytest
import uvloop

from ratewarden.store.base import StoreError
from ratewarden.store.breaker import CircuitBreaker, GuardedStore
from ratewarden.store.deadlines import SLACK_S, STALL_CAP, Deadlines
from tests.stores.test_outage import HangingStore

TIMEOUT = 0.05

Runner = Callable[[Coroutine[Any, Any, Any]], Any]


def deadlines_of(timeout_s: float, cpu_wait: Callable[[], float] = lambda: 0.0) -> Deadlines:
    """Deadlines that see stalls by their ticks alone, unless told how long the daemon
    waited for a CPU: the machine's own count would make these tests depend on what
    else it runs."""
    return Deadlines(timeout_s, cpu_wait)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    return asyncio.run if request.param == "asyncio" else uvloop.run


async def _block(deadlines: Deadlines, seconds: float) -> str:
    try:
        async with deadlines():
            await asyncio.sleep(seconds)
    except TimeoutError:
        return "timed out"
    return "done"


def test_a_block_past_its_timeout_raises_timeout_error_and_others_finish(run: Runner) -> None:
    async def main() -> list[str]:
        deadlines = deadlines_of(TIMEOUT)
        waits = [0, TIMEOUT * 4, 0.001, TIMEOUT * 6, 0]
        return await asyncio.gather(*(_block(deadlines, wait) for wait in waits))

    assert run(main()) == ["done", "timed out", "done", "timed out", "done"]


def test_each_block_is_timed_from_its_own_start(run: Runner) -> None:
    """Blocks begun one after another: a later one is not cut short by an earlier one's
    deadline, and each overrunning one is cancelled near its own."""

    async def main() -> tuple[list[str], list[float]]:
        deadlines = deadlines_of(TIMEOUT)
        loop = asyncio.get_running_loop()
        ended: list[float] = []

        async def timed(wait: float) -> str:
            begun = loop.time()
            outcome = await _block(deadlines, wait)
            ended.append(loop.time() - begun)
            return outcome

        tasks = []
        for wait in (TIMEOUT * 0.5, TIMEOUT * 10, TIMEOUT * 0.5, TIMEOUT * 10):
            tasks.append(asyncio.ensure_future(timed(wait)))
            await asyncio.sleep(TIMEOUT * 0.6)  # the next begins after the last's deadline
        return await asyncio.gather(*tasks), ended

    outcomes, durations = run(main())
    assert outcomes == ["done", "timed out", "done", "timed out"]
    # Overrunning blocks end at their deadline (and the loop's clock resolution), not at
    # the end of their wait (ten timeouts) nor at an earlier block's deadline.
    assert all(TIMEOUT * 0.9 <= d < TIMEOUT * 5 for d in sorted(durations)[2:])


def test_a_cancellation_from_elsewhere_stays_a_cancellation(run: Runner) -> None:
    async def main() -> None:
        deadlines = deadlines_of(TIMEOUT * 20)

        async def body() -> None:
            async with deadlines():
                await asyncio.sleep(10)

        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())


def test_an_outer_timeout_is_the_outer_ones_and_an_inner_one_the_inner_ones(run: Runner) -> None:
    async def main() -> tuple[str, str]:
        short, long = deadlines_of(TIMEOUT), deadlines_of(TIMEOUT * 20)

        async def inner_fires() -> str:
            try:
                async with long():
                    try:
                        async with short():
                            await asyncio.sleep(10)
                    except TimeoutError:
                        return "inner"
            except TimeoutError:
                return "outer"
            return "none"

        async def outer_fires() -> str:
            try:
                async with short():
                    try:
                        async with long():
                            await asyncio.sleep(10)
                    except TimeoutError:
                        return "inner"
            except TimeoutError:
                return "outer"
            return "none"

        return await inner_fires(), await outer_fires()

    assert run(main()) == ("inner", "outer")


def test_a_block_that_raises_keeps_its_error_and_finished_blocks_leave_the_queue(
    run: Runner,
) -> None:
    async def main() -> int:
        deadlines = deadlines_of(TIMEOUT)
        with pytest.raises(KeyError):
            async with deadlines():
                raise KeyError("x")
        for _ in range(1000):
            async with deadlines():
                await asyncio.sleep(0)
        await asyncio.sleep(TIMEOUT * 3)  # the timer fires, finds them all finished
        return len(deadlines._running)

    assert run(main()) == 0


def test_one_deadlines_serves_loop_after_loop() -> None:
    """A timer armed on a loop that has closed never fires: the next loop arms its own."""
    deadlines = deadlines_of(TIMEOUT)

    async def leave_timer_armed() -> None:
        async with deadlines():
            pass

    asyncio.run(leave_timer_armed())
    assert asyncio.run(_block(deadlines, TIMEOUT * 10)) == "timed out"
    assert uvloop.run(_block(deadlines, TIMEOUT * 10)) == "timed out"


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        Deadlines(0)


def test_a_body_that_handles_its_cancellation_ends_as_under_asyncio_timeout(run: Runner) -> None:
    """Cancelled at its deadline, a body that catches the cancellation and returns, or
    raises an error of its own, ends the same way under both."""

    async def swallows() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    async def replaces() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise KeyError("own") from None
        return "slept"

    async def outcome(timeout: Callable[[], Any], body: Callable[[], Any]) -> str:
        try:
            async with timeout():
                return str(await body())
        except TimeoutError:
            return "timed out"
        except KeyError:
            return "own error"

    async def main() -> list[str]:
        deadlines = deadlines_of(TIMEOUT)
        return [
            await outcome(timeout, body)
            for body in (swallows, replaces)
            for timeout in (deadlines, lambda: asyncio.timeout(TIMEOUT))
        ]

    assert run(main()) == ["swallowed", "swallowed", "own error", "own error"]


# -- a stalled daemon: on a loop whose clock the test moves ---------------------------------


class VirtualSelector(selectors.DefaultSelector):
    """Waits in no time: a wait for the next timer moves the loop's clock to it."""

    loop: StallingLoop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and timeout > 0:
            self.loop.now += timeout
        return super().select(0)


class StallingLoop(asyncio.SelectorEventLoop):
    """An event loop on a clock of its own, which `stall` moves as if the process had
    been stopped (or starved of CPU) for that long in the middle of a callback."""

    def __init__(self) -> None:
        selector = VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def stall(self, seconds: float) -> None:
        self.now += seconds


def on_stalling_loop(main: Callable[[StallingLoop], Coroutine[Any, Any, Any]]) -> Any:
    loop = StallingLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


class Outcome(NamedTuple):
    outcome: str
    waited_s: float  # on the loop's clock
    stalled_s: float
    cut_short: bool


async def timed_block(loop: StallingLoop, deadlines: Deadlines, answer: Any) -> Outcome:
    """A block that waits for `answer` (a future, or an awaitable never done)."""
    began = loop.time()
    deadline = deadlines()
    try:
        async with deadline:
            await answer
    except TimeoutError:
        return Outcome("timed out", loop.time() - began, deadline.stalled_s, deadline.cut_short)
    return Outcome("done", loop.time() - began, deadline.stalled_s, deadline.cut_short)


def stall_every(loop: StallingLoop, stalled_s: float, running_s: float) -> None:
    """Stop the daemon for `stalled_s`, let it run `running_s`, and so on."""
    loop.stall(stalled_s)
    loop.call_later(running_s, stall_every, loop, stalled_s, running_s)


def test_an_idle_daemon_still_cuts_a_hung_store_at_the_timeout() -> None:
    async def main(loop: StallingLoop) -> Outcome:
        return await timed_block(loop, deadlines_of(TIMEOUT * 2), loop.create_future())

    found = on_stalling_loop(main)
    assert found.outcome == "timed out"
    assert found.waited_s == pytest.approx(TIMEOUT * 2, abs=SLACK_S)
    assert (found.stalled_s, found.cut_short) == (0.0, False)


def test_an_answer_that_came_while_the_daemon_was_stopped_is_read_not_timed_out() -> None:
    """The store answers after 20 ms; the daemon is stopped from 5 ms to 155 ms, past its
    100 ms timeout. On the wall clock the deadline is long past when the daemon runs
    again; but only 5 ms of it ran, and the answer is read."""

    async def main(loop: StallingLoop) -> Outcome:
        deadlines = deadlines_of(0.1)
        answer = loop.create_future()
        loop.call_later(0.02, answer.set_result, "answer")  # in the socket from then on
        loop.call_later(0.005, loop.stall, 0.15)
        return await timed_block(loop, deadlines, answer)

    found = on_stalling_loop(main)
    assert found.outcome == "done"
    assert found.waited_s == pytest.approx(0.155, abs=SLACK_S)


def test_a_hung_store_is_cut_once_the_daemon_ran_for_the_timeout() -> None:
    """Stopped 150 ms, running 50 ms, over and over: a store that never answers is cut
    when the daemon has run for its 100 ms, not before, and well within the cap."""

    async def main(loop: StallingLoop) -> Outcome:
        loop.call_later(0.01, stall_every, loop, 0.15, 0.05)
        return await timed_block(loop, deadlines_of(0.1), loop.create_future())

    found = on_stalling_loop(main)
    assert found.outcome == "timed out"
    assert found.cut_short is False
    ran = found.waited_s - found.stalled_s
    # Ran its timeout, give or take what a tick cannot see (a tenth of the timeout).
    assert 0.1 - SLACK_S <= ran <= 0.1 + 0.01 + SLACK_S, found
    assert found.stalled_s >= 2 * (0.15 - SLACK_S) - 1e-9  # waited through two stops
    assert found.waited_s < 0.1 * STALL_CAP


def test_a_daemon_that_never_runs_freely_answers_at_the_cap() -> None:
    """Stalled 150 ms on every loop turn: the block never gets its timeout of running
    time, and ends at the cap (10 timeouts), cut short, however long stalls go on."""

    async def main(loop: StallingLoop) -> Outcome:
        def stall_each_turn() -> None:
            loop.stall(0.15)
            loop.call_soon(stall_each_turn)

        loop.call_soon(stall_each_turn)
        return await timed_block(loop, deadlines_of(0.1), loop.create_future())

    found = on_stalling_loop(main)
    assert found.outcome == "timed out"
    assert found.cut_short is True
    assert 0.1 * STALL_CAP <= found.waited_s <= 0.1 * STALL_CAP + 3 * 0.15, found  # turns
    assert found.stalled_s > 0.1 * STALL_CAP - 0.1  # it ran for less than its timeout


def test_a_store_that_answers_others_is_not_hung_and_one_that_stops_is_cut() -> None:
    """A block past its timeout waits on while the store answers other blocks (the
    daemon is behind on handing answers out); once the store stops answering, it is cut
    one timeout after the last answer."""

    async def main(loop: StallingLoop) -> tuple[Outcome, float]:
        deadlines = deadlines_of(0.1)
        began = loop.time()
        waiting = asyncio.ensure_future(timed_block(loop, deadlines, loop.create_future()))
        for _ in range(10):  # an answer to another block every 30 ms, for 300 ms
            await asyncio.sleep(0.03)
            deadlines.answered()
        answering = loop.time() - began
        return await waiting, answering

    found, answering = on_stalling_loop(main)
    assert found.outcome == "timed out"
    assert (found.stalled_s, found.cut_short) == (0.0, False)
    # Cut at the first tick a timeout after the last answer.
    assert answering + 0.1 - SLACK_S <= found.waited_s <= answering + 0.1 + 0.01 + SLACK_S


def test_a_daemon_starved_of_cpu_in_short_slices_waits_for_its_answer() -> None:
    """Starved of CPU in slices shorter than a tick (4 ms of every 5 waiting for one),
    the loop's ticks are hardly late; the CPU wait the kernel counts is what shows the
    stall. The answer, in the socket after 20 ms, is read; a hung store is cut once the
    daemon ran for its 100 ms. Seen by the ticks alone, the hung store was cut after a
    fraction of the daemon's running time."""
    waited_for_cpu = [0.0]

    def starve(loop: StallingLoop) -> None:
        loop.stall(0.004)  # runnable, but the CPU was another process's
        waited_for_cpu[0] += 0.004
        loop.call_later(0.001, starve, loop)

    async def main(loop: StallingLoop, answer_after: float | None, counted: bool) -> Outcome:
        count = (lambda: waited_for_cpu[0]) if counted else (lambda: 0.0)
        answer = loop.create_future()
        if answer_after is not None:
            loop.call_later(answer_after, answer.set_result, "answer")
        loop.call_soon(starve, loop)
        return await timed_block(loop, deadlines_of(0.1, count), answer)

    assert on_stalling_loop(lambda loop: main(loop, 0.02, True)).outcome == "done"
    hung = on_stalling_loop(lambda loop: main(loop, None, True))
    assert hung.outcome == "timed out"
    assert 0.1 - SLACK_S <= hung.waited_s - hung.stalled_s <= 0.1 + 0.01 + SLACK_S, hung
    assert hung.waited_s >= 0.4  # four fifths of its wait it could not run
    ticks_alone = on_stalling_loop(lambda loop: main(loop, None, False))
    assert ticks_alone.waited_s < 0.3, ticks_alone


def test_a_block_that_began_after_a_stall_is_not_credited_with_it() -> None:
    """A block begun just after the daemon resumed, before the late tick that tells of
    the stall fires, gets no extension for a stall that was over before it began."""

    async def main(loop: StallingLoop) -> list[Outcome]:
        deadlines = deadlines_of(0.1)
        first = asyncio.ensure_future(timed_block(loop, deadlines, loop.create_future()))
        await asyncio.sleep(0)  # the first block is in
        loop.stall(0.15)  # in this very callback: no tick has run since
        second = asyncio.ensure_future(timed_block(loop, deadlines, loop.create_future()))
        return list(await asyncio.gather(first, second))

    first, second = on_stalling_loop(main)
    assert first.outcome == second.outcome == "timed out"
    assert first.waited_s - first.stalled_s == pytest.approx(0.1, abs=SLACK_S)
    assert first.stalled_s == pytest.approx(0.15 - 0.01, abs=2 * SLACK_S)
    assert second.waited_s == pytest.approx(0.1, abs=SLACK_S)
    assert second.stalled_s == pytest.approx(0.0, abs=SLACK_S)


def test_the_guarded_store_does_not_count_a_stalled_daemon_against_the_store() -> None:
    """A hung store on a daemon that never runs freely: the caller is answered at the cap
    (a StoreError, for the fail mode) but the breaker, which opens at the first real
    failure here, stays closed; on an idle loop the same hang opens it."""

    async def main(loop: StallingLoop, stalling: bool) -> tuple[str, str]:
        store = HangingStore()
        store.hanging = True
        breaker = CircuitBreaker(failures=1, now=loop.time)
        guarded = GuardedStore(store, 100, breaker)

        def stall_each_turn() -> None:
            loop.stall(0.15)
            if stalling:
                loop.call_soon(stall_each_turn)

        if stalling:
            loop.call_soon(stall_each_turn)
        with pytest.raises(StoreError) as failed:
            await guarded.ping()
        return str(failed.value), breaker.state

    stalled, state = on_stalling_loop(lambda loop: main(loop, True))
    assert state == "closed"
    assert re.fullmatch(
        r"ping not answered within 1000 ms while the daemon was behind \(\d+ ms of it stalled\)",
        stalled,
    ), stalled
    idle, state = on_stalling_loop(lambda loop: main(loop, False))
    assert (idle, state) == ("ping timed out after 100 ms", "open")
