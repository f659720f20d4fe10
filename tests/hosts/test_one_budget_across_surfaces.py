"""One daily budget per user, spent from a LangChain service and enforced in a Codex CLI
session: docs/integrations.md's "One budget across surfaces", run against one real
`ratewarden serve`.

- The service: a real LangChain v1 agent (`create_agent` with `RatewardenMiddleware()`,
  the user in the run's context) in the langchain host venv, a scripted model asking for
  its `terminal` tool (tests/hosts/drivers/langchain_budget.py).
- The session: the real Codex CLI (`codex exec`, `@openai/codex` from the npm registry)
  with `ratewarden hook codex --user ...` as its PreToolUse / PostToolUse hook, against
  a scripted Responses API (the Codex host test's harness, tests/hosts/test_host_codex.py).

Each tool call that runs appends a line to a file, so the tests count what really ran.
Both surfaces' tools cost 0.25 in the policy's catalogue and share one `budget:
1.00/day` rule per user: four calls spend it, wherever they were made.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hosts.drivers.codex_responses import FakeModel, fake_responses_api
from tests.hosts.scenario import (
    Daemon,
    appending,
    host_cli,
    host_python,
    lines,
    run_driver,
    running_daemon,
)
from tests.hosts.test_host_codex import hook_command, run_codex

# The first run builds both host environments (the Codex CLI is about 400 MB).
pytestmark = pytest.mark.timeout(900)

DRIVER = Path(__file__).parent / "drivers" / "langchain_budget.py"
# docs/integrations.md shows this policy (with `timezone: UTC`).
POLICY = """\
version: 1
defaults:
  timezone: {timezone}
tools:
  terminal: {{label: shell, cost: 0.25}}
  Bash: {{label: shell, cost: 0.25}}
rules:
  - name: shell-budget
    match: {{tool: [terminal, Bash]}}
    per: [user]
    budget: 1.00/day
"""
BUDGET = "Budget exceeded for shell tools: spent 1.00 of 1.00 USD this day"


def midday_timezone(now: datetime) -> str:
    """A fixed-offset zone where it is about noon `now`, so the budget's day cannot end
    (and the budget refill) between the two surfaces' calls, whenever the test runs."""
    shift = 12 - now.hour  # hours east of UTC, -11 to 12
    if shift == 0:
        return "UTC"
    return f"Etc/GMT{'-' if shift > 0 else '+'}{abs(shift)}"  # Etc/GMT-5 is UTC+5


@pytest.fixture(scope="module")
def codex() -> Path:
    return host_cli("codex")


@pytest.fixture(scope="module")
def langchain() -> Path:
    return host_python("langchain")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    policy = POLICY.format(timezone=midday_timezone(datetime.now(UTC)))
    with running_daemon(policy, tmp_path / "daemon") as served:
        yield served


def langchain_service(python: Path, daemon: Daemon, work: Path, user: str, calls: int) -> Any:
    """A LangChain agent run of `user` asking for `terminal` `calls` times; its report."""
    work.mkdir(exist_ok=True)
    config = {"url": daemon.url, "work": str(work), "user": user, "calls": calls}
    return run_driver(python, DRIVER, config, timeout=180)


def codex_session(codex: Path, daemon: Daemon, tmp_path: Path, user: str, ran: Path) -> str:
    """One `codex exec` of `user` whose model asks for its shell once; what it read."""
    with fake_responses_api(appending(ran), calls=1) as (url, model):
        run_codex(codex, tmp_path, url, hook_command(f"--url {daemon.url} --user {user}"))
    return only_result(model)


def only_result(model: FakeModel) -> str:
    [call] = model.call_ids
    return model.tool_results[call]


def budget_of(daemon: Daemon, user: str, tool: str) -> dict[str, Any] | None:
    """What `user`'s budget has spent and holds, as the daemon counts `tool`'s calls."""
    found = httpx.get(f"{daemon.url}/v1/usage", params={"user": user, "tool": tool})
    limits = found.raise_for_status().json()["limits"]
    return {
        item["rule"]: {"spent": item["used"], "reserved": item["reserved"]} for item in limits
    }.get("shell-budget")


def sentence(text: str) -> str:
    """A refusal without its `(retry in ...)` suffix, which moves with the clock."""
    start = text.index(BUDGET)
    return text[start : text.index(" (retry in", start)]


def test_a_budget_spent_through_langchain_refuses_the_user_in_codex(
    codex: Path, langchain: Path, daemon: Daemon, tmp_path: Path
) -> None:
    # alice's LangChain service asks for terminal five times: four spend the 1.00.
    service = langchain_service(langchain, daemon, tmp_path / "service", "alice", calls=5)
    results = service["results"]
    assert results[:4] == [f"ran echo {i}" for i in range(1, 5)]
    assert service["ran"] == 4  # what the tool itself wrote
    assert results[4].startswith(BUDGET), results[4]
    assert service["errors"] == [results[4]]  # a ToolMessage with status="error"
    # Each call that ran was settled (charged its cost; nothing still held).
    assert budget_of(daemon, "alice", "terminal") == {"spent": 1.0, "reserved": 0.0}

    # Then alice's Codex CLI session: refused by the same budget, and nothing runs.
    ran = tmp_path / "codex-ran.txt"
    read = codex_session(codex, daemon, tmp_path, "alice", ran)
    assert BUDGET in read, read
    assert sentence(read) == sentence(results[4])  # the very sentence LangChain's model read
    assert lines(ran) == 0
    assert budget_of(daemon, "alice", "Bash") == {"spent": 1.0, "reserved": 0.0}
    # The daemon's record: one rule refused both surfaces' calls.
    denials = httpx.get(f"{daemon.url}/v1/denials", params={"user": "alice"}).json()["denials"]
    # Codex's Bash is terminal to the daemon, its own name kept beside it.
    assert sorted((d["tool"], d.get("host_tool") or "", d["rule"]) for d in denials) == [
        ("terminal", "", "shell-budget"),
        ("terminal", "Bash", "shell-budget"),
    ]

    # bob has a budget of his own: his Codex call runs, and PostToolUse settles it.
    read = codex_session(codex, daemon, tmp_path, "bob", ran)
    assert BUDGET not in read
    assert lines(ran) == 1
    assert budget_of(daemon, "bob", "Bash") == {"spent": 0.25, "reserved": 0.0}


def test_a_budget_spent_in_codex_refuses_the_user_in_langchain(
    codex: Path, langchain: Path, daemon: Daemon, tmp_path: Path
) -> None:
    """The other way round: one counter, whichever surface spends it."""
    ran = tmp_path / "codex-ran.txt"
    with fake_responses_api(appending(ran), calls=5) as (url, model):
        run_codex(codex, tmp_path, url, hook_command(f"--url {daemon.url} --user carol"))
    assert lines(ran) == 4  # four calls spent the 1.00 in Codex; the fifth did not run
    refused = model.tool_results[model.call_ids[4]]
    assert BUDGET in refused, refused
    assert budget_of(daemon, "carol", "Bash") == {"spent": 1.0, "reserved": 0.0}

    service = langchain_service(langchain, daemon, tmp_path / "service", "carol", calls=1)
    assert service["ran"] == 0
    [read] = service["results"]
    assert sentence(read) == sentence(refused)
