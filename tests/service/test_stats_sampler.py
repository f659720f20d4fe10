"""The console overview's arithmetic (service/console.py), without a browser: per-minute
figures from readings of the decision counters, the window's totals, and the ring's bound.

(Here beside the console's browser tests; it needs no browser, Redis or daemon.)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from ratewarden.service.console import (
    RING_SIZE,
    WINDOW_MINUTES,
    StatsSampler,
    at_or_before,
    minutes,
    read_counters,
    totals,
)
from ratewarden.service.metrics import Metrics

START = 1_700_000_040.0  # a minute's start (1_700_000_040 = 28_333_334 * 60)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def decide(metrics: Metrics, decision: str, rule: str = "", tool: str = "terminal") -> None:
    metrics.checks.labels(decision, "enforce").inc()
    if decision == "deny":
        metrics.blocked.labels(tool, rule, "rate").inc()
    elif decision == "ask":
        metrics.asked.labels(tool, rule, "rate").inc()


def test_each_minute_counts_what_happened_in_it() -> None:
    metrics, clock = Metrics(CollectorRegistry()), Clock()
    sampler = StatsSampler(metrics, clock=clock)
    sampler.sample()  # the baseline at start-up
    clock.now = START + 10
    for _ in range(3):
        decide(metrics, "allow")
    decide(metrics, "deny", "terminal-per-minute")
    clock.now = START + 15
    sampler.sample()
    clock.now = START + 65  # the next minute
    decide(metrics, "ask", "destructive", tool="file_delete")
    decide(metrics, "allow")
    clock.now = START + 70
    now = read_counters(metrics, clock.now)

    found = minutes(sampler, now)
    assert len(found) == WINDOW_MINUTES
    assert [(m.decisions, m.refusals) for m in found[-2:]] == [(4, 1), (2, 1)]
    assert all(m.decisions == 0 for m in found[:-2])  # before start-up: nothing
    assert found[-1].start == "2023-11-14T22:15:00+00:00"

    window = totals(now, at_or_before(clock.now - WINDOW_MINUTES * 60, [*sampler.ring]))
    assert (window.decisions, window.allowed, window.denied, window.asked) == (6, 4, 1, 1)
    assert window.refusals == 2
    assert window.denial_ratio == round(2 / 6, 4)


def test_the_window_forgets_what_is_older_than_fifteen_minutes() -> None:
    metrics, clock = Metrics(CollectorRegistry()), Clock()
    sampler = StatsSampler(metrics, clock=clock)
    sampler.sample()
    decide(metrics, "deny", "old-rule")
    for step in range(1, RING_SIZE + 20):  # twenty minutes of readings, 5 s apart
        clock.now = START + 5 * step
        sampler.sample()
    assert len(sampler.ring) == RING_SIZE
    now = read_counters(metrics, clock.now)
    then = at_or_before(clock.now - WINDOW_MINUTES * 60, [*sampler.ring, now])
    window = totals(now, then)
    assert window.decisions == 0
    assert window.denial_ratio is None
    assert sum(m.decisions for m in minutes(sampler, now)) == 0
