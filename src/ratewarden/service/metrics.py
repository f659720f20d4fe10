"""Prometheus metrics: the names of SPEC §7, and the few more operators ask for.

Every metric is registered on the registry given to `Metrics`, so tests build a fresh
`CollectorRegistry` and read values with `get_sample_value`. Label values are bounded:
`tool` is a tool or label named in the policy, else `other` (see `Policy.metric_tool`);
for a model call, and `model`, the policy's pattern the model matches (a `models:` line,
a rule's `model:`), else `other` (`Policy.metric_model`), never the raw model name;
`rule` is a rule name; no user identity is ever a label. HTTP answers are counted by
route template (never the raw path) and status code from a fixed set (`HttpAnswers`).

The registry also holds prometheus-client's standard `process_*` and `python_*` metrics
(one process: with several workers they cannot be merged, and are left out).

With several worker processes, prometheus-client's multiprocess mode is used: `serve`
points PROMETHEUS_MULTIPROC_DIR at a fresh directory before the workers start, each
worker writes its values there, and `/metrics` merges them (see `exposition`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.routing import compile_path
from starlette.types import Message, Scope, Send

from ratewarden.calls import Call
from ratewarden.engine import Decision, Settlement, Verdict
from ratewarden.policy import Policy
from ratewarden.policy.durations import MICROS
from ratewarden.service.periodic import Periodic
from ratewarden.store import Store, StoreError
from ratewarden.store.base import Args, Layer
from ratewarden.store.breaker import STATES as CIRCUIT_STATES
from ratewarden.vocabulary import CallKind

# Sub-millisecond to a second: a check normally takes well under 5 ms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
T = TypeVar("T")
RESET_TARGETS = ("user", "rule", "user_rule")  # the `target` label of ratewarden_resets_total
NEAR_LIMIT = 0.8  # an allowed call that leaves a rule at least this full is "near the limit"
# (near_limit() compares 5 * used >= 4 * limit: keep the two in step)


@dataclass(frozen=True, slots=True)
class Spec:
    """One metric: its type, name, help text and labels (and buckets for a histogram)."""

    type: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    doc: str
    labels: tuple[str, ...] = ()

    def build(self, registry: CollectorRegistry) -> MetricWrapperBase:
        extra: dict[str, Any] = {}
        if self.type is Histogram:
            extra["buckets"] = LATENCY_BUCKETS
        elif self.type is Gauge:
            extra["multiprocess_mode"] = "max"  # workers agree on one value
        return self.type(self.name, self.doc, self.labels, registry=registry, **extra)


# Every metric the daemon exports, by the attribute of `Metrics` that holds it.
METRICS = {
    "checks": Spec(Counter, "ratewarden_checks_total",
        "Decisions made, by decision and mode (shadow: a shadow rule would have blocked).",
        ("decision", "mode")),
    "blocked": Spec(Counter, "ratewarden_blocked_calls_total",
        "Calls denied, per refusing rule.", ("tool", "rule", "reason")),
    "asked": Spec(Counter, "ratewarden_ask_decisions_total",
        "Calls sent for human approval, per rule that asked.", ("tool", "rule", "reason")),
    "approved": Spec(Counter, "ratewarden_approved_calls_total",
        "Approved calls let past an `ask` rule's limit.", ("tool", "rule")),
    "shadow": Spec(Counter, "ratewarden_shadow_blocks_total",
        "Calls a shadow-mode rule would have blocked (they were allowed).",
        ("tool", "rule", "reason")),
    "near_limit": Spec(Counter, "ratewarden_near_limit_total",
        f"Allowed calls that left a rule at least {NEAR_LIMIT:.0%} used.", ("tool", "rule")),
    "soft_limit": Spec(Counter, "ratewarden_budget_soft_limit_total",
        "Allowed calls flagged by a budget's soft limit.", ("rule",)),
    "degraded": Spec(Counter, "ratewarden_degraded_decisions_total",
        "Decisions made without the store: fail closed, or a fail-open rule's local count.",
        ("decision",)),
    "duration": Spec(Histogram, "ratewarden_check_duration_seconds",
        "Time to decide one call, store round trip included."),
    "store_errors": Spec(Counter, "ratewarden_store_errors_total",
        "Store operations that failed or timed out.", ("operation",)),
    "store_duration": Spec(Histogram, "ratewarden_store_duration_seconds",
        "Time of one store operation (one round trip for evaluate).", ("operation",)),
    "budget_reserved": Spec(Counter, "ratewarden_budget_reserved_total",
        "Money reserved by allowed calls at check time.", ("rule", "currency")),
    "budget_spent": Spec(Counter, "ratewarden_budget_spent_total",
        "Money charged when calls settle.", ("rule", "currency")),
    "reservations": Spec(Counter, "ratewarden_budget_reservations_total",
        "Budget reservations made by allowed calls (one per call and budget rule, when the "
        "call has a cost).", ("rule",)),
    "settled_reservations": Spec(Counter, "ratewarden_budget_settled_reservations_total",
        "Budget reservations released by a settle (what is never settled expires and is "
        "charged at its estimate).", ("rule",)),
    "budget_swept": Spec(Counter, "ratewarden_budget_swept_total",
        "Budget counters the budget sweep charged: reservations that expired unsettled in "
        "scopes no call came back to, at their estimate (the money is in the spend history)."),
    "model_tokens": Spec(Counter, "ratewarden_model_tokens_total",
        "Tokens of settled model calls, by the policy's model pattern and direction (input: "
        "every input token, cached ones included; cache_read and cache_write: the part of "
        "them read from or written to the provider's cache).", ("model", "direction")),
    "model_spend": Spec(Counter, "ratewarden_model_spend_total",
        "What settled model calls were charged, by the policy's model pattern: once per "
        "call, however many budgets charged it.", ("model", "currency")),
    "settles": Spec(Counter, "ratewarden_settles_total",
        "Settle requests, by outcome (settled, already_settled, unknown).", ("outcome",)),
    "reloads": Spec(Counter, "ratewarden_policy_reloads_total",
        "Policy loads and reloads, by result (ok, error).", ("result",)),
    "override_changes": Spec(Counter, "ratewarden_override_changes_total",
        "Runtime overrides set or removed through the admin API, by action (set, remove).",
        ("action",)),
    "resets": Spec(Counter, "ratewarden_resets_total",
        "Counter resets through the admin API (console, CLI), by what they named (user: "
        "every rule of one user; rule: one rule for everyone; user_rule: one user's rule).",
        ("target",)),
    "reload_failed": Spec(Gauge, "ratewarden_policy_reload_failed",
        "1 while the last policy reload was refused (the file is invalid) and the policy "
        "loaded before it still serves, else 0."),
    "policy_info": Spec(Gauge, "ratewarden_policy_info",
        "The policy in force: 1 for its version.", ("version",)),
    "circuit_open": Spec(Gauge, "ratewarden_store_circuit_open",
        "1 while the store's circuit breaker is open or half-open (decisions follow "
        "the fail mode without waiting for the store), else 0."),
    "circuit_transitions": Spec(Counter, "ratewarden_store_circuit_transitions_total",
        "Store circuit breaker state changes, by the state entered (open, half_open, closed).",
        ("state",)),
    "remembered": Spec(Counter, "ratewarden_remembered_refusals_total",
        "Checks refused from a remembered rate refusal, without asking the store (the "
        "refusing rules are counted in ratewarden_blocked_calls_total)."),
    "http_responses": Spec(Counter, "ratewarden_http_responses_total",
        "HTTP answers, by route template (`other`: no route) and status code (a code "
        "outside HTTP_CODES as its class, e.g. `5xx`).", ("route", "code")),
    "grpc_answers": Spec(Counter, "ratewarden_grpc_answers_total",
        "Answers of Envoy's services on the gRPC listener (docs/envoy.md), by method "
        "(ShouldRateLimit, Check) and gRPC status: OK for every decision (its refusal is "
        "counted with the decisions), else why no call was decided (INVALID_ARGUMENT, "
        "UNAUTHENTICATED, PERMISSION_DENIED, ALREADY_EXISTS, INTERNAL).", ("method", "code")),
    "notifications": Spec(Counter, "ratewarden_notifications_total",
        "Notifications (webhooks), by event and outcome: sent (a webhook answered 2xx), "
        "failed (every attempt failed, a 4xx, or the store unreachable), dropped (a queue "
        "was full), duplicate (another daemon, or an earlier tick, sent it).",
        ("event", "outcome")),
}  # fmt: skip
# The status codes counted as themselves; any other is counted as its class (`4xx`).
HTTP_CODES = frozenset({
    200, 201, 202, 204, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 405, 406, 409,
    410, 411, 413, 414, 415, 422, 429, 431, 500, 501, 502, 503, 504,
})  # fmt: skip
NO_ROUTE = "other"  # the `route` of a request no route of the daemon matches
REFUSED_BEFORE = 499  # a decision route's request refused by auth or the body cap: `4xx`


class _Seen:
    """What `Metrics` remembers between events: the policy version shown, the remembered
    refusals counted. One attribute of `Metrics` for both (see MAX_ATTRIBUTES)."""

    __slots__ = ("remembered", "version")

    def __init__(self) -> None:
        self.version, self.remembered = "", 0


# Slotted: CPython 3.11 reads an instance dict's attributes by index (specialised) only
# while they number fewer than 30, and from the 30th on every `self.<metric>` of every
# decision became a hashed dict lookup (callgrind: 5 attribute reads cost 9 % more at 30
# attributes than at 29). A slot is read by index whatever their number, so a new metric
# costs a decision nothing (tests/service/test_metrics.py holds Metrics to slots). An
# instance with a dict, as Policy, is held to MAX_ATTRIBUTES (tests/unit).
MAX_ATTRIBUTES = 29


class Metrics:
    """The daemon's metrics (the table above), and how each event updates them."""

    __slots__ = (*METRICS, "registry", "series", "_seen")

    checks: Counter
    blocked: Counter
    asked: Counter
    approved: Counter
    shadow: Counter
    near_limit: Counter
    soft_limit: Counter
    degraded: Counter
    duration: Histogram
    store_errors: Counter
    store_duration: Histogram
    budget_reserved: Counter
    budget_spent: Counter
    settles: Counter
    model_tokens: Counter
    model_spend: Counter
    reloads: Counter
    reload_failed: Gauge
    reservations: Counter
    settled_reservations: Counter
    budget_swept: Counter
    http_responses: Counter
    override_changes: Counter
    resets: Counter
    policy_info: Gauge
    circuit_open: Gauge
    circuit_transitions: Counter
    remembered: Counter
    grpc_answers: Counter
    notifications: Counter

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # A labelled series by its metric and label values, remembered: prometheus-client's
        # labels() validates and locks on every call, and a decision makes one per rule.
        # Label values are bounded (see above), so this is too; series never removed.
        self.series = lru_cache(maxsize=4096)(_series)
        for attribute, spec in METRICS.items():
            setattr(self, attribute, spec.build(registry))
        self.circuit_open.set(0)
        self.reload_failed.set(0)
        # The standard process and Python metrics, as prometheus-client's default registry
        # has them (this registry is the daemon's own).
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        for state in CIRCUIT_STATES:  # every series exists from the start
            self.circuit_transitions.labels(state)
        for action in ("set", "remove"):
            self.override_changes.labels(action)
        for target in RESET_TARGETS:
            self.resets.labels(target)
        self._seen = _Seen()

    def circuit_changed(self, old: str, new: str) -> None:
        """The store's circuit breaker moved from `old` to `new` (see store/breaker.py)."""
        self.circuit_transitions.labels(new).inc()
        self.circuit_open.set(0 if new == "closed" else 1)

    def policy_loaded(self, policy: Policy) -> None:
        """A policy was loaded (at start-up) or reloaded: count it, and make its version the
        one `ratewarden_policy_info` shows at 1."""
        self.reloads.labels("ok").inc()
        self.reload_failed.set(0)
        seen = self._seen
        if seen.version and seen.version != policy.version:
            # Worker processes share their values through files, where a series cannot be
            # removed: the old version drops to 0 there (dashboards count `== 1`).
            self.policy_info.labels(seen.version).set(0)
            if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                self.policy_info.remove(seen.version)
        seen.version = policy.version
        self.policy_info.labels(policy.version).set(1)

    def policy_load_failed(self) -> None:
        """A reload was refused (the file is invalid); the policy in force stays."""
        self.reloads.labels("error").inc()
        self.reload_failed.set(1)

    def remembered_refusals(self, hits: int) -> None:
        """The engine has answered `hits` checks from remembered refusals in all (its
        `refusals.hits`, read after each decision): count the ones not counted yet."""
        seen = self._seen
        if hits > seen.remembered:
            self.remembered.inc(hits - seen.remembered)
            seen.remembered = hits

    def observe_check(self, decision: Decision, call: Call, policy: Policy, seconds: float) -> None:
        """Count one decision: its outcome, each refusing rule, and the rules near their limit.

        The `tool` label (`call_label`) is found only when a series needs it: most
        decisions (allowed, nothing near its limit) need none."""
        self.duration.observe(seconds)
        mode = "shadow" if decision.shadow else "enforce"
        self.series(self.checks, decision.decision, mode).inc()
        if decision.degraded:
            self.series(self.degraded, decision.decision).inc()
        tool = self._observe_refused(decision, call, policy) if decision.violations else ""
        if not decision.allowed or decision.replayed:  # a replay consumed nothing, again
            return
        if decision.shadow or decision.approvals:
            tool = tool or call_label(call, policy)
            self._observe_let_through(decision, tool)
        for verdict in decision.limits:
            if verdict.admitted:
                self._observe_consumed(verdict, call, policy)
                if near_limit(verdict):
                    tool = tool or call_label(call, policy)
                    self.series(self.near_limit, tool, verdict.rule).inc()
        for verdict in decision.approvals:  # past the limit: consumed, but not "near" it
            self._observe_consumed(verdict, call, policy)

    def _observe_refused(self, decision: Decision, call: Call, policy: Policy) -> str:
        """Each rule that refused the call (or asked); the call's label, found for them."""
        tool = call_label(call, policy)
        refused = self.blocked if decision.decision == "deny" else self.asked
        for verdict in decision.violations:
            self.series(refused, tool, verdict.rule, verdict.kind).inc()
        return tool

    def _observe_let_through(self, decision: Decision, tool: str) -> None:
        """The rules that let an allowed call through: shadow blocks and approvals."""
        for verdict in decision.shadow:
            self.series(self.shadow, tool, verdict.rule, verdict.kind).inc()
        for verdict in decision.approvals:
            self.series(self.approved, tool, verdict.rule).inc()

    def _observe_consumed(self, verdict: Verdict, call: Call, policy: Policy) -> None:
        if verdict.kind == "budget" and verdict.currency:
            cost = reserved_cost(call, policy)
            self.series(self.budget_reserved, verdict.rule, verdict.currency).inc(cost)
            if cost > 0:  # only a call with a cost holds a reservation (budget.py)
                self.series(self.reservations, verdict.rule).inc()
        if verdict.soft_limited:
            self.series(self.soft_limit, verdict.rule).inc()

    def observe_settle(self, settlement: Settlement, policy: Policy) -> None:
        self.settles.labels(settlement.outcome).inc()
        spent = None  # (amount, currency): a model call's charge, counted once
        for rule, amount in settlement.charged.items():
            currency = policy.currency_of(rule) or "USD"
            self.budget_spent.labels(rule, currency).inc(amount)
            self.settled_reservations.labels(rule).inc()
            if spent is None or amount > spent[0]:
                spent = (amount, currency)
        if settlement.model is None or settlement.outcome != "settled":
            return
        # Every budget charges a model call the same amount, its price (a budget in
        # another currency than the prices' does not count model calls; a rule gone
        # charges 0): its largest charge is what the call cost, counted once.
        model = policy.metric_model(settlement.model)
        if spent is not None and spent[0] > 0:
            self.series(self.model_spend, model, spent[1]).inc(spent[0])
        usage = settlement.usage
        if usage is not None:
            for direction, tokens in (
                ("input", usage.input_tokens),
                ("output", usage.output_tokens),
                ("cache_read", usage.cache_read_tokens),
                ("cache_write", usage.cache_write_tokens),
            ):
                if tokens:
                    self.series(self.model_tokens, model, direction).inc(tokens)


class HttpAnswers:
    """Counts every HTTP answer by route template and status (`ratewarden_http_responses_total`).

    `wrap` wraps a request's `send` in the daemon's outermost ASGI layer (app.py's
    `Daemon`), so refusals by auth and the body cap are counted too. Labels are bounded
    whatever the requests: the route is the template of the route that served the request
    (FastAPI's `scope["route"]`, or the pattern its path matches, else NO_ROUTE), never
    the raw path; the code is one of HTTP_CODES, else its class.

    A decision must not pay for it (docs/benchmarks.md). An answer adds one to `counts`,
    a plain dict; prometheus-client's `inc` (a lock and checks) runs in `flush`: before
    every exposition, and every FLUSH_INTERVAL_S for what other worker processes must
    see. Even a wrapper around `send` (a function made per request, called twice) cost a
    one-rule decision 3 % more instructions, so the decision routes are not wrapped:
    hotpath.py counts the decisions it answers itself in `counts` and wraps `send` only
    for what it hands on or refuses, and `Daemon` counts a request refused before the
    hot path (by auth or the body cap, 401, 403 or 413) as REFUSED_BEFORE (`4xx`).
    """

    FLUSH_INTERVAL_S = 1.0

    def __init__(self, counter: Counter, routes: Iterable[Any]) -> None:
        self._counter = counter
        self._patterns = list(route_patterns(routes))
        self._templates = frozenset(template for _, template in self._patterns)
        self.counts: dict[tuple[str, int], int] = {}  # answers not yet in the counter
        self._incs: dict[tuple[str, int], Callable[[float], None]] = {}
        self._ticks = Periodic("ratewarden-http-answers", self.FLUSH_INTERVAL_S, self.flush)

    def wrap(self, scope: Scope, send: Send, route: str | None = None) -> Send:
        """`send`, counting the answer it starts: under `route`, or the request's own."""
        counts = self.counts

        def counted(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                key = (route or self.route_of(scope), message["status"])
                counts[key] = counts.get(key, 0) + 1
            return send(message)

        return counted

    def count(self, route: str, status: int) -> None:
        """One answer (`route` must be a template, or it is counted as NO_ROUTE)."""
        key = (route if route in self._templates else NO_ROUTE, status)
        self.counts[key] = self.counts.get(key, 0) + 1

    def flush(self) -> None:
        """Move the answers counted so far into the Prometheus counter (event loop only)."""
        counts = list(self.counts.items())  # the same dict stays: `wrap`s hold it
        self.counts.clear()
        for key, number in counts:
            inc = self._incs.get(key)
            if inc is None:
                route, status = key
                route = route if route in self._templates else NO_ROUTE
                inc = self._counter.labels(route, status_code(status)).inc
                self._incs[key] = inc  # keys: templates x statuses, bounded
            inc(number)

    def route_of(self, scope: Scope) -> str:
        """The template of the route that served `scope`, else the one its path matches
        (a request refused before routing), else NO_ROUTE."""
        served = scope.get("route")
        template = getattr(served, "path_format", None)
        if isinstance(template, str) and template in self._templates:
            return template
        path = scope.get("path", "")
        for regex, template in self._patterns:
            if regex.match(path):
                return str(template)
        return NO_ROUTE

    def start(self) -> None:
        self._ticks.start()

    async def stop(self) -> None:
        await self._ticks.stop()
        self.flush()


def route_patterns(routes: Iterable[Any], prefix: str = "") -> Iterable[tuple[Any, str]]:
    """(regex, template) of every route, those of included routers too (FastAPI keeps
    an included router as one entry holding the router and its prefix)."""
    for route in routes:
        path = getattr(route, "path", None)
        if isinstance(path, str) and hasattr(route, "path_format"):
            regex, template, _ = compile_path(prefix + path)
            yield regex, template
            continue
        included = getattr(route, "original_router", None)
        context = getattr(route, "include_context", None)
        nested = getattr(included, "routes", None) or getattr(route, "routes", None)
        if nested:
            yield from route_patterns(nested, prefix + str(getattr(context, "prefix", "")))


def status_code(status: int) -> str:
    """The `code` label of an HTTP status: itself if in HTTP_CODES, else its class."""
    return str(status) if status in HTTP_CODES else f"{min(max(status // 100, 1), 5)}xx"


def reserved_cost(call: Call, policy: Policy) -> float:
    """What an allowed call reserved in each budget: its cost, its tool's in the policy, or
    a model call's most cost (its input and most output tokens priced: docs/budgets.md).
    Found only for a budget's verdict: a decision without one needs none."""
    if call.cost is not None:
        return call.cost
    if call.kind == CallKind.MODEL:
        most = policy.most_cost(call)
        return 0.0 if most is None else most / MICROS
    return policy.cost_for(call.tool)


def call_label(call: Call, policy: Policy) -> str:
    """A call's bounded `tool` label: a model call's policy pattern (`metric_model`), a
    tool call's tool or label named in the policy (`metric_tool`); else `other`."""
    if call.kind == CallKind.MODEL:
        return policy.metric_model(call.tool)
    return policy.metric_tool(call.tool)


def _series(metric: MetricWrapperBase, *values: str) -> Any:
    return metric.labels(*values)


def near_limit(verdict: Verdict) -> bool:
    """At least NEAR_LIMIT of the rule used after this call; money compared in whole
    millionths, since 3.0 - 0.6 < 0.8 * 3.0 in floating point."""
    limit, remaining = verdict.limit, verdict.remaining
    if type(limit) is int and type(remaining) is int:  # calls and slots: exact already
        return limit > 0 and (limit - remaining) * 5 >= limit * 4
    limit = round(float(verdict.limit) * 1_000_000)
    used = limit - round(float(verdict.remaining) * 1_000_000)
    return limit > 0 and used * 5 >= limit * 4  # used >= 80 % of limit, exactly


class TimedStore(Layer):
    """A store that times every operation and counts its failures; behaves like `store`."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        super().__init__(store)
        self._metrics = metrics

    async def around(
        self, operation: str, function: Callable[[*Args], Awaitable[T]], *args: *Args
    ) -> T:
        started = time.perf_counter()
        try:
            return await function(*args)
        except StoreError:
            self._metrics.store_errors.labels(operation).inc()
            raise
        finally:
            metrics = self._metrics
            metrics.series(metrics.store_duration, operation).observe(time.perf_counter() - started)


def exposition(
    registry: CollectorRegistry, answers: HttpAnswers | None = None
) -> tuple[bytes, str]:
    """The text format: this process's registry, or every worker's in multiprocess mode
    (`answers`: HTTP answers counted since their last flush, flushed first)."""
    if answers is not None:
        answers.flush()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        merged = CollectorRegistry()
        MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        return generate_latest(merged), CONTENT_TYPE_LATEST
    return generate_latest(registry), CONTENT_TYPE_LATEST
