"""`ratewarden hook HOST` runs once per tool call, so it imports what it needs and no
more: the standard library, ratewarden.hooks (hooks/command.py) and its HTTP exchange
(http/exchange.py, standard library only). Its start against a
bare `python -c pass` is a row of the benchmark (bench/hookstart.py); this holds the
import set, which is what the start costs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from ratewarden.hooks.hosts import HOSTS

RATEWARDEN = Path(sys.executable).with_name("ratewarden")  # the installed console script
HEAVY = ("pydantic", "pydantic_core", "pydantic_settings", "fastapi", "starlette", "uvicorn",
         "redis", "httpx", "anyio", "yaml", "prometheus_client")  # fmt: skip
PAYLOAD = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}}


def imported_by_hook(host: str, payload: Mapping[str, object] = PAYLOAD) -> set[str]:
    """Every module a hook invocation imported, from `python -X importtime`'s report."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(RATEWARDEN), "hook", host,
         "--url", "http://127.0.0.1:9", "--timeout", "0.2"],
        input=json.dumps(payload), capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "AGENT_CODE_HOOK_EVENT": "pre_tool_use",
             "AGENT_CODE_HOOK_TOOL": "Bash"},
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert lines, done.stderr  # the report is there: the probe ran
    return {line.rsplit("|", 1)[1].strip() for line in lines[1:]}


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_hook_imports_nothing_heavy(host: str) -> None:
    modules = imported_by_hook(host)
    assert "ratewarden.hooks.command" in modules
    heavy = {m for m in modules if m.split(".")[0] in HEAVY}
    assert heavy == set()
    ours = {m for m in modules if m.startswith("ratewarden.")}
    standard_library_only = {
        *("ratewarden.vocabulary", "ratewarden.clock"),
        *("ratewarden.http", "ratewarden.http.head", "ratewarden.http.exchange"),
    }
    assert ours <= {"ratewarden.__main__", *standard_library_only} | {
        m for m in ours if m.startswith("ratewarden.hooks")
    }


# Standard-library modules a fifth or more of a hook's start each (with what they pull
# in); `ratewarden.arguments` brings the first two, so a plain payload never loads it.
COSTLY = ("dataclasses", "inspect", "hashlib", "logging", "uuid", "ratewarden.arguments")


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_plain_payload_loads_none_of_the_costly_modules(host: str) -> None:
    assert imported_by_hook(host) & set(COSTLY) == set()


def test_a_model_call_hook_is_as_light() -> None:
    """Gemini CLI's BeforeModel: the model path (its ledger included) imports nothing
    heavy or costly either."""
    request = {"model": "gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}
    payload = {"hook_event_name": "BeforeModel", "session_id": "s", "llm_request": request}
    modules = imported_by_hook("gemini", payload)
    assert "ratewarden.hooks.command" in modules
    assert {m for m in modules if m.split(".")[0] in HEAVY} == set()
    assert modules & set(COSTLY) == set()
