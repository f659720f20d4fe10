"""Drive `ratewarden hook hermes` through hermes-agent's own shell-hook machinery.

Run with the python of hermes' venv: `python hermes_shell_hook.py OUT.json COUNTER CALLS`.
HERMES_HOME holds a config.yaml whose `hooks:` block runs the command. As hermes' CLI
does at start-up, `register_from_config(load_config(), accept_hooks=True)` wires the
hooks, then each call goes through hermes' real dispatch
(`model_tools.handle_function_call`): the pre_tool_call shell hook may block it, the
terminal tool runs otherwise (appending a line to COUNTER), and post_tool_call fires.
The model's tool_call_id is `call_0` every time, as some model servers send it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    out, counter, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import model_tools
    from agent.shell_hooks import register_from_config
    from hermes_cli.config import load_config

    registered = register_from_config(load_config(), accept_hooks=True)
    results = []
    for n in range(calls):
        answer = model_tools.handle_function_call(
            "terminal",
            {"command": f"echo call-{n} >> {counter}"},
            task_id="task-1",
            tool_call_id="call_0",
            session_id="sess-shell",
            turn_id="turn-1",
            api_request_id=f"turn-1:api:{n}",
        )
        results.append(json.loads(answer))
    report = {"registered": [spec.event for spec in registered], "results": results}
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
