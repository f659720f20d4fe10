"""The benchmark's smoke run: `bench/run --quick`, seconds per part, so it never rots.

Only that every part runs and measures what it says is checked here: servers answered
with no errors, the peers' structural facts (round trips, consumption on deny), memory
bounds and expiry. The speed targets are ratios the full benchmark reports
(docs/benchmarks.md); they are never timed assertions in the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVERS = {"echo", "floor", "one rule", "five rules", "batch", "two workers"}


@pytest.mark.redis
@pytest.mark.timeout(900)
def test_the_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = subprocess.run(
        [str(ROOT / "bench" / "run"), "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())

    saturation = results["http"]["saturation"]
    assert set(saturation) == SERVERS
    for name, run in saturation.items():
        assert run["errors"] == 0, (name, run)
        assert run["answered"] > 0, (name, run)
        assert run["decisions_per_s"] > 0, (name, run)
        assert 0 < run["cpu_busy_cores"] <= (os.cpu_count() or 1) + 0.01, (name, run)
    assert set(results["http"]["latency"]) == {"25%", "50%", "75%"}
    for run in results["http"]["latency"].values():
        assert run["errors"] == 0
        assert run["p99_ms"] >= run["p50_ms"] > 0

    # Each part's CPU per decision, read in the measured window (in ticks of 10 ms): the
    # server and the load generator always work; Redis for every server but the echo.
    for name, run in [*saturation.items(), *results["http"]["latency"].items()]:
        spent = run["cpu_us_per_decision"]
        assert set(spent) == {"server", "redis", "load generator"}, (name, spent)
        assert spent["server"] > 0, (name, spent)
        assert spent["load generator"] > 0, (name, spent)
        assert spent["redis"] > 0 or name == "echo", (name, spent)
    assert 0 < results["two_worker_ceiling"] <= 2

    peers = results["peers"]
    assert peers["ratewarden"]["round_trips_per_check"] == 1
    assert peers["ratewarden"]["consumes_on_deny"] is False
    assert peers["limits"]["consumes_on_deny"] is True
    assert peers["limits"]["round_trips_per_check"] == 3
    for name in ("ratewarden", "limits", "throttled"):
        assert peers[name]["checks_per_s"] > 0
        assert peers[name]["commands_per_check"] > 0

    for row in results["memory"]["limits"].values():
        limit = int(row["rate"].split("/")[0])
        assert row["full_counter_value_bytes"] == 8 + 6 * limit  # the documented bound
        assert row["full_counter_memory_usage"] < 1.2 * row["full_counter_value_bytes"] + 200
        assert row["max_pttl_ms"] <= row["window_ms"]
        assert row["keys_after_expiry"] == 0
        assert row["expired"] is True

    assert set(results["ratios"]) == set(results["targets_met"])
    assert len(results["ratios"]) == 6
    assert "| target | measured | goal | met |" in done.stdout
