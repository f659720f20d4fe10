"""The operator's console: a static page at `/console`, and `GET /v1/admin/stats` for it.

The page (console_assets/) is a shell of HTML, CSS and one script, packaged with the
daemon: no external request, no build step, no inline script or style. It holds no data
and no secret, so it is served without a token (auth.py lists it as open). Every piece
of data comes from the admin API, called by the page's script with `Authorization:
Bearer <token>`; the token is typed once into the sign-in form and kept in the tab's
`sessionStorage`, never in a URL or a cookie. With no ambient credential (no cookie, no
HTTP auth the browser would replay), another site cannot make the browser send an
authenticated request: there is no cross-site request forgery to defend against.

Both routes answer with a strict Content-Security-Policy (scripts, styles, images and
requests from this origin only; no frames, forms or base URL), and the assets are
served from an allow-list of names, never from a path taken from the URL.

`/v1/admin/stats` is this process's overview. It adds nothing to the decision path: a
background task (`StatsSampler`) reads the Prometheus counters the decisions already
update (metrics.py) every few seconds into a small ring, and the per-minute figures are
differences between those readings.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from prometheus_client import Counter
from pydantic import BaseModel, Field

from ratewarden.metrics import Metrics
from ratewarden.service.reload import PolicyReloader
from ratewarden.store import StoreError
from ratewarden.store.breaker import CircuitBreaker

log = logging.getLogger("ratewarden.console")

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# The only files `/console/assets/{name}` serves, with their media types.
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
SHELL = "index.html"

WINDOW_MINUTES = 15
SAMPLE_INTERVAL_S = 5.0
# Readings kept: the window, plus one before it so its first minute has a start.
RING_SIZE = int(WINDOW_MINUTES * 60 / SAMPLE_INTERVAL_S) + 2
TOP = 5  # rules and tools listed as the top refusers
REFUSALS = ("deny", "ask")

router = APIRouter()


@cache
def _asset(name: str) -> bytes:
    """A packaged file's bytes, read once (`name` is one of ours, never the URL's)."""
    return resources.files("ratewarden.service").joinpath("console_assets", name).read_bytes()


def _page(body: bytes, media_type: str, status_code: int = 200) -> Response:
    response = Response(body, status_code=status_code, media_type=media_type)
    response.headers.update(SECURITY_HEADERS)
    return response


@router.get(
    "/console",
    response_class=Response,
    responses={200: {"content": {"text/html": {}}, "description": "the page"}},
    tags=["console"],
)
async def console_shell() -> Response:
    """The console page: a shell with no data; sign in with an admin token (docs/console.md)."""
    response = _page(_asset(SHELL), "text/html; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get(
    "/console/assets/{name}",
    response_class=Response,
    responses={404: {"content": {"text/plain": {}}, "description": "not one of its files"}},
    tags=["console"],
)
async def console_asset(name: str = Path(max_length=64)) -> Response:
    """One of the console's packaged files (a fixed list of names)."""
    media_type = ASSETS.get(name)
    if media_type is None:
        return _page(b"not found", "text/plain; charset=utf-8", status_code=404)
    response = _page(_asset(name), media_type)
    response.headers["Cache-Control"] = "no-cache"  # revalidated: a new version shows at once
    return response


# -- the sampler ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    """The counters at one moment: totals since the process started."""

    at: float  # wall-clock seconds
    decisions: dict[str, float]  # by decision: allow, deny, ask
    rules: dict[str, float]  # refusals (deny and ask) by rule
    tools: dict[str, float]  # refusals by tool label (policy names, else "other")

    def refusals(self) -> float:
        return sum(self.decisions.get(d, 0.0) for d in REFUSALS)

    def total(self) -> float:
        return sum(self.decisions.values())


def _sum_by(counter: Counter, label: str) -> dict[str, float]:
    """A counter's `_total` samples summed by one of its labels (collect() is public API)."""
    sums: dict[str, float] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name == metric.name + "_total":
                key = sample.labels[label]
                sums[key] = sums.get(key, 0.0) + sample.value
    return sums


def _merge(*parts: dict[str, float]) -> dict[str, float]:
    merged: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            merged[key] = merged.get(key, 0.0) + value
    return merged


def read_counters(metrics: Metrics, at: float) -> Reading:
    return Reading(
        at=at,
        decisions=_sum_by(metrics.checks, "decision"),
        rules=_merge(_sum_by(metrics.blocked, "rule"), _sum_by(metrics.asked, "rule")),
        tools=_merge(_sum_by(metrics.blocked, "tool"), _sum_by(metrics.asked, "tool")),
    )


class StatsSampler:
    """Reads the decision counters every SAMPLE_INTERVAL_S seconds into a ring.

    A few microseconds every five seconds, on the event loop, away from any request; a
    decision does no more than it did before.
    """

    def __init__(
        self,
        metrics: Metrics,
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics
        self.breaker = breaker
        self.clock = clock
        self.started = clock()
        self.ring: deque[Reading] = deque(maxlen=RING_SIZE)
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> Reading:
        reading = read_counters(self.metrics, self.clock())
        self.ring.append(reading)
        return reading

    def start(self) -> None:
        self.sample()  # the baseline: the counters as the daemon starts
        self._task = asyncio.create_task(self._run(), name="ratewarden-console-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            try:
                self.sample()
            except Exception:  # the sampler must outlive any surprise
                log.exception("console sampler: unexpected error; still sampling")


def at_or_before(moment: float, readings: list[Reading]) -> Reading:
    """The last reading taken at or before `moment`, else the earliest one (the counters
    before the first reading were those of a process just started)."""
    index = bisect.bisect_right([r.at for r in readings], moment) - 1
    return readings[max(index, 0)]


# -- GET /v1/admin/stats ------------------------------------------------------------------


class MinuteStats(BaseModel):
    start: str = Field(description="the minute's start, ISO 8601 UTC")
    decisions: int
    refusals: int = Field(description="deny and ask decisions")


class Totals(BaseModel):
    decisions: int
    allowed: int
    denied: int
    asked: int
    refusals: int
    denial_ratio: float | None = Field(description="refusals / decisions; null with none")


class Ranked(BaseModel):
    name: str
    refusals: int


class StoreStatus(BaseModel):
    description: str = Field(description="the store's URL, password redacted")
    reachable: bool
    error: str | None = None
    circuit: str = Field(description="the store circuit breaker: closed, open or half_open")


class PolicyStatus(BaseModel):
    version: str
    source: str
    rules: int


class LastReload(BaseModel):
    at: str
    trigger: str
    ok: bool
    version: str = Field(description="the version in force after the attempt")
    previous_version: str
    errors: list[str] = Field(description="file:line: field: message, one per error")


class StatsResponse(BaseModel):
    generated_at: str
    pid: int = Field(description="the worker that answered: with --workers N, its figures")
    uptime_s: float
    window_minutes: int
    sample_interval_s: float
    minutes: list[MinuteStats] = Field(description="oldest first; the last one is running")
    totals: Totals = Field(description="over the window")
    top_rules: list[Ranked]
    top_tools: list[Ranked] = Field(description="tool labels named by the policy, else other")
    store: StoreStatus
    policy: PolicyStatus
    last_reload: LastReload | None = Field(description="null: none since start-up")


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds")


def minutes(sampler: StatsSampler, now: Reading) -> list[MinuteStats]:
    """Decisions and refusals in each of the last WINDOW_MINUTES wall-clock minutes."""
    readings = [*sampler.ring, now]
    current = int(now.at // 60) * 60
    found = []
    for back in range(WINDOW_MINUTES - 1, -1, -1):
        start = current - back * 60
        first = at_or_before(start, readings)
        last = now if back == 0 else at_or_before(start + 60, readings)
        found.append(
            MinuteStats(
                start=_iso(start),
                decisions=round(last.total() - first.total()),
                refusals=round(last.refusals() - first.refusals()),
            )
        )
    return found


def _top(now: dict[str, float], then: dict[str, float]) -> list[Ranked]:
    counts = {key: round(value - then.get(key, 0.0)) for key, value in now.items()}
    ranked = sorted((item for item in counts.items() if item[1] > 0), key=lambda i: (-i[1], i[0]))
    return [Ranked(name=name, refusals=n) for name, n in ranked[:TOP]]


def totals(now: Reading, then: Reading) -> Totals:
    def delta(decision: str) -> int:
        return round(now.decisions.get(decision, 0.0) - then.decisions.get(decision, 0.0))

    decisions = round(now.total() - then.total())
    refusals = round(now.refusals() - then.refusals())
    return Totals(
        decisions=decisions,
        allowed=delta("allow"),
        denied=delta("deny"),
        asked=delta("ask"),
        refusals=refusals,
        denial_ratio=round(refusals / decisions, 4) if decisions else None,
    )


async def store_status(request: Request, sampler: StatsSampler) -> StoreStatus:
    store = request.app.state.engine.store
    circuit = sampler.breaker.state if sampler.breaker is not None else "closed"
    try:
        await store.ping()  # bounded by the store timeout; refused at once if the circuit is open
    except StoreError as exc:
        return StoreStatus(
            description=store.description, reachable=False, error=str(exc), circuit=circuit
        )
    return StoreStatus(description=store.description, reachable=True, circuit=circuit)


def last_reload(reloader: PolicyReloader) -> LastReload | None:
    outcome = reloader.last
    if outcome is None:
        return None
    return LastReload(
        at=_iso(outcome.at),
        trigger=outcome.trigger,
        ok=outcome.ok,
        version=outcome.current.version,
        previous_version=outcome.previous.version,
        errors=outcome.error.lines() if outcome.error is not None else [],
    )


@router.get("/v1/admin/stats", response_model=StatsResponse, tags=["admin"])
async def stats(request: Request) -> StatsResponse:
    """This process's overview for the console: decisions and refusals per minute over the
    last 15 minutes, the denial ratio, the top refusing rules and tools, the store and its
    circuit breaker, the policy in force and the last reload. Takes no parameters."""
    sampler: StatsSampler = request.app.state.console_stats
    now = read_counters(sampler.metrics, sampler.clock())
    window_start = now.at - WINDOW_MINUTES * 60
    then = at_or_before(window_start, [*sampler.ring, now])
    policy = request.app.state.engine.policy
    return StatsResponse(
        generated_at=_iso(now.at),
        pid=os.getpid(),
        uptime_s=round(now.at - sampler.started, 1),
        window_minutes=WINDOW_MINUTES,
        sample_interval_s=SAMPLE_INTERVAL_S,
        minutes=minutes(sampler, now),
        totals=totals(now, then),
        top_rules=_top(now.rules, then.rules),
        top_tools=_top(now.tools, then.tools),
        store=await store_status(request, sampler),
        policy=PolicyStatus(version=policy.version, source=policy.source, rules=len(policy.rules)),
        last_reload=last_reload(request.app.state.reloader),
    )
