"""The operator's console: a static page at `/console`, and `GET /v1/admin/stats` for it.

The page (console_assets/) is a shell of HTML, CSS and its scripts, packaged with the
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

`/v1/admin/stats` is the fleet's overview: every worker of every daemon on the store.
It adds nothing to the decision path: in each process a background task (`StatsSampler`)
reads the Prometheus counters the decisions already update (metrics.py) every few
seconds into a small ring, and the per-minute figures are differences between those
readings. Each process publishes its own figures (`ProcessReport`) into the store with
its once-a-second poll (service/fleet.py); the overview sums the live processes'
reports, this one's read fresh, and lists each process.
"""

from __future__ import annotations

import bisect
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

from ratewarden.engine import Engine
from ratewarden.service.fleet import Fleet
from ratewarden.service.metrics import Metrics
from ratewarden.service.periodic import Periodic
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
    # Who is blocked (service/activity.py): its views' script and style, apart.
    "fleet.js": "text/javascript; charset=utf-8",
    "fleet.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
    # uPlot 1.6.32 (MIT, uplot.LICENSE), as npm ships it: the charts, drawn in the page.
    "uplot.min.js": "text/javascript; charset=utf-8",
    "uplot.min.css": "text/css; charset=utf-8",
    "spend.js": "text/javascript; charset=utf-8",  # the Spend view (GET /v1/admin/spend)
}
SHELL = "index.html"

WINDOW_MINUTES = 15
SAMPLE_INTERVAL_S = 5.0
# Readings kept: the window, plus one before it so its first minute has a start.
RING_SIZE = int(WINDOW_MINUTES * 60 / SAMPLE_INTERVAL_S) + 2
TOP = 5  # rules and tools listed as the top refusers
REPORTED = 50  # rules and tools a process reports, its top refusers: a report stays small
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
        self._ticks = Periodic("ratewarden-console-sampler", SAMPLE_INTERVAL_S, self.sample)

    def sample(self) -> Reading:
        reading = read_counters(self.metrics, self.clock())
        self.ring.append(reading)
        return reading

    def start(self) -> None:
        self.sample()  # the baseline: the counters as the daemon starts
        self._ticks.start()

    async def stop(self) -> None:
        await self._ticks.stop()


def at_or_before(
    moment: float, readings: list[Reading], moments: list[float] | None = None
) -> Reading:
    """The last reading taken at or before `moment`, else the earliest one (the counters
    before the first reading were those of a process just started). `moments`: the
    readings' times, when the caller has them."""
    if moments is None:
        moments = [r.at for r in readings]
    index = bisect.bisect_right(moments, moment) - 1
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


class ProcessStatus(BaseModel):
    """One worker of one daemon on the store, as it last reported (within seconds)."""

    daemon: str = Field(description="host:port; a daemon's workers share it")
    pid: int
    uptime_s: float
    reported_at: str
    policy: PolicyStatus
    last_reload: LastReload | None = Field(description="null: none since it started")
    totals: Totals = Field(description="its decisions over the window")


class ProcessReport(ProcessStatus):
    """What a process publishes into the store: its status, and its figures to sum."""

    minutes: list[MinuteStats]
    rules: dict[str, int] = Field(description="refusals by rule over the window, its top")
    tools: dict[str, int] = Field(description="refusals by tool over the window, its top")


STATUS_FIELDS = set(ProcessStatus.model_fields)  # what the overview lists of each report


class StatsResponse(BaseModel):
    generated_at: str
    pid: int = Field(description="the worker that answered (its policy is `policy`)")
    uptime_s: float = Field(description="of the worker that answered")
    window_minutes: int
    sample_interval_s: float
    minutes: list[MinuteStats] = Field(description="oldest first; the last one is running")
    totals: Totals = Field(description="over the window")
    top_rules: list[Ranked]
    top_tools: list[Ranked] = Field(description="tool labels named by the policy, else other")
    store: StoreStatus
    policy: PolicyStatus
    last_reload: LastReload | None = Field(
        description="the newest of every process's; null: none since they started"
    )
    processes: list[ProcessStatus] = Field(
        description="every live worker of every daemon on the store, by daemon and pid; "
        "the figures above are their sum"
    )
    processes_error: str | None = Field(
        None, description="why only this worker is shown: the store did not answer"
    )


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds")


def minutes(sampler: StatsSampler, now: Reading) -> list[MinuteStats]:
    """Decisions and refusals in each of the last WINDOW_MINUTES wall-clock minutes. Each
    process computes them every poll for its report: each edge is looked up once."""
    readings = [*sampler.ring, now]
    moments = [r.at for r in readings]
    current = int(now.at // 60) * 60
    starts = [current - back * 60 for back in range(WINDOW_MINUTES - 1, -1, -1)]
    edges = [at_or_before(start, readings, moments) for start in starts] + [now]
    return [
        MinuteStats(
            start=_iso(start),
            decisions=round(last.total() - first.total()),
            refusals=round(last.refusals() - first.refusals()),
        )
        for start, first, last in zip(starts, edges, edges[1:], strict=False)
    ]


def _window_counts(now: dict[str, float], then: dict[str, float]) -> dict[str, int]:
    """Refusals by name over the window, the `REPORTED` most first."""
    counts = {key: round(value - then.get(key, 0.0)) for key, value in now.items()}
    return dict(_ranked(counts)[:REPORTED])


def _ranked(counts: dict[str, int]) -> list[tuple[str, int]]:
    return sorted((item for item in counts.items() if item[1] > 0), key=lambda i: (-i[1], i[0]))


def _top(counts: dict[str, int]) -> list[Ranked]:
    return [Ranked(name=name, refusals=n) for name, n in _ranked(counts)[:TOP]]


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


def process_report(
    sampler: StatsSampler, engine: Engine, reloader: PolicyReloader, daemon: str
) -> ProcessReport:
    """This process's figures over the window, fresh: what it publishes every poll."""
    now = read_counters(sampler.metrics, sampler.clock())
    then = at_or_before(now.at - WINDOW_MINUTES * 60, [*sampler.ring, now])
    policy = engine.policy
    return ProcessReport(
        daemon=daemon,
        pid=os.getpid(),
        uptime_s=round(now.at - sampler.started, 1),
        reported_at=_iso(now.at),
        policy=PolicyStatus(version=policy.version, source=policy.source, rules=len(policy.rules)),
        last_reload=last_reload(reloader),
        totals=totals(now, then),
        minutes=minutes(sampler, now),
        rules=_window_counts(now.rules, then.rules),
        tools=_window_counts(now.tools, then.tools),
    )


class Reporter:
    """This process's report, a JSON document, for its once-a-second poll. Built again
    only when the sampler has read the counters since (every SAMPLE_INTERVAL_S, as the
    per-minute figures always were) or the policy or the last reload changed (those show
    within a poll): a report costs a few hundred microseconds every five seconds, and a
    poll in between costs nothing here."""

    def __init__(
        self, sampler: StatsSampler, engine: Engine, reloader: PolicyReloader, daemon: str
    ) -> None:
        self.sampler, self.engine, self.reloader, self.daemon = sampler, engine, reloader, daemon
        self._built_from: tuple[object, ...] = ()
        self._document = ""

    def __call__(self) -> str:
        ring = self.sampler.ring
        sources = (ring[-1] if ring else None, self.engine.policy, self.reloader.last)
        if len(sources) != len(self._built_from) or any(
            a is not b for a, b in zip(sources, self._built_from, strict=True)
        ):
            report = process_report(self.sampler, self.engine, self.reloader, self.daemon)
            self._document, self._built_from = report.model_dump_json(), sources
        return self._document


async def fleet_reports(fleet: Fleet, own: ProcessReport) -> tuple[list[ProcessReport], str | None]:
    """The live processes' reports (this one's `own`, fresh), by daemon and pid; only
    `own` and why, when the store cannot say."""
    try:
        stored = await fleet.reports()
    except StoreError as exc:
        return [own], str(exc)
    found = {member: report for member, document in stored.items() if (report := _parsed(document))}
    found[fleet.member] = own
    return sorted(found.values(), key=lambda r: (r.daemon, r.pid)), None


def _parsed(document: str) -> ProcessReport | None:
    try:
        return ProcessReport.model_validate_json(document)
    except ValueError:  # written by another version of the daemon: left out, not fatal
        log.warning("a process report in the store is unreadable; left out")
        return None


def summed_totals(reports: list[ProcessReport]) -> Totals:
    def total(field: str) -> int:
        return sum(getattr(r.totals, field) for r in reports)

    decisions, refusals = total("decisions"), total("refusals")
    return Totals(
        decisions=decisions,
        allowed=total("allowed"),
        denied=total("denied"),
        asked=total("asked"),
        refusals=refusals,
        denial_ratio=round(refusals / decisions, 4) if decisions else None,
    )


def summed_minutes(own: list[MinuteStats], reports: list[ProcessReport]) -> list[MinuteStats]:
    """Each of this process's minutes, with every process's figures for the same minute."""
    by_start: dict[str, list[int]] = {m.start: [0, 0] for m in own}
    for report in reports:
        for minute in report.minutes:
            if (sums := by_start.get(minute.start)) is not None:
                sums[0] += minute.decisions
                sums[1] += minute.refusals
    return [MinuteStats(start=k, decisions=d, refusals=r) for k, (d, r) in by_start.items()]


def summed(reports: list[ProcessReport], field: str) -> dict[str, int]:
    sums: dict[str, int] = {}
    for report in reports:
        for name, count in getattr(report, field).items():
            sums[name] = sums.get(name, 0) + count
    return sums


def newest_reload(reports: list[ProcessReport]) -> LastReload | None:
    reloads = [r.last_reload for r in reports if r.last_reload is not None]
    return max(reloads, key=lambda r: r.at, default=None)


@router.get("/v1/admin/stats", response_model=StatsResponse, tags=["admin"])
async def stats(request: Request) -> StatsResponse:
    """The overview for the console, of every worker of every daemon on the store:
    decisions and refusals per minute over the last 15 minutes, the denial ratio, the top
    refusing rules and tools, the newest reload, and each process with its policy version
    and last reload; with the store and its circuit breaker, and the policy in force in
    the worker that answered. Takes no parameters."""
    state = request.app.state
    sampler: StatsSampler = state.console_stats
    fleet: Fleet = state.fleet
    own = process_report(sampler, state.engine, state.reloader, fleet.daemon)
    reports, error = await fleet_reports(fleet, own)
    return StatsResponse(
        generated_at=own.reported_at,
        pid=own.pid,
        uptime_s=own.uptime_s,
        window_minutes=WINDOW_MINUTES,
        sample_interval_s=SAMPLE_INTERVAL_S,
        minutes=summed_minutes(own.minutes, reports),
        totals=summed_totals(reports),
        top_rules=_top(summed(reports, "rules")),
        top_tools=_top(summed(reports, "tools")),
        store=await store_status(request, sampler),
        policy=own.policy,
        last_reload=newest_reload(reports),
        processes=[
            ProcessStatus.model_validate(r.model_dump(include=STATUS_FIELDS)) for r in reports
        ],
        processes_error=error,
    )
