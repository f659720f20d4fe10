"""Spend a user's budget through a real LangChain v1 agent, offline; print what it saw.

Runs inside the langchain host venv (tests/helpers/hostenv.py), never in the main one:

    python langchain_budget.py '{"url": URL, "work": DIR, "user": "alice", "calls": 5}'

The service of docs/integrations.md's "One budget across surfaces": a `create_agent`
loop with `RatewardenMiddleware()` built from the environment (RATEWARDEN_URL), the user
in the run's context. The agent, its scripted model and its `terminal` tool (which
appends a line to a file per call that ran) are the LangChain host test's own
(langchain_agent.py, beside this file). The last line of stdout is a JSON report:
{"results": [what the model read, per call], "ran": N, "errors": [...], "output": ...}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import langchain_agent as agent  # the sibling driver: scripted model, recorded tools

from ratewarden.integrations.langchain import RatewardenMiddleware


def spend(config: dict[str, Any]) -> dict[str, Any]:
    agent.WORK = Path(config["work"])
    os.environ["RATEWARDEN_URL"] = config["url"]
    report: dict[str, Any] = agent.run_sync(
        "budget",
        agent.terminal_plan(int(config["calls"])),
        RatewardenMiddleware(),
        context={"user_id": config["user"]},
    )
    return report


if __name__ == "__main__":
    print(json.dumps(spend(json.loads(sys.argv[1]))))
