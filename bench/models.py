"""What a model call costs the daemon next to a tool call (issue 31): a check and its
settle, each as the daemon does them, side by side in one run.

Both go the daemon's way from the request's bytes: the body validated by the wire's
model (a model call's validator included), made a `Call` (service/convert.py), decided
by the engine, then the settle's body validated and the call settled. The store is a
`MemoryStore` (the same arithmetic as Redis' scripts, no round trip), so what differs
is the model call's own work: its validator, its price (its most at the check, its
usage at the settle) and its fingerprint, against the tool's catalogue cost. With Redis
in the loop the two would share its round trips, and the ratio come nearer 1. Rounds
alternate the two; the ratio is the median of each round's.

    python -m bench.models --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ratewarden.clock import SystemClock
from ratewarden.engine.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.service.convert import to_call
from ratewarden.store import MemoryStore
from ratewarden.wire.bodies import CheckRequest, SettleRequest

POLICY = """\
version: 1
tools:
  terminal: {cost: 0.0001}
rules:
  - {name: per-user, per: [user], rate: 1000000/minute, algorithm: fixed_window}
  - {name: daily-spend, match: {kind: any}, per: [user], budget: 1000000.00/day}
"""
USERS = 100
TOOL = b'{"user": "user-%d", "tool": "terminal"}'
MODEL = (
    b'{"user": "user-%d", "kind": "model", "model": "gpt-4o", "input_tokens": 1200, '
    b'"max_output_tokens": 4000}'
)
TOOL_SETTLE = b'{"status": "ok", "cost": 0.0001}'
MODEL_SETTLE = (
    b'{"status": "ok", "usage": {"input_tokens": 1180, "output_tokens": 350, '
    b'"cache_read_tokens": 1024}}'
)


async def _pairs_us(engine: Engine, body: bytes, settle: bytes, calls: int) -> float:
    """µs per check and settle of `calls` calls, from their bytes."""
    bodies = [body % (i % USERS) for i in range(USERS)]
    started = time.perf_counter()
    for i in range(calls):
        decision = await engine.check(to_call(CheckRequest.model_validate_json(bodies[i % USERS])))
        ended = SettleRequest.model_validate_json(settle)
        await engine.settle(decision.call_id, ended.cost, result_digest=None, usage=ended.usage)
    elapsed = time.perf_counter() - started
    if not decision.allowed:
        raise RuntimeError(f"the benchmark's call was refused: {decision}")
    return elapsed / calls * 1e6


async def measure_models(calls: int, rounds: int) -> dict[str, Any]:
    engine = Engine(parse_policy(POLICY.encode(), "bench/models.py"), MemoryStore(SystemClock()))
    runs: dict[str, list[float]] = {"tool call": [], "model call": []}
    await _pairs_us(engine, TOOL, TOOL_SETTLE, min(calls, 2000))  # warm every cache
    await _pairs_us(engine, MODEL, MODEL_SETTLE, min(calls, 2000))
    for _ in range(rounds):
        runs["tool call"].append(await _pairs_us(engine, TOOL, TOOL_SETTLE, calls))
        runs["model call"].append(await _pairs_us(engine, MODEL, MODEL_SETTLE, calls))
    per_round = [m / t for t, m in zip(runs["tool call"], runs["model call"], strict=True)]
    return {
        "calls": calls,
        "rounds": rounds,
        "us_per_check_and_settle": {name: statistics.median(v) for name, v in runs.items()},
        "by_round": runs,
        "ratio": statistics.median(per_round),
    }


def report(found: dict[str, Any]) -> list[str]:
    per = found["us_per_check_and_settle"]
    return [
        "| a check and its settle, from their bytes, memory store | us |",
        "|---|---|",
        f"| tool call (catalogue cost) | {per['tool call']:.1f} |",
        f"| model call (priced at check and settle) | {per['model call']:.1f} |",
        f"| model / tool | {found['ratio']:.2f} |",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    found = asyncio.run(measure_models(2_000 if args.quick else 20_000, 3 if args.quick else 7))
    print(json.dumps(found, indent=2))
    print("\n".join(report(found)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
