"""What access rules and argument conditions cost a decision, in process (issue 17).

The engine decides on a store that answers at once (`Instant`: every counter admits,
nothing is kept), so what is timed is the engine's own work per call, not Redis or HTTP:

- **Rules that do not match.** The same calls (a user running `terminal` with two
  arguments) under the one-rule policy and under that policy plus access rules and
  `args` conditions none of which covers the call (`UNMATCHED`). Two differences are
  reported: `rules_us`, the same call with its `args` under both policies (what the rules
  cost to look at), and `us_more`, the call as clients send it under each policy: without
  `args` under the one rule (no rule reads them, so clients do not send them) and with
  them under the other (matched, and part of the call's fingerprint). The target is on
  `us_more`, what an operator adding such rules pays per call. Rounds alternate the
  policies; each figure is the median over rounds of a round's difference.
- **A regex catastrophic for backtracking.** One `deny` rule on `args.command`, its
  condition a regex, against a 64 KiB argument that it does not match ('a' x 65535 then
  '!'): patterns that take exponential time in a backtracking engine, against trivial
  ones on the same text. Timed twice: the condition alone (`holds`), and the whole
  decision. `ratio`: the slowest catastrophic pattern over the slowest trivial one.
  `backtracking_ms` is Python's own `re` on the first pattern and 20 characters of the
  same kind, once: what the pattern costs an engine that backtracks (each character more
  doubles it).

    python -m bench.inprocess --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ratewarden.calls import Call
from ratewarden.clock import SystemClock
from ratewarden.engine.engine import Engine
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation, OpResult
from ratewarden.policy import Policy, parse_policy
from ratewarden.policy.conditions import compile_condition
from ratewarden.store import MemoryStore
from ratewarden.vocabulary import daemon_call_id

ONE_RULE = """\
version: 1
rules:
  - {name: per-user, per: [user], rate: 100/minute}
"""
# The one rule, and rules of every issue-17 kind that do not cover the benchmark's call:
# access rules on other tools or users (settled per user and tool, once), and rules on
# the call's own tool whose `args` conditions fail (checked on every call).
UNMATCHED = (
    ONE_RULE
    + """\
  - name: demo-mode
    match: {tool: [file_write, file_delete]}
    deny: "Demo mode: only read-only tools are available"
  - name: console-for-staff
    match: {tool: admin_console}
    unless: {group: staff}
    deny: "admin_console is for staff accounts only"
  - name: no-root-delete
    match: {tool: terminal, args: {command: {regex: '\\brm\\s+-rf\\s+/(\\s|$)'}}}
    deny: "Refusing destructive root delete"
  - name: no-password-hashes
    match: {tool: terminal, args: {command: {contains: /etc/shadow}}}
    deny: "Refusing to read password hashes"
  - name: confirm-forced
    match: {tool: terminal, args: {options.force: true}}
    ask: "forced {tool} calls need a human's approval"
groups:
  staff: [alice, "ops-*"]
"""
)
ARGS = {"command": "ls -la /tmp", "cwd": "/home/agent"}
USERS = 1000
ARGUMENT = "a" * 65535 + "!"  # 64 KiB that none of the patterns below matches
CATASTROPHIC = ("(a+)+$", "(a|aa)+b")  # exponential for a backtracking engine
TRIVIAL = ("b", r"\d")  # a literal the text lacks; a class read at every byte
BACKTRACKING_CHARS = 20


class Instant(MemoryStore):
    """A store that admits every counter at once, keeping nothing: the engine alone."""

    def __init__(self) -> None:
        super().__init__(SystemClock())
        self._admitted = OpResult(True, 1, 99, None, 60_000)

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        return Evaluation([self._admitted] * len(ops))


async def _per_call_us(engine: Engine, calls: int, args: dict[str, Any] | None) -> float:
    """µs per `engine.check` of `calls` calls, each built as the daemon builds it."""
    users = [f"user-{i}" for i in range(USERS)]
    started = time.perf_counter()
    for i in range(calls):
        call = Call(users[i % USERS], "terminal", daemon_call_id(), named=False, args=args)
        decision = await engine.check(call)
    elapsed = time.perf_counter() - started
    if not decision.allowed:  # every rule but the one rate rule must leave the call alone
        raise RuntimeError(f"the benchmark's call was refused: {decision}")
    return elapsed / calls * 1e6


async def measure_unmatched(calls: int, rounds: int) -> dict[str, Any]:
    """The one rule against the one rule plus UNMATCHED's rules, rounds alternating."""
    one = Engine(parse_policy(ONE_RULE.encode(), "bench/inprocess.py"), Instant())
    more = Engine(parse_policy(UNMATCHED.encode(), "bench/inprocess.py"), Instant())
    runs: dict[str, list[float]] = {"one rule": [], "one rule, args": [], "with rules": []}
    for engine, args in ((one, None), (one, ARGS), (more, ARGS)):  # warm every cache
        await _per_call_us(engine, min(calls, 2000), args)
    for _ in range(rounds):
        runs["one rule"].append(await _per_call_us(one, calls, None))
        runs["one rule, args"].append(await _per_call_us(one, calls, ARGS))
        runs["with rules"].append(await _per_call_us(more, calls, ARGS))
    with_rules = runs["with rules"]
    rules_us = [b - a for a, b in zip(runs["one rule, args"], with_rules, strict=True)]
    more_us = [b - a for a, b in zip(runs["one rule"], with_rules, strict=True)]
    return {
        "calls": calls,
        "rounds": rounds,
        "us_per_call": {name: statistics.median(values) for name, values in runs.items()},
        "by_round": runs,
        "rules_us": statistics.median(rules_us),
        "us_more": statistics.median(more_us),
        "rules": [rule.name for rule in more.policy.rules],
        "matched": [a.rule.name for a in more.policy.applicable(_probe())],
    }


def _probe() -> Call:
    return Call("user-0", "terminal", "probe", args=ARGS)


def _regex_policy(pattern: str) -> Policy:
    quoted = pattern.replace("'", "''")
    text = (
        "version: 1\nrules:\n  - name: guard\n"
        f"    match: {{tool: terminal, args: {{command: {{regex: '{quoted}'}}}}}}\n"
        "    deny: refused\n"
    )
    return parse_policy(text.encode(), "bench/inprocess.py")


def _condition_us(pattern: str, times: int) -> float:
    condition = compile_condition({"regex": pattern})
    started = time.perf_counter()
    for _ in range(times):
        if condition.holds(ARGUMENT):
            raise RuntimeError(f"{pattern!r} matched the benchmark's argument")
    return (time.perf_counter() - started) / times * 1e6


async def _decision_us(pattern: str, times: int) -> float:
    engine = Engine(_regex_policy(pattern), Instant())
    args = {"command": ARGUMENT}
    started = time.perf_counter()
    for i in range(times):
        decision = await engine.check(Call("alice", "terminal", f"c{i}", args=args))
        if not decision.allowed:
            raise RuntimeError(f"{pattern!r} refused the benchmark's call")
    return (time.perf_counter() - started) / times * 1e6


def backtracking_ms(pattern: str = CATASTROPHIC[0]) -> float:
    """Python's backtracking `re`, once, on BACKTRACKING_CHARS characters of the kind."""
    text = "a" * BACKTRACKING_CHARS + "!"
    started = time.perf_counter()
    re.search(pattern, text)  # the benchmark's own text: the daemon never uses `re`
    return (time.perf_counter() - started) * 1e3


async def measure_regex(times: int, rounds: int) -> dict[str, Any]:
    patterns = {**dict.fromkeys(CATASTROPHIC, "catastrophic"), **dict.fromkeys(TRIVIAL, "trivial")}
    condition: dict[str, list[float]] = {p: [] for p in patterns}
    decision: dict[str, list[float]] = {p: [] for p in patterns}
    for _ in range(rounds):  # interleaved, so a noisy moment weighs on every pattern
        for pattern in patterns:
            condition[pattern].append(_condition_us(pattern, times))
            decision[pattern].append(await _decision_us(pattern, times))
    rows: dict[str, dict[str, Any]] = {
        pattern: {
            "kind": kind,
            "condition_us": statistics.median(condition[pattern]),
            "decision_us": statistics.median(decision[pattern]),
        }
        for pattern, kind in patterns.items()
    }

    def slowest(kind: str, figure: str) -> float:
        return max(float(row[figure]) for row in rows.values() if row["kind"] == kind)

    return {
        "argument_bytes": len(ARGUMENT),
        "times": times,
        "rounds": rounds,
        "patterns": rows,
        "ratio": slowest("catastrophic", "decision_us") / slowest("trivial", "decision_us"),
        "condition_ratio": (
            slowest("catastrophic", "condition_us") / slowest("trivial", "condition_us")
        ),
        "backtracking_chars": BACKTRACKING_CHARS,
        "backtracking_ms": backtracking_ms(),
    }


def report(found: dict[str, Any]) -> list[str]:
    unmatched, regex = found["unmatched_rules"], found["regex"]
    per_call = unmatched["us_per_call"]
    lines = [
        "| engine in process, a store that answers at once | us/call |",
        "|---|---|",
        f"| one rule, call without args | {per_call['one rule']:.2f} |",
        f"| one rule, call with args | {per_call['one rule, args']:.2f} |",
        f"| one rule and {len(unmatched['rules']) - 1} access and args rules that do not "
        f"match, call with args | {per_call['with rules']:.2f} |",
        f"| the rules, same call: more | {unmatched['rules_us']:.2f} |",
        f"| the rules, args sent only when read: more | {unmatched['us_more']:.2f} |",
        "",
        f"| regex on a {regex['argument_bytes'] // 1024} KiB argument | kind "
        "| condition us | decision us |",
        "|---|---|---|---|",
    ]
    for pattern, row in regex["patterns"].items():
        shown = pattern.replace("|", "\\|")  # a table cell: the pipe escaped
        lines.append(
            f"| `{shown}` | {row['kind']} | {row['condition_us']:.1f} | {row['decision_us']:.1f} |"
        )
    lines += [
        "",
        f"Slowest catastrophic / slowest trivial: {regex['ratio']:.2f} per decision, "
        f"{regex['condition_ratio']:.2f} per condition. Python's backtracking `re` takes "
        f"{regex['backtracking_ms']:.0f} ms for `{CATASTROPHIC[0]}` on "
        f"{regex['backtracking_chars']} characters.",
    ]
    return lines


async def run_inprocess(quick: bool) -> dict[str, Any]:
    return {
        "unmatched_rules": await measure_unmatched(2_000 if quick else 50_000, 3 if quick else 7),
        "regex": await measure_regex(20 if quick else 200, 3 if quick else 5),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run_inprocess(args.quick)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
