"""The refused hammer (issue 17): one user repeating a call the daemon already refused.

A looping agent asks again at once, and again. The daemon remembers a rate refusal until
its `retry_after` (engine/refusals.py), so such attempts should cost Redis nothing. This
part measures it over HTTP, at saturation, against the Redis-backed daemon with one rule
(a sliding window per user, `100/hour` so that no wait ends while it is measured):

- before the load, the one user's calls are sent until one is refused (`refuse`);
- the load generator then sends that same call on every connection (`hammer.jsonl`);
- Redis's `INFO commandstats` and the daemon's `ratewarden_checks_total` are read just
  before and after the load generator's run, so every attempt in it (warm-up included)
  is set against every command Redis ran meanwhile: script runs (EVALSHA, EVAL) and all
  commands (those run inside scripts and the audit trail's LPUSH and LTRIM of the
  recent-denials list included; INFO and connection set-up, HELLO and CLIENT SETINFO,
  left out: they are the benchmark's own, or once per connection).

Attempts/s is reported against the one-rule server's allowed decisions/s, each within a
round, the median over rounds (as every ratio of bench/run.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import httpx

HAMMER_RULE = """\
version: 1
rules:
  - name: per-user
    per: [user]
    rate: 100/hour
"""
HAMMERED = {"user": "hammered", "tool": "terminal"}
SCRIPTS = ("cmdstat_evalsha", "cmdstat_eval")
NOT_COUNTED = ("cmdstat_info", "cmdstat_hello", "cmdstat_client|setinfo")
MAX_CALLS = 1_000  # to get the first refusal: the rule admits 100


@dataclass(frozen=True, slots=True)
class Counts:
    """What Redis and the daemon had done at one moment."""

    commands: dict[str, int]  # calls per command, as INFO commandstats counts them
    checks: dict[str, float]  # ratewarden_checks_total per decision


def refuse(port: int) -> int:
    """Send the hammered call until the daemon refuses it; how many it took."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        for sent in range(1, MAX_CALLS + 1):
            if http.post("/v1/check", json=HAMMERED).json()["decision"] == "deny":
                return sent
    raise RuntimeError(f"the hammered call was not refused in {MAX_CALLS} calls")


def counts(port: int, info: dict[str, Any]) -> Counts:
    """`info`: Redis's INFO commandstats; `port`: the daemon's, for its /metrics."""
    commands = {
        name: int(stats["calls"])
        for name, stats in info.items()
        if name.startswith("cmdstat_") and name not in NOT_COUNTED
    }
    return Counts(commands, checks_made(port))


def checks_made(port: int) -> dict[str, float]:
    """ratewarden_checks_total by decision, from the daemon's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    made: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ratewarden_checks_total{"):
            labels, value = line.rsplit(" ", 1)
            decision = labels.split('decision="', 1)[1].split('"', 1)[0]
            made[decision] = made.get(decision, 0.0) + float(value)
    return made


def per_attempt(before: Counts, after: Counts) -> dict[str, float]:
    """Redis's work over the attempts made between two counts."""

    def more(name: str) -> float:
        return after.commands.get(name, 0) - before.commands.get(name, 0)

    attempts = sum(after.checks.values()) - sum(before.checks.values())
    refused = after.checks.get("deny", 0.0) - before.checks.get("deny", 0.0)
    return {
        "attempts": attempts,
        "refused": refused,
        "commands": sum(more(name) for name in after.commands),
        "scripts": sum(more(name) for name in SCRIPTS),
        "commands_per_attempt": sum(more(name) for name in after.commands) / attempts,
        "scripts_per_attempt": sum(more(name) for name in SCRIPTS) / attempts,
    }


def summary(http: dict[str, Any]) -> dict[str, Any]:
    """The hammer's figures over every round, and against the one-rule server's."""
    hammer, one = http["rounds"]["refused hammer"], http["rounds"]["one rule"]
    ratios = [h["decisions_per_s"] / o["decisions_per_s"] for h, o in zip(hammer, one, strict=True)]
    redis = [run["redis_per_attempt"] for run in hammer]
    attempts = sum(r["attempts"] for r in redis)
    return {
        "attempts_per_s": http["saturation"]["refused hammer"]["decisions_per_s"],
        "one_rule_decisions_per_s": http["saturation"]["one rule"]["decisions_per_s"],
        "ratio_by_round": ratios,
        "ratio": statistics.median(ratios),
        "attempts": attempts,
        "refused_share": sum(r["refused"] for r in redis) / attempts,
        "commands_per_attempt": sum(r["commands"] for r in redis) / attempts,
        "scripts_per_attempt": sum(r["scripts"] for r in redis) / attempts,
        "rule": HAMMER_RULE,
    }


def report(found: dict[str, Any]) -> list[str]:
    return [
        "| refused hammer | attempts/s | one rule (allowed) decisions/s | hammer / one rule "
        "| Redis commands/attempt | script runs/attempt |",
        "|---|---|---|---|---|---|",
        f"| one user, refused, {found['attempts']:.0f} attempts "
        f"| {found['attempts_per_s']:.0f} | {found['one_rule_decisions_per_s']:.0f} "
        f"| {found['ratio']:.2f} | {found['commands_per_attempt']:.4f} "
        f"| {found['scripts_per_attempt']:.4f} |",
    ]
