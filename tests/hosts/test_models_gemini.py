"""Gemini CLI model calls: the real `@google/gemini-cli` 0.61.0 runs `ratewarden hook
gemini` as its BeforeModel and AfterModel command hooks (issue 31, item 4).

Offline, as tests/hosts/test_host_gemini.py: `gemini -p` talks to the scripted Gemini API
(tests/hosts/drivers/gemini_api.py), which asks for `run_shell_command` again and again
and reports the same usage with every answer, streamed in several chunks (AfterModel
fires for each; only the last ends the answer and settles). The user's one daily budget
(tests/hosts/model_budget.py's POLICY) pays for the model calls by their usage until
what is left is less than a call could cost: the next model call is refused, Gemini
sends nothing to the model and shows the single-call message.

Gemini's hook payload carries no cached tokens (its translator keeps promptTokenCount,
candidatesTokenCount and totalTokenCount), so this scenario's usage has none.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.hosts.drivers.gemini_api import fake_gemini_api
from tests.hosts.model_budget import POLICY, SINGLE_CALL, price_micros, spent_micros
from tests.hosts.scenario import clean_environment, host_cli, lines, nowhere, running_daemon
from tests.hosts.test_one_budget_across_surfaces import midday_timezone

pytestmark = pytest.mark.timeout(900)  # the first run installs the CLI

MODEL = "gemini-2.5-pro"
USAGE = {"input_tokens": 12_345, "output_tokens": 6_789}
GEMINI_USAGE = {  # USAGE as Gemini's usageMetadata says it
    "promptTokenCount": USAGE["input_tokens"],
    "candidatesTokenCount": USAGE["output_tokens"],
    "totalTokenCount": USAGE["input_tokens"] + USAGE["output_tokens"],
}
PAUSED = f"Tool guard unavailable; {MODEL} calls are paused"


@pytest.fixture(scope="module")
def gemini() -> Path:
    return host_cli("gemini")


def settings(command: str) -> dict[str, object]:
    """~/.gemini/settings.json with the hook on both model events (docs/integrations.md)."""
    hook = [{"hooks": [{"type": "command", "command": command, "timeout": 30000}]}]
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "hooks": {"BeforeModel": hook, "AfterModel": hook},
    }


def run_gemini(cli: Path, tmp_path: Path, model_url: str, flags: str) -> tuple[str, str]:
    """`gemini -p ... --yolo -m MODEL` with our model hooks; its stdout and stderr."""
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    command = f"{shlex.quote(sys.executable)} -m ratewarden hook gemini {flags}"
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings(command)))
    env = clean_environment(
        HOME=str(home),
        GEMINI_API_KEY="fake",
        GOOGLE_GEMINI_BASE_URL=model_url,
        NO_COLOR="1",
        XDG_CACHE_HOME=str(tmp_path / "cache"),  # the hook ledger, this test's own
    )
    for name in ("GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA"):
        env.pop(name, None)
    env.pop("XDG_RUNTIME_DIR", None)
    done = subprocess.run(
        [str(cli), "-p", "Append a line to the file, again and again.", "--yolo", "-m", MODEL],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"gemini failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout, done.stderr


def appending(ran: Path) -> object:
    return lambda n: f"echo ran {n} >> {shlex.quote(str(ran))}"


def test_model_calls_are_charged_by_usage_until_one_is_refused(
    gemini: Path, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    policy = POLICY.format(timezone=midday_timezone(datetime.now(UTC)))
    with running_daemon(policy, tmp_path / "daemon") as daemon:
        with fake_gemini_api(appending(ran), 40, GEMINI_USAGE, chunks=3) as (url, model):  # type: ignore[arg-type]
            out, err = run_gemini(gemini, tmp_path, url, f"--url {daemon.url} --user carol")
        spent = spent_micros(daemon, "carol")
        other = spent_micros(daemon, "dave")
    calls = model.streams  # model calls that reached the model
    assert calls >= 5, (out, err)  # the budget paid for several calls before the refusal
    assert lines(ran) == calls  # each answer asked for one shell call, which ran
    # Settled once per call (the last of its three chunks), by genai-prices' own price.
    assert spent == calls * price_micros(MODEL, USAGE)
    assert other == 0
    # Gemini says the call was blocked (stderr) and shows the sentence as the answer.
    blocked = next(line for line in err.splitlines() if "Agent execution blocked" in line)
    assert SINGLE_CALL.match(blocked.split("Agent execution blocked: ", 1)[1]), blocked
    assert SINGLE_CALL.match(out.strip().splitlines()[-1]), out  # the last answer


def test_fail_closed_refuses_a_model_call_when_the_daemon_is_away(
    gemini: Path, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    with fake_gemini_api(appending(ran), 3, GEMINI_USAGE) as (url, model):  # type: ignore[arg-type]
        out, err = run_gemini(gemini, tmp_path, url, f"--url {nowhere()} --fail closed")
    assert model.streams == 0  # nothing reached the model
    assert lines(ran) == 0
    assert PAUSED in err
    assert PAUSED in out
