"""Drive terminal calls with chosen commands through hermes-agent, offline (issue 17).

Run with the python of hermes' venv: `python args_hermes.py CONFIG.json`. CONFIG holds
`mode`, `commands` (the terminal commands, in order), `user` (the gateway user id, for
the plugin) and `out` (where the JSON report goes). The environment gives HERMES_HOME,
whose config.yaml enables the plugin or declares the shell hooks, and RATEWARDEN_URL.

- `plugin`: ratewarden's plugin, found by hermes itself; each call goes through hermes'
  real dispatch (`model_tools.handle_function_call`), which runs the terminal tool unless
  a pre_tool_call hook blocks it.
- `shell`: `ratewarden hook hermes` as a shell hook, wired as hermes' CLI wires them at
  start-up, then the same dispatch.
- `loop`: the full `run_agent.AIAgent` loop against a fake chat-completions server that
  asks for one terminal call per turn, in the order of `commands` (hermes_loop.py's).

The report's `results` are the tool results the model gets, parsed, in order.
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from hermes_loop import MODEL, serve  # the fake chat-completions server, beside this file


def dispatch(commands: list[str]) -> list[Any]:
    """Each command through hermes' own tool dispatch, as one tool call of a model."""
    import model_tools

    results = []
    for n, command in enumerate(commands, 1):
        answer = model_tools.handle_function_call(
            "terminal",
            {"command": command},
            task_id="task-args",
            tool_call_id=f"call_{n}",
            session_id="sess-args",
            turn_id="turn-1",
            api_request_id=f"turn-1:api:{n}",
        )
        results.append(json.loads(answer))
    return results


def plugin(config: dict[str, Any]) -> dict[str, Any]:
    from gateway.session_context import set_session_vars
    from hermes_cli.plugins import discover_plugins

    discover_plugins()
    set_session_vars(platform="discord", user_id=config["user"])
    return {"results": dispatch(config["commands"])}


def shell(config: dict[str, Any]) -> dict[str, Any]:
    from agent.shell_hooks import register_from_config
    from hermes_cli.config import load_config

    registered = register_from_config(load_config(), accept_hooks=True)
    return {
        "registered": [spec.event for spec in registered],
        "results": dispatch(config["commands"]),
    }


class PlanModel:
    """Asks for terminal with each command of the plan, one per turn, then says it is done."""

    def __init__(self, commands: list[str]) -> None:
        self.commands = commands
        self.asked = 0
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests.append(body)
            if not body.get("tools") or self.asked >= len(self.commands):
                return {"role": "assistant", "content": "Done."}
            command = self.commands[self.asked]
            self.asked += 1
            n = self.asked
        call = {
            "id": f"call_fake_{n}",
            "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}


def loop(config: dict[str, Any]) -> dict[str, Any]:
    from gateway.session_context import set_session_vars
    from run_agent import AIAgent

    model = PlanModel(config["commands"])
    server = serve(model)  # type: ignore[arg-type]  # it only calls answer()
    try:
        set_session_vars(platform="discord", user_id=config["user"])
        agent = AIAgent(
            base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
            api_key="sk-fake",
            model=MODEL,
            provider="custom",
            quiet_mode=True,
            enabled_toolsets=["terminal"],
            skip_context_files=True,
            skip_memory=True,
        )
        result = agent.run_conversation("Run my commands, please.")
    finally:
        server.shutdown()
    last = [r for r in model.requests if r.get("tools")][-1]
    results = [json.loads(m["content"]) for m in last["messages"] if m["role"] == "tool"]
    return {"results": results, "asked": model.asked, "final": result.get("final_response")}


MODES = {"plugin": plugin, "shell": shell, "loop": loop}


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    try:
        report = MODES[config["mode"]](config)
    except Exception:
        report = {"error": traceback.format_exc()}
    Path(config["out"]).write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
