"""The FastAPI application, built by a factory: nothing happens at import."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Receive, Scope, Send

from ratewarden import __version__
from ratewarden.engine import Engine
from ratewarden.http.limits import BodySizeLimit
from ratewarden.policy import Policy, load_example_policy, load_policy
from ratewarden.service import activity, apidocs, auth, console, envoy, hooks, overrides, spend
from ratewarden.service.audit import AuditTrail
from ratewarden.service.errors import install_error_handlers
from ratewarden.service.fleet import Fleet, daemon_name
from ratewarden.service.hotpath import HOOK_ROUTE, HOT_ROUTES, REACHED, HotPath, is_hook
from ratewarden.service.logs import configure_audit, configure_logging
from ratewarden.service.metrics import REFUSED_BEFORE, HttpAnswers, Metrics, TimedStore
from ratewarden.service.notify import Notifier
from ratewarden.service.observer import Observer
from ratewarden.service.reload import PolicyReloader
from ratewarden.service.routes import router
from ratewarden.service.settings import Settings
from ratewarden.service.sweep import BudgetSweeper
from ratewarden.service.webhooks import Sender, Target
from ratewarden.store import Store, StoreError, store_from_url
from ratewarden.store.breaker import CircuitBreaker, GuardedStore
from ratewarden.vocabulary import NotifyEvent

log = logging.getLogger("ratewarden")


def create_app(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    policy: Policy | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """Build the daemon. Tests pass their own store, policy and metrics registry."""
    settings = settings or Settings()
    policy = policy or load_configured_policy(settings)
    raw_store = store or store_from_url(
        settings.store_url,
        timeout_ms=settings.store_timeout_ms,
        state_file=_state_file(settings),
        state_interval_s=settings.state_interval_s,
        spend_retention_days=settings.spend_retention_days,
    )
    metrics = Metrics(registry or CollectorRegistry())
    breaker, timed = _guarded(raw_store, settings, metrics)
    audit = AuditTrail(timed, include_args=settings.audit_args, clock=timed.clock)
    notifier = _notifier(timed, metrics, settings)
    # Budget periods are picked on the store's clock when it has one (the embedded store);
    # Redis stores use Redis TIME and the engine's clock only proposes the period.
    engine = Engine(  # periods on the store's clock
        policy, timed, fail=settings.fail, remember_refusals=settings.remember_refusals
    )
    # Reloads read the start-up source again: the same file, or the packaged example; and
    # the user tokens file, whose mistakes raise here at start (ValueError, naming them).
    tokens = auth.Tokens.from_settings(settings)
    reloader = PolicyReloader(engine, metrics, settings.policy_path(), settings.reload_interval_s)
    reloader.user_tokens = tokens.reload_users
    console_stats = console.StatsSampler(metrics, breaker)  # GET /v1/admin/stats
    poll_timeout_s = max(1.0, settings.store_timeout_ms / 1000)
    runtime = overrides.RuntimeOverrides(
        raw_store, reloader, metrics, clock=timed.clock, timeout_s=poll_timeout_s
    )
    fleet = _fleet(raw_store, engine, reloader, runtime, console_stats, settings, poll_timeout_s)
    # Who is blocked: counted per decision in process, flushed every 5 s on the bare
    # store (as the fleet's poll: never against the decisions' breaker).
    tally = activity.Tally()
    recorder = activity.ActivityRecorder(tally, raw_store, timed.clock, poll_timeout_s)

    # Housekeeping on the bare store, as the fleet's poll: out of the decisions' breaker.
    sweeper = BudgetSweeper(
        raw_store,
        engine,
        settings.sweep_interval_s,
        fleet.member,
        poll_timeout_s,
        charged=metrics.budget_swept.inc,
    )
    services = _Services(
        settings, policy, raw_store, timed, metrics, audit, reloader, fleet, console_stats,
        sweeper, notifier, recorder,
    )  # fmt: skip
    app = Daemon(
        title="ratewarden",
        version=__version__,
        summary="Rate limits, concurrency caps and cost budgets for AI-agent tool calls.",
        lifespan=services.lifespan,
        # FastAPI's pages load their scripts from a CDN: apidocs.py serves its own instead.
        docs_url=None,
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.settings = settings
    app.state.observer = Observer(metrics, audit, engine.refusals, tally, notifier)
    app.state.activity = recorder  # GET /v1/admin/blocked, /v1/admin/activity
    app.state.reloader = reloader
    app.state.overrides = runtime
    app.state.fleet = fleet
    app.state.console_stats = console_stats
    app.state.tokens = tokens  # GET /v1/whoami
    app.include_router(router)
    app.include_router(hooks.router)
    app.include_router(overrides.router)
    app.include_router(console.router)
    app.include_router(activity.router)
    app.include_router(spend.router)
    app.include_router(auth.router)
    app.include_router(apidocs.router)
    install_error_handlers(app)
    # Every request: auth outermost (a request without the role its route needs is
    # refused before anything reads its body), then the body cap (counted as it arrives,
    # chunked too; past it, a 413). The last added is the outermost.
    caps = {"max_bytes": settings.max_body_bytes, "hook_max_bytes": settings.max_hook_body_bytes}
    app.add_middleware(BodySizeLimit, **caps, hook_refusal=hooks.refuse_too_large)
    app.add_middleware(auth.AuthMiddleware, tokens=tokens, insecure=settings.insecure_no_auth)
    # Valid decisions skip FastAPI altogether, behind the same two. Every HTTP answer is
    # counted by route and status (metrics.py's HttpAnswers; the hot path its own).
    app.answers = HttpAnswers(metrics.http_responses, app.routes)
    hot = HotPath(app.stack, app.answers)
    capped = BodySizeLimit(hot, **caps, hook_refusal=hooks.refuse_too_large)
    app.front = auth.AuthMiddleware(capped, tokens=tokens, insecure=settings.insecure_no_auth)
    auth.document(app)
    return app


@dataclass(frozen=True)
class _Services:
    """What runs beside the requests: started before the first, stopped after the last."""

    settings: Settings
    policy: Policy
    store: Store  # the bare store, for its description
    timed: TimedStore
    metrics: Metrics
    audit: AuditTrail
    reloader: PolicyReloader
    fleet: Fleet
    stats: console.StatsSampler
    sweeper: BudgetSweeper
    notifier: Notifier
    activity: activity.ActivityRecorder | None = None

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        await self.start()
        answers = getattr(app, "answers", None)
        if answers is not None:
            answers.start()  # HTTP answers into the counter, every second
        try:
            async with envoy.listening(app, self.settings):  # gRPC, when its port is set
                yield
        finally:  # also when the server's context ends with an error: nothing left open
            if answers is not None:
                await answers.stop()
            await self.stop()

    async def start(self) -> None:
        try:
            await self.timed.start()
        except StoreError as exc:
            # Keep serving: decisions follow the fail mode (/readyz says so) until the
            # store answers; the script is loaded again on first use.
            log.warning("store not reachable at start-up (%s); will retry on use", exc)
        self.metrics.policy_loaded(self.policy)
        self.audit.start()
        if self.activity is not None:
            self.activity.start()  # who is blocked, flushed every 5 s
        self.notifier.configure(self.policy)  # says now if a webhook's variable is unset
        self.notifier.start()
        self.reloader.start()
        self.stats.start()  # reads the counters every few seconds, off the hot path
        await self.fleet.start()  # applies the store's overrides, reports; then every second
        self.sweeper.start()  # expired reservations charged, every SWEEP_INTERVAL_S
        settings, policy = self.settings, self.policy
        log.info(
            "ratewarden %s ready on http://%s:%s | %s | store %s | policy %s "
            "(version %s, %d rules)",
            __version__,
            settings.host,
            settings.port,
            auth.describe(settings),
            self.store.description,
            policy.source,
            policy.version,
            len(policy.rules),
        )
        # What exists now (modules, FastAPI, pydantic, the policy) lives as long as the
        # process. Left to the collector, every full collection walked all of it: a 25-80 ms
        # stall of every request in flight (docs/benchmarks.md). Frozen, it is skipped.
        gc.collect()
        gc.freeze()

    async def stop(self) -> None:
        gc.unfreeze()  # collectable again: in a test process, this app is now garbage
        await self.stats.stop()
        await self.sweeper.stop()
        await self.fleet.stop()
        await self.reloader.stop()
        await self.audit.stop()
        if self.activity is not None:
            await self.activity.stop()
        await self.notifier.stop()
        await self.timed.close()


def _state_file(settings: Settings) -> Path | None:
    """The memory store's state file, its directory created if it is the store in use."""
    path = settings.state_path()
    if path is not None and settings.store_url.startswith("memory:"):
        with contextlib.suppress(OSError):  # if it cannot be made, the store says so, naming it
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _fleet(
    store: Store,
    engine: Engine,
    reloader: PolicyReloader,
    runtime: overrides.RuntimeOverrides,
    sampler: console.StatsSampler,
    settings: Settings,
    timeout_s: float,
) -> Fleet:
    """This process in the fleet: its report is its console figures; its reloads and
    resets are announced to every other process on the store."""
    daemon = daemon_name(settings.port)
    report = console.Reporter(sampler, engine, reloader, daemon)
    fleet = Fleet(store, engine, reloader, runtime, report, daemon, timeout_s)
    reloader.announce = fleet.announce_reload
    return fleet


def _notifier(store: Store, metrics: Metrics, settings: Settings) -> Notifier:
    """The notifier, with the settings' webhook (of every event) beside the policy's."""
    extra = None
    if settings.webhook_url is not None:
        secret = settings.webhook_secret.encode() if settings.webhook_secret else None
        extra = Target(settings.webhook_url, secret, frozenset(map(str, NotifyEvent)))
    return Notifier(
        store,
        metrics,
        store.clock,
        queue_size=settings.notify_queue,
        sender=Sender(settings.webhook_attempts, settings.webhook_timeout_s),
        extra=extra,
    )


def _guarded(
    raw_store: Store, settings: Settings, metrics: Metrics
) -> tuple[CircuitBreaker, TimedStore]:
    """Every store operation answers within the store timeout, and a store that keeps
    failing is not called at all for a cool-down (decisions follow the fail mode)."""
    breaker = CircuitBreaker(
        settings.store_breaker_failures,
        settings.store_breaker_cooldown_ms / 1000,
        on_change=metrics.circuit_changed,
    )
    guarded = GuardedStore(raw_store, settings.store_timeout_ms, breaker)
    return breaker, TimedStore(guarded, metrics)  # outermost: fast refusals count as errors


class Daemon(FastAPI):
    """FastAPI, with the decision routes' hot path (service/hotpath.py) in front of it.

    `POST /v1/check` and `/v1/check/batch` are what every tool call waits on; FastAPI's
    own middleware (error pages, telemetry, its body limit) cost each of them about 6 %
    more. `front` serves them: auth, the body cap and the hot path, which hands whatever
    it does not answer itself to the whole stack (`stack`, auth and cap included).
    """

    front: ASGIApp | None = None  # None: every request through the whole stack
    answers: HttpAnswers | None = None  # counts every HTTP answer, by route and status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.answers is None:
            await super().__call__(scope, receive, send)
            return
        # The paths the hot path answers (the others it hands on), tested here inline;
        # their route template is known here, the others' once a route has served them.
        path = scope["path"]
        if path in HOT_ROUTES:
            route: str | None = path
        elif is_hook(path):
            route = HOOK_ROUTE
        else:
            route = None
        if route is not None and self.front is not None:
            scope["app"] = self
            await self.front(scope, receive, send)  # the hot path counts what it answers
            if REACHED not in scope:  # refused before it: by auth or the body cap
                self.answers.count(route, REFUSED_BEFORE)
        else:
            await super().__call__(scope, receive, self.answers.wrap(scope, send, route))

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


def load_configured_policy(settings: Settings) -> Policy:
    path = settings.policy_path()
    return load_policy(path) if path is not None else load_example_policy()


def create_app_from_env() -> FastAPI:
    """uvicorn's factory for `serve --workers N`: each worker reads the same environment.

    Workers are fresh processes, so they set up their own logging and audit trail.
    """
    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    configure_audit(settings.audit_log)
    return create_app(settings)
