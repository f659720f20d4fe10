"""Drive hermes-agent's real agent loop offline, its model calls through ratewarden's
`llm_execution` middleware. Run with the python of hermes' venv:
`python hermes_models.py CONFIG.json`; CONFIG holds `counter` (a file each terminal call
appends a line to), `usage` (what the fake server reports for every answer, OpenAI's
names), `model` and `out` (where the report goes). The environment gives HERMES_HOME
(config.yaml enabling the plugin) and RATEWARDEN_URL.

The fake chat-completions server of hermes_loop.py answers every request with one
`terminal` call (it never runs out), so the loop ends only when a model call is refused:
its final response is then ratewarden's sentence.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hermes_loop import FakeModel, serve  # type: ignore[import-not-found,unused-ignore]


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    report: dict[str, Any] = {}
    model = FakeModel(Path(config["counter"]), 1_000)
    model.usage = config["usage"]  # type: ignore[attr-defined]
    server = serve(model)
    try:
        from gateway.session_context import set_session_vars
        from run_agent import AIAgent

        set_session_vars(platform="discord", user_id="1234", user_name="alice")
        agent = AIAgent(
            base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
            api_key="sk-fake",
            model=config["model"],
            provider="custom",
            quiet_mode=True,
            enabled_toolsets=["terminal"],
            skip_context_files=True,
            skip_memory=True,
            max_iterations=60,
        )
        started = time.monotonic()
        result = agent.run_conversation("Count with the terminal until you are stopped.")
        report["loop_seconds"] = time.monotonic() - started
        report["final_response"] = result.get("final_response")
    except Exception:
        report["error"] = traceback.format_exc()
    finally:
        server.shutdown()
    report["requests"] = len(model.requests)
    report["asked"] = model.asked
    Path(config["out"]).write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
