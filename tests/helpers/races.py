"""Races between real processes: each opens its own connections, as separate daemons do."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def race(
    target: Callable[..., None], args: tuple[Any, ...], processes: int, *extra: Any
) -> tuple[list[Any], list[int | None]]:
    """Runs `target(*args, barrier, results, n, *extra)` in `processes` spawned processes
    (n = 0, 1, ...), which wait at the barrier to start together and each put one item on
    `results`. Returns the items (in arrival order) and the processes' exit codes."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    started = [
        ctx.Process(target=target, args=(*args, barrier, results, n, *extra))
        for n in range(processes)
    ]
    for process in started:
        process.start()
    try:
        outcomes = [results.get(timeout=90) for _ in started]
    finally:
        for process in started:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
    return outcomes, [process.exitcode for process in started]
