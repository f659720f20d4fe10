"""Loop rules keyed on results (issue 29): what a check and its settle cost, on Redis.

The engine in process on a private redis-server (no HTTP: the figures are the engine's
and the store's), 32 calls at a time, each row's calls spread over 2 000 users (one
counter each, nothing refused), with ids the daemon made up (so only a call that must be
settled is recorded). Rows:

- **one rule**: a check under bench/workload.ONE_RULE (a sliding window per user), the
  baseline;
- **identical-call loop**: a check under a rule per `[user, tool, args]`, no settle;
- **result-keyed loop**: a check and its settle with a `result_digest` under the same
  rule with `same_result: true`; *same result*: every settle brings the result kept (the
  count goes on); *new result*: each settle brings another one (the count restarts);
  *no digest*: settles that carry none;
- **budget**: a check reserving 0.01 under a budget per user and its settle at 0.005 (what
  a settle charges, and since issue 30 item 2 its day's spend record: one GET and one SET
  more per budget charged).

Per call: wall-clock µs (the rows alternate in rounds, the median round kept), and
Redis's script runs and commands (`INFO commandstats` before and after, INFO left out).
Timing moves by 10 % between rounds on a shared machine; the command counts do not.

    .venv/bin/python -m bench.loop [--calls 20000] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.redis_server import redis_server, refuse_shared
from bench.workload import ONE_RULE
from ratewarden.arguments import result_digest
from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store.redis_store import RedisStore

USERS = 2_000
CONCURRENCY = 32
BUDGET_RULE = "version: 1\nrules:\n  - {name: spend, per: [user], budget: 100000.00/day}\n"


def loop_rule(same_result: bool) -> str:
    extra = ", same_result: true" if same_result else ""
    return (
        f"version: 1\nrules:\n  - {{name: loop, per: [user, tool, args], rate: 1000/hour{extra}}}\n"
    )


@dataclass(frozen=True)
class Row:
    name: str
    policy: str
    settle: str | None  # None: no settle; "same", "new", "none": the digest it carries;
    # "budget": a reservation settled at half its estimate


ROWS = (
    Row("one rule (check)", ONE_RULE, None),
    Row("identical-call loop (check)", loop_rule(False), None),
    Row("result-keyed loop, same result (check + settle)", loop_rule(True), "same"),
    Row("result-keyed loop, new result (check + settle)", loop_rule(True), "new"),
    Row("result-keyed loop, no digest (check + settle)", loop_rule(True), "none"),
    Row("budget (check + settle)", BUDGET_RULE, "budget"),
)
SCRIPTS = ("cmdstat_evalsha", "cmdstat_eval")
NOT_COUNTED = ("cmdstat_info", "cmdstat_hello", "cmdstat_client|setinfo")


def commands(info: dict[str, Any]) -> tuple[int, int]:
    """(script runs, all commands) as INFO commandstats counts them."""
    scripts = sum(int(info[k]["calls"]) for k in SCRIPTS if k in info)
    total = sum(int(v["calls"]) for k, v in info.items() if k not in NOT_COUNTED)
    return scripts, total


async def run_row(url: str, row: Row, calls: int, round_no: int) -> tuple[float, float, float]:
    """µs per call, script runs per call, commands per call."""
    client = aioredis.Redis.from_url(url)
    store = RedisStore(aioredis.Redis.from_url(url), url)
    await store.start()
    engine = Engine(parse_policy(row.policy.encode()), store)
    same = result_digest("same")
    queue = iter(range(calls))

    async def worker() -> None:
        for i in queue:
            # As a client sends it: no call_id of its own (the daemon's, which the answer
            # gives back for the settle), so only a call that must be settled is recorded.
            user, args = f"user-{i % USERS}", {"run": i % USERS}
            cost = 0.01 if row.settle == "budget" else None
            call = Call(user, "ci_status", f"r{round_no}-{i}", args=args, named=False, cost=cost)
            decided = await engine.check(call)
            assert decided.allowed, decided.message
            if row.settle is None:
                continue
            if row.settle == "budget":
                assert (await engine.settle(call.call_id, 0.005)).outcome == "settled"
                continue
            if row.settle == "same":
                digest: str | None = same
            elif row.settle == "new":
                digest = result_digest(f"{round_no}-{i}")
            else:
                digest = None
            assert (await engine.settle(call.call_id, result_digest=digest)).outcome == "settled"

    before = commands(await client.info("commandstats"))
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    after = commands(await client.info("commandstats"))
    await store.close()
    await client.aclose()
    return (
        elapsed / calls * 1e6,
        (after[0] - before[0]) / calls,
        (after[1] - before[1]) / calls,
    )


async def measure(url: str, calls: int, rounds: int) -> dict[str, tuple[float, float, float]]:
    refuse_shared(url)  # every row starts from a FLUSHALL
    found: dict[str, list[tuple[float, float, float]]] = {row.name: [] for row in ROWS}
    client = aioredis.Redis.from_url(url)
    for round_no in range(rounds):
        for row in ROWS:
            await client.flushall()
            # Once to fill the counters (and, for "same"/"new", keep a first result), then
            # measured: every call finds its counter and its kept result in place.
            await run_row(url, row, USERS, round_no * 1000 + 999)
            found[row.name].append(await run_row(url, row, calls, round_no))
    await client.aclose()
    return {name: _median(results) for name, results in found.items()}


def _median(results: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    ordered = sorted(results)
    return ordered[len(ordered) // 2]


def report(figures: dict[str, tuple[float, float, float]]) -> list[str]:
    base = figures[ROWS[0].name][0]
    lines = [
        "| row | µs per call | / one rule | script runs per call | Redis commands per call |",
        "|---|---|---|---|---|",
    ]
    for name, (us, scripts, total) in figures.items():
        lines.append(f"| {name} | {us:.0f} | {us / base:.2f} | {scripts:.2f} | {total:.2f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loop", description=__doc__)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="500 calls, one round")
    args = parser.parse_args(argv)
    calls, rounds = (500, 1) if args.quick else (args.calls, args.rounds)
    with tempfile.TemporaryDirectory() as workdir, redis_server(Path(workdir)) as port:
        figures = asyncio.run(measure(f"redis://127.0.0.1:{port}/0", calls, rounds))
    print("\n".join(report(figures)))
    print(f"\n{calls} calls per row and round, {rounds} rounds, median round per row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
