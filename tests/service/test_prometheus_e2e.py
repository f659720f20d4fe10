"""The dashboard and the alerts against a real Prometheus scraping a real daemon.

A redis-server, `ratewarden serve` and `prometheus` run as subprocesses on free ports
(scrape and rule evaluation every second, the rules being deploy/prometheus/alerts.yml).
Traffic covers every metric: allowed, rate-denied, shadow, asked and approved calls,
budget reservations and settles, concurrency denials, and, with Redis stopped, store
errors with fail-open and fail-closed decisions. Then, through Prometheus's HTTP API:

- every panel query of dashboards/ratewarden.json parses and returns data;
- every variable query finds the job and the instance;
- every alert expression parses and evaluates, every alert is loaded with health ok, and
  the two the store outage should trip (failing open, store errors) are pending;
- every metric any of them names exists in Prometheus (a guard unit-tested below).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.deploy.test_observability_files import (
    ALERTS,
    EXPECTED_ALERTS,
    POLICY,
    all_exprs,
    assert_metrics_exist,
    client,
    drive_degraded_traffic,
    drive_traffic,
    ensure_prometheus,
    label_values,
    load_alert_rules,
    load_dashboard,
    metric_names,
    panel_exprs,
    substitute,
    variable_queries,
)
from tests.helpers.redis_server import free_port, running_redis
from tests.service.test_cli import serving

T = TypeVar("T")
DEADLINE_S = 30.0  # for any one wait; the whole test takes about 10 s
# Grafana's built-in ranges, as a dashboard over the last 5 minutes would send them.
GRAFANA_RANGES = {"__rate_interval": "1m", "__range": "5m", "__interval": "1s"}


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = DEADLINE_S) -> T:
    """Poll `probe` until it returns something other than None; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)  # bounded polling: Prometheus scrapes and evaluates every second


class PrometheusAPI:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, trust_env=False, timeout=10.0)

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """The JSON answer of an API call, whatever its status (errors carry one too)."""
        body: dict[str, Any] = self.http.get(path, params=params).json()
        return body

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr)

    def value(self, expr: str) -> float | None:
        """The value of a one-series query, or None while it has no series."""
        answer = self.query(expr)
        assert answer["status"] == "success", answer
        result = answer["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def alert_rules(self) -> dict[str, dict[str, Any]]:
        groups = self.get("/api/v1/rules", type="alert")["data"]["groups"]
        return {rule["name"]: rule for group in groups for rule in group["rules"]}


@contextlib.contextmanager
def running_prometheus(directory: Path, target: str) -> Iterator[PrometheusAPI]:
    """A Prometheus on a free port scraping `target` as job "ratewarden", with alerts.yml."""
    binary = ensure_prometheus()[0]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "ratewarden", "static_configs": [{"targets": [target]}]}],
    }
    directory.mkdir()
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = directory / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    api = PrometheusAPI(f"http://127.0.0.1:{port}")
    try:

        def ready() -> bool | None:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited with {process.returncode}:\n{log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                return api.http.get("/-/ready").status_code == 200 or None
            return None

        wait_for("prometheus to be ready", ready)
        yield api
    finally:
        api.http.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def scraped(api: PrometheusAPI, expr: str, expected: float) -> Callable[[], bool | None]:
    """A probe: true once Prometheus's value of `expr` is `expected`."""

    def probe() -> bool | None:
        value = api.value(expr)
        return True if value is not None and abs(value - expected) < 1e-9 else None

    return probe


# -- the guard: a dashboard or alert naming a metric that does not exist fails -------------


def test_metric_names_are_extracted_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, job) (rate(a_bucket{le="0.1", job=~"x|y"}[5m])))'
        " > 0.05 and on (job) (b_total offset 1m) / ignoring(x) sum(rate(c:recorded[1m:10s]))"
        ' or {__name__="d_total"} unless topk(5, e) * 1e3'
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c:recorded", "d_total", "e"}
    # A variable query: its selector names the metric, its last argument is a label.
    selector, label = label_values('label_values(ratewarden_policy_info{job=~"$job"}, instance)')
    assert (metric_names(selector), label) == ({"ratewarden_policy_info"}, "instance")


def test_the_metric_name_guard_fails_on_a_bogus_metric() -> None:
    known = {"ratewarden_checks_total", "up"}
    assert_metrics_exist([("fine", "sum(rate(ratewarden_checks_total[5m]))")], known)
    bogus = ("typo", 'sum by (tool) (rate(ratewarden_blocked_call_total{tool="x"}[5m]))')
    with pytest.raises(AssertionError, match="ratewarden_blocked_call_total"):
        assert_metrics_exist([("fine", "up == 0"), bogus], known)


# -- the real thing -------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.timeout(90)
@pytest.mark.slow
def test_every_panel_and_alert_works_against_a_real_prometheus(tmp_path: Path) -> None:
    started = time.monotonic()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with (
        running_redis(tmp_path / "redis") as redis,
        serving(tmp_path, "--policy", str(policy), "--store-url", redis.url) as daemon,
        running_prometheus(tmp_path / "prometheus", f"127.0.0.1:{daemon.port}") as api,
        client(daemon.url) as http,
    ):
        target = f"127.0.0.1:{daemon.port}"
        wait_for("the first scrape", scraped(api, f'up{{instance="{target}"}}', 1))

        checks = drive_traffic(http)
        wait_for("the traffic", scraped(api, "sum(ratewarden_checks_total)", checks))
        # The browser budget's 0.55 and the model call's 0.00035 (drive_traffic).
        wait_for("the spend", scraped(api, "sum(ratewarden_budget_spent_total)", 0.55035))

        # Redis goes away: store errors, fail-open allows, fail-closed denials. Twice, a
        # scrape apart, so that rates over them are not zero and the alerts trip.
        redis.stop()
        degraded = 0
        for _ in range(2):
            degraded += drive_degraded_traffic(http, rounds=2)
            expr = "sum(ratewarden_degraded_decisions_total)"
            wait_for(f"{degraded} degraded decisions", scraped(api, expr, degraded))
        wait_for("the last checks", scraped(api, "sum(ratewarden_checks_total)", checks + degraded))

        values = {"job": "ratewarden", "instance": target, **GRAFANA_RANGES}
        check_panels(api, values)
        check_variables(api, values)
        check_alerts(api)
        names = set(api.get("/api/v1/label/__name__/values")["data"])
        assert_metrics_exist(all_exprs(), names)

        # The outage trips the alerts about it (pending: their `for` is longer than this test).
        def tripped() -> bool | None:
            rules = api.alert_rules()
            states = {name: rules[name]["state"] for name in EXPECTED_ALERTS}
            wanted = (
                "RatewardenFailingOpen",
                "RatewardenStoreErrors",
                "RatewardenAnsweringByFailMode",
            )
            return all(states[name] in ("pending", "firing") for name in wanted) or None

        wait_for("the failing-open, store-error and fail-mode alerts to be pending", tripped)
        rules = api.alert_rules()
        assert rules["RatewardenDown"]["state"] == "inactive"
        assert rules["RatewardenPolicyReloadFailed"]["state"] == "inactive"
        # The series the new alerts read, as scraped: 4 budget reservations (3 browser
        # calls and the model call), 3 settled (the third browser call is charged at its
        # estimate when it expires); no reload refused; HTTP answers by route template,
        # the unknown call's settle among them.
        assert api.value("sum(ratewarden_budget_reservations_total)") == 4
        assert api.value("sum(ratewarden_budget_settled_reservations_total)") == 3
        assert api.value("max(ratewarden_policy_reload_failed)") == 0
        route = "/v1/calls/{call_id}/settle"
        assert api.value(f'ratewarden_http_responses_total{{route="{route}", code="404"}}') == 1
        assert (api.value('sum(ratewarden_http_responses_total{route="/v1/check"})') or 0) >= checks
        assert (api.value("process_resident_memory_bytes") or 0) > 0
    assert time.monotonic() - started < 60


def check_panels(api: PrometheusAPI, values: dict[str, str]) -> None:
    """Every panel query parses and, once scraped twice, returns at least one series."""
    targets = panel_exprs(load_dashboard())
    assert len(targets) >= 20
    for where, raw in targets:
        expr = substitute(raw, values)

        def answered(expr: str = expr, where: str = where) -> bool | None:
            answer = api.query(expr)
            assert answer["status"] == "success", (where, expr, answer)
            return bool(answer["data"]["result"]) or None

        wait_for(f"data for panel {where}: {expr}", answered, timeout=10)


def check_variables(api: PrometheusAPI, values: dict[str, str]) -> None:
    """The job and instance variables list this daemon."""
    for name, query in variable_queries(load_dashboard()):
        selector, label = label_values(query)
        answer = api.get(
            f"/api/v1/label/{label}/values", **{"match[]": substitute(selector, values)}
        )
        assert answer["status"] == "success", (name, answer)
        assert values[name] in answer["data"], (name, answer)


def check_alerts(api: PrometheusAPI) -> None:
    """Every alert expression evaluates; every alert is loaded, with health ok."""
    for rule in load_alert_rules():
        answer = api.query(rule["expr"])
        assert answer["status"] == "success", (rule["alert"], answer)

    def evaluated() -> dict[str, dict[str, Any]] | None:
        rules = api.alert_rules()
        health = {
            name: rules[name]["health"] if name in rules else None for name in EXPECTED_ALERTS
        }
        return rules if set(health.values()) == {"ok"} else None

    rules = wait_for("every alert evaluated with health ok", evaluated)
    assert rules.keys() == EXPECTED_ALERTS
    for name, rule in rules.items():
        assert not rule.get("lastError"), (name, rule)
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
