"""What the benchmark's servers decide: the policies, the calls, and the servers' settings.

One home for the workload that bench/run.py saturates and bench/instructions.py counts.
"""

from __future__ import annotations

import os

ONE_RULE = """\
version: 1
rules:
  - name: per-user
    per: [user]
    rate: 100/minute
"""
# Five rules that all match every call: three rate algorithms, a budget, a concurrency cap.
FIVE_RULES = """\
version: 1
tools:
  default: {cost: 0.001}
rules:
  - {name: per-user, per: [user], rate: 100/minute}
  - {name: per-user-tool, per: [user, tool], rate: 100/minute, algorithm: token_bucket}
  - {name: per-tool, per: [tool], rate: 10000000/hour, algorithm: fixed_window}
  - {name: daily-spend, per: [user], budget: 100.00/day}
  - {name: slots, per: [user], concurrency: 1000}
"""
USERS = 20_000
TOOLS = ("terminal", "browser_navigate", "web_search", "file_write")


def check_calls() -> list[dict[str, str]]:
    """One call per user, the tools taken in turn."""
    return [{"user": f"user-{i}", "tool": TOOLS[i % len(TOOLS)]} for i in range(USERS)]


def server_environment() -> dict[str, str]:
    """The environment every server under test runs in: no state file, audit log or
    reloads, and this process's RATEWARDEN_* variables left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATEWARDEN_")}
    env.update(
        RATEWARDEN_STATE_FILE="off",
        RATEWARDEN_AUDIT_LOG="off",
        RATEWARDEN_RELOAD_INTERVAL_S="0",
        # What is measured is the decision path, not the outage path: a stall of the machine
        # (CI builds host environments meanwhile) must not time store calls out at the
        # default 100 ms and open the breaker, leaving the fail mode to answer without Redis.
        RATEWARDEN_STORE_TIMEOUT_MS="5000",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env
