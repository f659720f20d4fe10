"""The benchmark, end to end: `./bench/run` (or `python -m bench`), documented in
docs/benchmarks.md.

It starts a private redis-server on a free port, then, one after the other, each HTTP
server under test on the same uvicorn settings, and drives it from a separate load
generator process (bench/loadgen.py):

- echo: bare FastAPI, parse the body and send it back (no Redis);
- floor: FastAPI, parse the body, one EVALSHA of a trivial script (bench/floor.py);
- ratewarden with one rule, with five matching rules (rate, token bucket, fixed window,
  budget, concurrency), on the batch endpoint (10 calls a request), and with two workers;
- the refused hammer: ratewarden with one rule, one user sending a call it already
  refused, with Redis's commands per attempt (bench/hammer.py).

Each is saturated (decisions/s), in several rounds interleaved so that a noisy moment
hurts every server alike; the report keeps each server's median round, and each target
ratio is taken within a round, then the median over rounds. ratewarden with one rule is then
offered fixed loads at 25, 50 and 75 % of its saturation for p50/p99/p99.9 latency, and
sent the worst bodies within the caps (bench/worstbody.py): each one's cost next to a
normal check's, and other clients' latency while the costliest is sent.
Every load run also reports the CPU each part (the server with its workers, Redis, the
load generator) spent per decision, read by the load generator over its measured window,
and from the one-rule run the most two workers can give on this machine's cores. Then the
engine side by side with `limits` and `throttled-py` (bench/peers.py), Redis memory
per counter (bench/memory.py), and in process what access rules and argument conditions
cost a call (bench/inprocess.py), and how long a command hook takes per tool call next to
a bare interpreter (bench/hookstart.py), and what `ratewarden mcp` adds to an MCP tool
call over stdio and HTTP (bench/mcp_overhead.py), and what the costliest bodies cost the
MCP gateway next to a tool call (bench/mcp_worstbody.py), and Envoy's gRPC rate limit path
next to `POST /v1/check` on one daemon, with the latency Envoy's rate limit filter adds at
half load (bench/envoy.py). Results: a Markdown report on
stdout (the table in docs/benchmarks.md) and every figure as JSON (`--out`), each target
marked met or not.
Absolute numbers depend on the machine; the targets are ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
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

from bench.envoy import TARGET as ENVOY_TARGET
from bench.envoy import measure as measure_envoy
from bench.envoy import plan as envoy_plan
from bench.envoy import report as envoy_report
from bench.hammer import HAMMER_RULE, HAMMERED, counts, per_attempt, refuse
from bench.hammer import report as hammer_report
from bench.hammer import summary as hammer_summary
from bench.hookstart import measure as measure_hook_start
from bench.inprocess import report as inprocess_report
from bench.inprocess import run_inprocess
from bench.mcp_overhead import measure as measure_mcp
from bench.mcp_overhead import report as mcp_report
from bench.mcp_worstbody import measure as measure_mcp_worst
from bench.mcp_worstbody import report as mcp_worst_report
from bench.memory import run_memory
from bench.models import measure_models
from bench.models import report as models_report
from bench.peers import run_peers
from bench.procstat import busy_cores, cpu_times
from bench.redis_server import free_port, redis_server, stop_group
from bench.workload import FIVE_RULES, ONE_RULE, USERS, check_calls, server_environment
from bench.worstbody import Target, measure_worst
from bench.worstbody import policy as worst_body_policy
from bench.worstbody import report as worst_report

BATCH = 10  # calls per batch request
CONNECTIONS = 64  # enough to keep two workers busy: at 32 they were idle a third of the time
LOADS = (0.25, 0.50, 0.75)
TARGETS = {
    "one rule / floor": (">=", 1.0),
    "one rule / echo": (">=", 0.6),
    "five rules cost / one rule": ("<=", 1.15),
    "p99 at 50% of saturation (ms)": ("<=", 5.0),
    "two workers / one worker": (">=", 1.6),
    "engine / limits (checks/s)": (">=", 2.0),
    "refused hammer: Redis commands/attempt": ("<=", 0.01),
    "unmatched access and args rules: us more per call": ("<=", 2.0),
    "catastrophic regex / trivial regex (64 KiB)": ("<=", 1.5),
    "hook start / python -c pass": ("<=", 4.0),
    "MCP stdio proxy: ms added per call": ("<=", 2.0),
    "MCP HTTP gateway, command upstream: ms added per call": ("<=", 2.0),
    "MCP HTTP gateway, URL upstream: ms added per call": ("<=", 2.0),
    "MCP gateway: worst body / a tools/call relay": ("<=", 10.0),
    "model call / tool call (check and settle)": ("<=", 1.2),
    ENVOY_TARGET: (">=", 0.7),
}
MCP_ROWS = {  # target row -> the way bench/mcp_overhead.py measured it
    "MCP stdio proxy: ms added per call": "stdio proxy",
    "MCP HTTP gateway, command upstream: ms added per call": "http gateway (command)",
    "MCP HTTP gateway, URL upstream: ms added per call": "http gateway",
}


@dataclass(frozen=True)
class Server:
    name: str
    command: list[str]
    path: str = "/v1/check"
    bodies: str = "check"
    per_request: int = 1  # decisions in one request
    refused: bool = False  # its one caller is refused before the load (bench/hammer.py)


@dataclass
class Setup:
    python: str
    workdir: Path
    redis_port: int
    redis_pid: int
    rounds: int
    duration: float
    warmup: float


def redis_command(port: int, *args: str) -> Any:
    import redis

    client = redis.Redis(port=port)
    try:
        return client.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def servers(setup: Setup, port_of: dict[str, int]) -> list[Server]:
    py, work, redis_url = setup.python, setup.workdir, f"redis://127.0.0.1:{setup.redis_port}/0"

    def ratewarden(name: str, policy: str, workers: int = 1, **kw: Any) -> Server:
        command = [py, "-m", "ratewarden", "serve", "--port", str(port_of[name])]
        command += ["--store-url", redis_url, "--policy", str(work / policy)]
        command += ["--workers", str(workers), "--log-level", "warning"]
        return Server(name, command, **kw)

    floor = [py, "-m", "bench.floor"]
    return [
        Server("echo", [*floor, "echo", "--port", str(port_of["echo"])]),
        Server(
            "floor", [*floor, "floor", "--port", str(port_of["floor"]), "--store-url", redis_url]
        ),
        ratewarden("one rule", "one.yaml"),
        ratewarden("five rules", "five.yaml"),
        ratewarden("batch", "one.yaml", path="/v1/check/batch", bodies="batch", per_request=BATCH),
        ratewarden("two workers", "one.yaml", workers=2),
        ratewarden("refused hammer", "hammer.yaml", bodies="hammer", refused=True),
    ]


def degraded_decisions(port: int) -> float | None:
    """The decisions a ratewarden server answered by its fail mode so far (None: not a
    ratewarden server, no /metrics)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    lines = [line for line in text.splitlines() if line.startswith("ratewarden_degraded_")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if "_created" not in line)


@contextlib.contextmanager
def running(server: Server, port: int, workdir: Path) -> Iterator[int]:
    """The server, started and answering; yields its process id."""
    log = (workdir / f"{server.name.replace(' ', '-')}.log").open("wb")
    process = subprocess.Popen(
        server.command,
        cwd=Path(__file__).resolve().parent.parent,  # so `bench` imports
        env=server_environment(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until_answering(port, process)
        yield process.pid
    finally:
        stop_group(process)
        log.close()


def wait_until_answering(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    body = {"user": "warmup", "tool": "terminal"}
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/check", json=body, timeout=1)
            if answer.status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not answer in 30 s")


def load(setup: Setup, server: Server, port: int, pid: int, *, rate: float = 0.0) -> dict[str, Any]:
    """One load generator run against `server` (a separate process; `pid` is the
    server's), with the CPU each part of the run spent per decision."""
    command = [
        setup.python, "-m", "bench.loadgen", "--port", str(port), "--path", server.path,
        "--bodies", str(setup.workdir / f"{server.bodies}.jsonl"),
        "--connections", str(CONNECTIONS), "--rate", str(rate / server.per_request),
        "--warmup", str(setup.warmup), "--duration", str(setup.duration),
        "--watch", f"server={pid}", "--watch", f"redis={setup.redis_pid}",
    ]  # fmt: skip
    degraded_before = degraded_decisions(port)
    done = subprocess.run(
        command,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    degraded_after = degraded_decisions(port)
    if degraded_before is not None and degraded_after is not None:
        # Answered without the store: not a measurement of the decision path.
        result["degraded_decisions"] = degraded_after - degraded_before
    if result["errors"] or not result["answered"]:
        raise RuntimeError(f"{server.name}: {result}")
    result["decisions_per_s"] = result["per_second"] * server.per_request
    decisions = result["answered"] * server.per_request  # in the measured window
    result["cpu_us_per_decision"] = {
        part: seconds / decisions * 1e6 for part, seconds in result.pop("cpu_s").items()
    }
    return result


def write_inputs(workdir: Path) -> None:
    (workdir / "one.yaml").write_text(ONE_RULE)
    (workdir / "five.yaml").write_text(FIVE_RULES)
    (workdir / "hammer.yaml").write_text(HAMMER_RULE)
    (workdir / "hammer.jsonl").write_text(json.dumps(HAMMERED) + "\n")
    calls = check_calls()
    with (workdir / "check.jsonl").open("w") as out:
        for call in calls:
            out.write(json.dumps(call) + "\n")
    with (workdir / "batch.jsonl").open("w") as out:
        for start in range(0, USERS, BATCH):
            out.write(json.dumps({"calls": calls[start : start + BATCH]}) + "\n")


SERVER_NAMES = [
    "echo", "floor", "one rule", "five rules", "batch", "two workers", "refused hammer",
]  # fmt: skip


def measure_http(setup: Setup) -> dict[str, Any]:
    port_of = {name: free_port() for name in SERVER_NAMES}
    table = servers(setup, port_of)
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in table}
    for round_ in range(setup.rounds):
        for server in table:
            redis_command(setup.redis_port, "FLUSHALL")
            with running(server, port_of[server.name], setup.workdir) as pid:
                result = saturate(setup, server, port_of[server.name], pid)
            runs[server.name].append(result)
            print(
                f"  round {round_ + 1}/{setup.rounds} {server.name:<12} "
                f"{result['decisions_per_s']:>9.0f} decisions/s",
                file=sys.stderr,
            )
    kept = {name: median_run(results) for name, results in runs.items()}
    one = next(s for s in table if s.name == "one rule")
    latency = {}
    redis_command(setup.redis_port, "FLUSHALL")
    with running(one, port_of[one.name], setup.workdir) as pid:
        for share in LOADS:
            rate = kept["one rule"]["decisions_per_s"] * share
            latency[f"{int(share * 100)}%"] = {"offered_per_s": rate} | load(
                setup, one, port_of[one.name], pid, rate=rate
            )
    return {"saturation": kept, "rounds": runs, "latency": latency}


def saturate(setup: Setup, server: Server, port: int, pid: int) -> dict[str, Any]:
    """One saturation run, with the machine's busy cores; for the refused hammer, its
    caller refused first and Redis's work per attempt counted around the run."""
    if server.refused:
        refuse(port)
        before = counts(port, redis_command(setup.redis_port, "INFO", "commandstats"))
    cpu_before = cpu_times()
    result = load(setup, server, port, pid)
    result["cpu_busy_cores"] = busy_cores(cpu_before, cpu_times())
    if server.refused:
        after = counts(port, redis_command(setup.redis_port, "INFO", "commandstats"))
        result["redis_per_attempt"] = per_attempt(before, after)
    return result


# The other clients' checks/s in the worst-body run: a steady load the daemon serves with
# room to spare, so that their latency measures the worst body, not a queue.
WORST_RATE = 200.0


def measure_worst_bodies(setup: Setup) -> dict[str, Any]:
    """bench/worstbody.py against the one-rule server, its policy with worstbody's regex
    rules added (on tools of their own: the other bodies and normal checks match none)."""
    port_of = {name: free_port() for name in SERVER_NAMES}
    one = next(s for s in servers(setup, port_of) if s.name == "one rule")
    # ... with the argument conditions whose bodies the table has (worstbody.REGEX_RULES)
    worst_policy = setup.workdir / "worst.yaml"
    worst_policy.write_text(worst_body_policy(ONE_RULE))
    command = [str(worst_policy) if arg.endswith("one.yaml") else arg for arg in one.command]
    one = Server(one.name, command)
    redis_command(setup.redis_port, "FLUSHALL")
    with running(one, port_of[one.name], setup.workdir) as pid:
        target = Target(
            setup.python, setup.workdir, port_of[one.name], pid, setup.warmup, setup.duration
        )
        return measure_worst(target, rate=WORST_RATE)


def median_run(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(results, key=lambda r: float(r["decisions_per_s"]))
    return ordered[(len(ordered) - 1) // 2]


def ratios(
    http: dict[str, Any],
    peers: dict[str, Any],
    inprocess: dict[str, Any],
    hooks: dict[str, Any],
    mcp: dict[str, Any],
    envoy: dict[str, Any],
) -> dict[str, float]:
    """Each throughput ratio within a round (its servers ran a minute apart), median over
    the rounds: the machine's speed drifts by up to 2x between rounds, which a ratio of
    each server's median round would let in."""

    def median_ratio(a: str, b: str) -> float:
        pairs = zip(http["rounds"][a], http["rounds"][b], strict=True)
        per_round = [x["decisions_per_s"] / y["decisions_per_s"] for x, y in pairs]
        return float(statistics.median(per_round))

    return {
        "one rule / floor": median_ratio("one rule", "floor"),
        "one rule / echo": median_ratio("one rule", "echo"),
        "five rules cost / one rule": median_ratio("one rule", "five rules"),
        "p99 at 50% of saturation (ms)": float(http["latency"]["50%"]["p99_ms"]),
        "two workers / one worker": median_ratio("two workers", "one rule"),
        "engine / limits (checks/s)": float(peers["ratio_vs_limits"]),
        "refused hammer: Redis commands/attempt": hammer_summary(http)["commands_per_attempt"],
        "unmatched access and args rules: us more per call": float(
            inprocess["unmatched_rules"]["us_more"]
        ),
        "catastrophic regex / trivial regex (64 KiB)": float(inprocess["regex"]["ratio"]),
        "hook start / python -c pass": float(hooks["ratio"]),
        **{row: float(mcp[way]["added_ms"]) for row, way in MCP_ROWS.items()},
        "MCP gateway: worst body / a tools/call relay": float(
            mcp["worst_bodies"]["worst_vs_normal"]
        ),
        "model call / tool call (check and settle)": float(inprocess["models"]["ratio"]),
        ENVOY_TARGET: float(envoy["ratio"]),
    }


def two_worker_ceiling(http: dict[str, Any]) -> float | None:
    """The most two workers can give over one on this machine: its cores are shared by
    the workers, Redis and the load generator, so at the CPU per decision each part spent
    with one worker (D, R, L) they decide at most cores / (D + R + L) a second, where one
    worker decides 1 / D: min(2, cores x D / (D + R + L)). Optimistic: a second worker
    adds contention, and a busy machine's time slices are not free either."""
    spent: dict[str, float] = http["saturation"]["one rule"]["cpu_us_per_decision"]
    if not {"server", "redis", "load generator"} <= spent.keys():
        return None  # not on Linux: no /proc
    total = spent["server"] + spent["redis"] + spent["load generator"]
    return min(2.0, (os.cpu_count() or 1) * spent["server"] / total)


def met(name: str, value: float) -> bool:
    how, bound = TARGETS[name]
    return value >= bound if how == ">=" else value <= bound


def machine() -> dict[str, Any]:
    redis_version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "redis": redis_version,
    }


def report(results: dict[str, Any]) -> str:
    http, peers, memory = results["http"], results["peers"], results["memory"]
    lines = ["## Results", "", f"Machine: {results['machine']}", ""]
    lines += ["| server | decisions/s | p50 ms | p99 ms | p99.9 ms | busy cores "
              "| CPU us/decision: server | Redis | load generator |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    runs = [(f"{name} (saturated)", run) for name, run in http["saturation"].items()]
    runs += [(f"one rule at {share} of saturation", run) for share, run in http["latency"].items()]
    for title, run in runs:
        busy, spent = run.get("cpu_busy_cores"), run["cpu_us_per_decision"]
        cpu = " | ".join(
            f"{spent[part]:.0f}" if part in spent else "-"
            for part in ("server", "redis", "load generator")
        )
        lines.append(
            f"| {title} | {run['decisions_per_s']:.0f} | {run['p50_ms']:.2f} "
            f"| {run['p99_ms']:.2f} | {run['p999_ms']:.2f} "
            f"| {'-' if busy is None else f'{busy:.2f}'} | {cpu} |"
        )
    lines += ["", "| round | " + " | ".join(http["rounds"]) + " |",
              "|---|" + "---|" * len(http["rounds"])]  # fmt: skip
    for i, row in enumerate(zip(*http["rounds"].values(), strict=True)):
        rates = " | ".join(f"{run['decisions_per_s']:.0f}" for run in row)
        lines.append(f"| {i + 1} | {rates} |")
    lines += ["", "| target | measured | goal | met |", "|---|---|---|---|"]
    for name, value in results["ratios"].items():
        how, bound = TARGETS[name]
        shown = f"{value:.4f}" if bound < 0.1 else f"{value:.2f}"
        lines.append(
            f"| {name} | {shown} | {how} {bound} | {'yes' if met(name, value) else 'NO'} |"
        )
    if (ceiling := results["two_worker_ceiling"]) is not None:
        lines += [
            "",
            f"Two workers / one worker can reach at most {ceiling:.2f} on this machine: its "
            f"{os.cpu_count()} cores are shared by the workers, Redis and the load generator, at "
            "the CPU per decision each spent in the one-rule run (`two_worker_ceiling`).",
        ]
    lines += ["", *hammer_report(results["refused_hammer"])]
    lines += ["", "### Worst bodies", *worst_report(results["worst_bodies"])]
    lines += ["", "| engine side by side | checks/s | Redis commands/check | round trips/check "
              "| consumes a counter on deny |", "|---|---|---|---|---|"]  # fmt: skip
    for name in ("ratewarden", "limits", "throttled"):
        row = peers[name]
        lines.append(
            f"| {name} | {row['checks_per_s']:.0f} | {row['commands_per_check']:.2f} "
            f"| {row['round_trips_per_check']} | {row['consumes_on_deny']} |"
        )
    lines += ["", f"| memory, {memory['users']} users | bytes/counter | value bytes (one call) "
              "| full counter: value / Redis bytes | max TTL | keys after the window |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for row in memory["limits"].values():
        lines.append(
            f"| sliding_window {row['rate']} | {row['bytes_per_counter']:.0f} "
            f"| {row['value_bytes']} | {row['full_counter_value_bytes']} / "
            f"{row['full_counter_memory_usage']} | {row['max_pttl_ms'] / 1000:.0f} s "
            f"| {row['keys_after_expiry']} |"
        )
    lines += ["", "### Access rules and argument conditions, in process", ""]
    lines += inprocess_report(results["inprocess"])
    lines += ["", *models_report(results["inprocess"]["models"])]
    lines += ["", "### An MCP tool call, straight to the server and through ratewarden mcp", ""]
    lines += mcp_report(results["mcp"])
    lines += ["", "### Worst bodies at the MCP gateway", ""]
    lines += mcp_worst_report(results["mcp"]["worst_bodies"])
    lines += ["", "### Envoy: the gRPC rate limit path, and Envoy in front", ""]
    lines += envoy_report(results["envoy"])
    return "\n".join(lines)


async def measure_engines(redis_port: int, quick: bool) -> dict[str, Any]:
    url = f"redis://127.0.0.1:{redis_port}/0"
    return await run_peers(url, checks=300 if quick else 20_000)


async def measure_memory(redis_port: int, quick: bool) -> dict[str, Any]:
    url = f"redis://127.0.0.1:{redis_port}/0"
    if quick:
        return await run_memory(url, users=200, short_window_s=2.0)
    return await run_memory(url)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seconds, not minutes (smoke test)")
    parser.add_argument("--rounds", type=int, help="saturation rounds per server (default 3)")
    parser.add_argument("--duration", type=float, help="seconds measured per run (default 8)")
    parser.add_argument("--out", type=Path, help="write every figure here as JSON")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be positive")
    with tempfile.TemporaryDirectory(prefix="ratewarden-bench-") as tmp:
        workdir = Path(tmp)
        write_inputs(workdir)
        with redis_server(workdir) as redis_port:
            setup = Setup(
                python=sys.executable,
                workdir=workdir,
                redis_port=redis_port,
                redis_pid=int(redis_command(redis_port, "INFO", "server")["process_id"]),
                rounds=args.rounds or (1 if args.quick else 3),
                duration=args.duration or (0.5 if args.quick else 8.0),
                warmup=0.2 if args.quick else 2.0,
            )
            print("HTTP servers…", file=sys.stderr)
            http = measure_http(setup)
            print("worst bodies…", file=sys.stderr)
            worst = measure_worst_bodies(setup)
            print("engine side by side…", file=sys.stderr)
            redis_command(redis_port, "FLUSHALL")
            peers = asyncio.run(measure_engines(redis_port, args.quick))
            print("memory…", file=sys.stderr)
            redis_command(redis_port, "FLUSHALL")
            memory = asyncio.run(measure_memory(redis_port, args.quick))
            print("Envoy's gRPC rate limit path, and Envoy in front…", file=sys.stderr)
            envoy = measure_envoy(
                envoy_plan(setup.python, workdir, redis_port, setup.redis_pid, args.quick)
            )
    print("access rules and argument conditions, in process…", file=sys.stderr)
    inprocess = asyncio.run(run_inprocess(args.quick))
    print("model calls beside tool calls, in process…", file=sys.stderr)
    quick = args.quick
    inprocess["models"] = asyncio.run(measure_models(2_000 if quick else 20_000, 3 if quick else 7))
    print("command hook start…", file=sys.stderr)
    hooks = measure_hook_start(runs=11 if args.quick else 41)
    print("MCP tool calls through ratewarden mcp…", file=sys.stderr)
    mcp = measure_mcp(calls=100 if args.quick else 1000)
    print("worst bodies at the MCP gateway…", file=sys.stderr)
    mcp["worst_bodies"] = measure_mcp_worst(requests=50 if args.quick else 200)
    results: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(["bench/run", *(argv if argv is not None else sys.argv[1:])]),
        "http": http,
        "worst_bodies": worst,
        "peers": peers,
        "memory": memory,
        "refused_hammer": hammer_summary(http),
        "inprocess": inprocess,
        "hook_start": hooks,
        "mcp": mcp,
        "envoy": envoy,
    }
    results["ratios"] = ratios(http, peers, inprocess, hooks, mcp, envoy)
    results["targets_met"] = {name: met(name, v) for name, v in results["ratios"].items()}
    results["two_worker_ceiling"] = two_worker_ceiling(http)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))
    return 0
