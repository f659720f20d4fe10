"""`Deadlines`: the same answers as `asyncio.timeout`, on one timer for many blocks.

Run on asyncio's loop and on uvloop (the daemon's), on the loop's real clock: the
blocks' waits are whole multiples of the timeout apart, so which blocks overrun never
depends on scheduling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from ratewarden.store.deadlines import Deadlines

TIMEOUT = 0.05

Runner = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    return asyncio.run if request.param == "asyncio" else uvloop.run  # type: ignore[return-value]


async def _block(deadlines: Deadlines, seconds: float) -> str:
    try:
        async with deadlines():
            await asyncio.sleep(seconds)
    except TimeoutError:
        return "timed out"
    return "done"


def test_a_block_past_its_timeout_raises_timeout_error_and_others_finish(run: Runner) -> None:
    async def main() -> list[str]:
        deadlines = Deadlines(TIMEOUT)
        waits = [0, TIMEOUT * 4, 0.001, TIMEOUT * 6, 0]
        return await asyncio.gather(*(_block(deadlines, wait) for wait in waits))

    assert run(main()) == ["done", "timed out", "done", "timed out", "done"]


def test_each_block_is_timed_from_its_own_start(run: Runner) -> None:
    """Blocks begun one after another: a later one is not cut short by an earlier one's
    deadline, and each overrunning one is cancelled near its own."""

    async def main() -> tuple[list[str], list[float]]:
        deadlines = Deadlines(TIMEOUT)
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
        deadlines = Deadlines(TIMEOUT * 20)

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
        short, long = Deadlines(TIMEOUT), Deadlines(TIMEOUT * 20)

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
        deadlines = Deadlines(TIMEOUT)
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
    deadlines = Deadlines(TIMEOUT)

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
        deadlines = Deadlines(TIMEOUT)
        return [
            await outcome(timeout, body)
            for body in (swallows, replaces)
            for timeout in (deadlines, lambda: asyncio.timeout(TIMEOUT))
        ]

    assert run(main()) == ["swallowed", "swallowed", "own error", "own error"]
