"""The operator files, checked by the tools that will read them.

- deploy/prometheus/alerts.yml: `promtool check rules`, and its unit tests
  (alerts_test.yml: every alert firing and not firing) with `promtool test rules`;
- deploy/prometheus/prometheus.yml: `promtool check config` (it loads alerts.yml too);
- dashboards/ratewarden.json and deploy/grafana/provisioning: structure (every panel on the
  `datasource` variable, every target with an expression, unique ids);
- every metric a dashboard or an alert names is one that src/ratewarden/metrics.py defines;
- a real daemon's /metrics after varied traffic, with one worker and with several
  (multiprocess exposition), passes `promtool check metrics` with no complaint.

The helpers here (expressions, variables, metric names, the policy and the traffic) are
shared with tests/service/test_prometheus_e2e.py, which runs the same files against a real
Prometheus.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from ratewarden.service.metrics import Metrics
from tests.helpers.redis_server import RedisServer, free_port, running_redis
from tests.service.test_cli import serving

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "ratewarden.json"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana" / "provisioning"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
EXPECTED_ALERTS = {
    "RatewardenHighDenialRatio",
    "RatewardenFailingOpen",
    "RatewardenStoreErrors",
    "RatewardenSlowChecks",
    "RatewardenDown",
    "RatewardenPolicyReloadFailed",
    "RatewardenAnsweringByFailMode",
    "RatewardenStoreCircuitOpen",
    "RatewardenDenialRatioJump",
    "RatewardenUnsettledReservations",
}
# prometheus-client's process and Python metrics: one process's, so not exported by
# several workers (multiprocess mode merges only what the workers write to files).
ONE_PROCESS_ONLY = ("process_", "python_")


# -- Prometheus's tools ---------------------------------------------------------------------


def ensure_prometheus() -> tuple[str, str]:
    """Paths of prometheus and promtool, installing Debian's package if they are not there."""
    found = shutil.which("prometheus"), shutil.which("promtool")
    if found[0] and found[1]:
        return found[0], found[1]
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "prometheus"], check=True, capture_output=True
    )
    found = shutil.which("prometheus"), shutil.which("promtool")
    if not (found[0] and found[1]):
        raise RuntimeError("prometheus is not installed and apt-get could not install it")
    return found[0], found[1]


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [ensure_prometheus()[1], *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done


# -- the dashboard and the alerts, as data --------------------------------------------------


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside rows included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def panel_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title + refId, expression) of every query target of every panel."""
    return [
        (f"{panel['title']} [{target['refId']}]", target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, query) of the dashboard's query variables (label_values(...) and the like)."""
    found = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append((variable["name"], query["query"] if isinstance(query, dict) else query))
    return found


def label_values(query: str) -> tuple[str, str]:
    """(series selector, label) of a `label_values(selector, label)` variable query."""
    match = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\s*\)\s*", query, re.DOTALL)
    assert match, f"not a label_values(selector, label) query: {query!r}"
    return match.group(1), match.group(2)


def substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` with Grafana's variables ($name, ${name}) replaced; an unknown one is an error."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for the variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def load_alert_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


# -- metric names in PromQL -----------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([^"]+)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
# An identifier that is not the tail of a number or duration (5m, 1e3, 0.5).
_IDENTIFIER = re.compile(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "atan2", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, labels, keywords left out)."""
    names = set(_NAME_MATCHER.findall(expr))
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = _GROUPING.sub(" ", text)  # by (le), on (job)...
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        if word.lower() in _KEYWORDS or re.match(r"\s*\(", text[match.end() :]):
            continue  # a keyword, or a function / aggregation called here
        names.add(word)
    return names


def assert_metrics_exist(exprs: Iterable[tuple[str, str]], known: set[str]) -> None:
    """Fail, naming each (where, expression), when an expression names an unknown metric."""
    missing = {
        where: sorted(metric_names(expr) - known)
        for where, expr in exprs
        if metric_names(expr) - known
    }
    assert not missing, f"expressions name metrics that do not exist: {missing}"


def defined_metric_names() -> set[str]:
    """The sample names src/ratewarden/metrics.py can expose, and Prometheus's `up`."""
    names = {"up"}
    for family in Metrics(CollectorRegistry()).registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def all_exprs() -> list[tuple[str, str]]:
    """Every dashboard target, variable selector and alert expression (variables unset)."""
    alerts = [(f"alert {rule['alert']}", rule["expr"]) for rule in load_alert_rules()]
    variables = [
        (f"variable {name}", label_values(query)[0])
        for name, query in variable_queries(load_dashboard())
    ]
    return panel_exprs(load_dashboard()) + alerts + variables


# -- a policy and traffic that give every metric a series ----------------------------------

POLICY = """\
version: 1
defaults: {mode: enforce, fail: open}
tools:
  terminal: {label: terminal}
  web_search: {label: search}
  deploy: {label: deploy}
  "browser_*": {label: browser, cost: 0.25}
  default: {cost: 0}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 3/minute
  - name: search-shadow
    match: {tool: web_search}
    rate: 1/minute
    mode: shadow
  - name: deploy-approval
    match: {tool: deploy}
    rate: 1/minute
    on_exceed: ask
    fail: closed
  - name: browser-spend
    match: {tool: "browser_*"}
    budget: 1.00/month
    soft_limit: 50%
  - name: browser-concurrency
    match: {tool: "browser_*"}
    concurrency: 2
  - name: model-spend
    match: {kind: model}
    budget: 5.00/day
"""
USER = "discord:1234"


def check(http: httpx.Client, tool: str, **extra: Any) -> dict[str, Any]:
    response = http.post("/v1/check", json={"user": USER, "tool": tool, **extra})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def decisions(http: httpx.Client, tool: str, count: int, **extra: Any) -> list[str]:
    return [check(http, tool, **extra)["decision"] for _ in range(count)]


def drive_traffic(http: httpx.Client) -> int:
    """Allowed, rate-denied, shadow, asked, approved, budget, concurrency and model-call
    traffic, with reservations and settles (one repeated, one unknown); returns the number
    of checks."""
    assert decisions(http, "terminal", 5) == ["allow"] * 3 + ["deny"] * 2
    shadow = [check(http, "web_search") for _ in range(3)]  # the last two would be blocked
    assert [(s["decision"], len(s["shadow"])) for s in shadow] == [
        ("allow", 0), ("allow", 1), ("allow", 1),
    ]  # fmt: skip
    assert check(http, "deploy")["decision"] == "allow"
    assert check(http, "deploy", call_id="deploy-2")["decision"] == "ask"
    approved = check(http, "deploy", call_id="deploy-2", approved=True)
    assert (approved["decision"], approved["approved"]) == ("allow", True)

    first, second = check(http, "browser_open"), check(http, "browser_open")
    assert [first["decision"], second["decision"]] == ["allow", "allow"]
    assert second["warnings"], "50% of the budget reserved: the soft limit warns"
    assert check(http, "browser_open")["violations"][0]["kind"] == "concurrency"
    settled = http.post(f"/v1/calls/{first['call_id']}/settle", json={"cost": 0.3})
    assert settled.json()["charged"] == {"browser-spend": 0.3}
    assert http.post(f"/v1/calls/{second['call_id']}/settle").json()["outcome"] == "settled"
    again = http.post(f"/v1/calls/{second['call_id']}/settle")
    assert again.json()["outcome"] == "already_settled"
    assert http.post("/v1/calls/never-checked/settle").status_code == 404
    # 0.55 spent: one more call (0.25 reserved) fits, the next would pass 1.00.
    assert check(http, "browser_open")["decision"] == "allow"
    assert check(http, "browser_open")["violations"][0]["kind"] == "budget"
    # A model call, checked and settled with its usage: model tokens and spend.
    model = http.post("/v1/check", json={"user": USER, "kind": "model", "model": "gpt-4o"})
    assert model.json()["decision"] == "allow", model.text
    usage = {"input_tokens": 100, "output_tokens": 10}
    settled = http.post(f"/v1/calls/{model.json()['call_id']}/settle", json={"usage": usage})
    assert settled.json()["charged"] == {"model-spend": 0.00035}  # 250 + 100 micro-USD
    assert http.get("/v1/denials").status_code == 200  # flushes the audit list to the store
    return 5 + 3 + 3 + 5 + 1


OUTAGE_USERS = itertools.count()


def drive_degraded_traffic(http: httpx.Client, rounds: int = 1) -> int:
    """With the store down: fail-open allows and fail-closed denials; returns the checks."""
    for _ in range(rounds):
        # Another user: USER's terminal refusal is remembered, and a remembered refusal
        # still refuses with the store down (engine/refusals.py). A new one each time: a
        # fail-open rule still counts each user's 3 a minute locally while the store is
        # down (docs/operations.md, "Failing open is bounded").
        allowed = check(http, "terminal", user=f"{USER}-in-the-outage-{next(OUTAGE_USERS)}")
        assert (allowed["decision"], allowed["degraded"]) == ("allow", True)
        denied = check(http, "deploy")
        assert (denied["decision"], denied["degraded"]) == ("deny", True)
        assert denied["violations"][0]["kind"] == "unavailable"
    assert http.get("/readyz").json()["answering"] == "fail mode"
    return 2 * rounds


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, trust_env=False, timeout=10.0)


# -- promtool: rules, their unit tests, the example config ---------------------------------


@pytest.mark.slow
def test_alert_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in done.stdout


def test_alert_rules_are_the_expected_ones_with_severity_and_annotations() -> None:
    rules = load_alert_rules()
    assert {rule["alert"] for rule in rules} == EXPECTED_ALERTS
    assert len(rules) == len(EXPECTED_ALERTS)
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]
        assert "{{" in rule["annotations"]["description"], rule["alert"]  # templated


def test_alert_unit_tests_pass_and_cover_every_alert_firing_and_not() -> None:
    done = promtool("test", "rules", str(ALERTS_TEST))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    firing = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert firing == EXPECTED_ALERTS
    assert quiet == EXPECTED_ALERTS


def test_example_prometheus_config_passes_promtool_check() -> None:
    done = promtool("check", "config", str(PROMETHEUS_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert [job["job_name"] for job in config["scrape_configs"]] == ["ratewarden"]
    assert config["rule_files"] == ["alerts.yml"]


# -- the dashboard and Grafana's provisioning ----------------------------------------------


def test_dashboard_structure() -> None:
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] == "ratewarden"
    assert dashboard.get("id") is None  # importable into any Grafana
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, variable in variables.items():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, name

    panels = all_panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]
            if "rate(" in target["expr"] or "increase(" in target["expr"]:
                # Grafana's ranges, never a hard-coded one that breaks at other scrape rates.
                assert re.findall(r"\[([^\]]+)\]", target["expr"]), panel["title"]
                for window in re.findall(r"\[([^\]]+)\]", target["expr"]):
                    assert window in {"$__rate_interval", "$__range"}, panel["title"]


def test_dashboard_has_a_panel_for_each_operator_question() -> None:
    """Each metric the operators asked for is on some panel, by the query that answers it."""
    exprs = [" ".join(expr.split()) for _, expr in panel_exprs(load_dashboard())]

    def having(*parts: str) -> list[str]:
        return [expr for expr in exprs if all(part in expr for part in parts)]

    assert having("sum by (tool)", "ratewarden_blocked_calls_total")
    assert having("sum by (reason)", "ratewarden_blocked_calls_total")
    assert having("topk(", "ratewarden_blocked_calls_total")
    assert having('decision="deny"', "/", "ratewarden_checks_total")
    assert having("sum by (decision", "ratewarden_checks_total")
    assert having("ratewarden_shadow_blocks_total")
    assert having("histogram_quantile(0.5,", "ratewarden_check_duration_seconds_bucket")
    assert having("histogram_quantile(0.99,", "ratewarden_check_duration_seconds_bucket")
    assert having("histogram_quantile(0.99,", "operation", "ratewarden_store_duration_seconds")
    assert having("ratewarden_store_errors_total")
    assert having("ratewarden_degraded_decisions_total")
    assert having("by (rule, currency)", "ratewarden_budget_spent_total")
    assert having("by (rule, currency)", "ratewarden_budget_reserved_total")
    assert having("ratewarden_ask_decisions_total")
    assert having("ratewarden_approved_calls_total")
    assert having("ratewarden_near_limit_total")
    assert having("ratewarden_policy_info")
    # Issue 30, item 7: the breaker, reloads, unsettled reservations, HTTP answers by
    # status, and the fleet (per daemon).
    assert having("ratewarden_store_circuit_open")
    assert having("ratewarden_store_circuit_transitions_total")
    assert having("by (result)", "ratewarden_policy_reloads_total")
    assert having("ratewarden_policy_reload_failed")
    assert having("ratewarden_budget_reservations_total")
    assert having("ratewarden_budget_settled_reservations_total")
    assert having("sum by (code)", "ratewarden_http_responses_total")
    assert having("sum by (route, code)", "ratewarden_http_responses_total")
    assert having("sum by (instance)", 'decision="deny"', "/", "ratewarden_checks_total")
    assert having("process_cpu_seconds_total")
    assert having("process_resident_memory_bytes")


def test_grafana_provisioning_files() -> None:
    providers = yaml.safe_load((GRAFANA / "dashboards" / "ratewarden.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")
    sources = yaml.safe_load((GRAFANA / "datasources" / "prometheus.yaml").read_text())
    assert sources["apiVersion"] == 1
    (source,) = sources["datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")


def test_every_metric_named_by_the_dashboard_and_alerts_is_defined_in_metrics_py() -> None:
    defined = defined_metric_names()
    assert "ratewarden_checks_total" in defined
    assert "ratewarden_check_duration_seconds_bucket" in defined
    assert_metrics_exist(all_exprs(), defined)


# -- a real /metrics, linted ----------------------------------------------------------------


def ask_envoys_rate_limit_service(port: int) -> None:
    """One ShouldRateLimit on the daemon's gRPC listener (ratewarden_grpc_answers_total)."""
    import grpc
    from envoy.extensions.common.ratelimit.v3.ratelimit_pb2 import RateLimitDescriptor
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    entries = [RateLimitDescriptor.Entry(key="user", value="metrics"),
               RateLimitDescriptor.Entry(key="tool", value="web_fetch")]  # fmt: skip
    request = rls_pb2.RateLimitRequest(descriptors=[RateLimitDescriptor(entries=entries)])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=10)
    assert answer.overall_code == rls_pb2.RateLimitResponse.OK


@pytest.mark.redis
@pytest.mark.parametrize("workers", [1, 2])
def test_a_real_metrics_exposition_passes_promtool_check_metrics(
    tmp_path: Path, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_prometheus()
    expected = defined_metric_names() - {"up"}  # before the environment says multiprocess
    if workers > 1:  # multiprocess mode: the workers' values live here, merged by /metrics
        expected = {name for name in expected if not name.startswith(ONE_PROCESS_ONLY)}
        (tmp_path / "metrics").mkdir()
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    redis: RedisServer
    grpc_port = free_port()
    with (
        running_redis(tmp_path / "redis") as redis,
        serving(
            tmp_path, "--policy", str(policy), "--store-url", redis.url,
            "--workers", str(workers), "--grpc-port", str(grpc_port),
        ) as daemon,
        client(daemon.url) as http,
    ):  # fmt: skip
        drive_traffic(http)
        ask_envoys_rate_limit_service(grpc_port)
        redis.stop()
        drive_degraded_traffic(http)
        response = http.get("/metrics")
    assert response.status_code == 200
    exposition = response.content
    # Every metric family has samples, so the lint sees every name, label and help text.
    for name in sorted(expected):
        assert re.search(rf"^{name}[{{ ]", exposition.decode(), re.MULTILINE), name
    done = promtool("check", "metrics", stdin=exposition)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
