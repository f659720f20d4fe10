"""Drive ratewarden's hermes plugin through hermes-agent's own hook machinery.

Run with the python of hermes' venv: `python hermes_hooks.py SCENARIO CONFIG.json`.
The environment gives HERMES_HOME (config.yaml enabling the plugin), RATEWARDEN_URL and
whatever the scenario needs; CONFIG holds `out` (where the JSON report goes), `counter`
(a file each terminal call appends a line to) and the scenario's numbers. hermes finds
the plugin by itself (its pip entry point, and directory plugins in $HERMES_HOME), and
every call goes through hermes' real dispatch: `model_tools.handle_function_call` runs
the terminal tool unless a pre_tool_call hook blocks it, and fires post_tool_call.
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

Scenario = Callable[[dict[str, Any]], dict[str, Any]]


def terminal_call(counter: str, n: int, **kwargs: Any) -> Any:
    """One terminal call through hermes' dispatch: the tool result the model would get."""
    import model_tools

    return json.loads(
        model_tools.handle_function_call(
            "terminal", {"command": f"echo call-{n} >> {counter}"}, **kwargs
        )
    )


def ratewarden_hooks() -> list[Any]:
    from hermes_cli.plugins import get_plugin_manager

    from ratewarden.integrations.hermes import RatewardenPlugin

    hooks = get_plugin_manager()._hooks.get("pre_tool_call", [])
    return [cb for cb in hooks if isinstance(getattr(cb, "__self__", None), RatewardenPlugin)]


def plugins() -> list[dict[str, Any]]:
    from hermes_cli.plugins import discover_plugins, get_plugin_manager

    discover_plugins()
    return [p for p in get_plugin_manager().list_plugins() if "ratewarden" in p["name"]]


def fail_mode(config: dict[str, Any]) -> dict[str, Any]:
    """The daemon is unreachable: one call through dispatch, and the shim's answer."""
    from hermes_cli.plugins import get_pre_tool_call_block_message

    found = plugins()
    result = terminal_call(config["counter"], 1, tool_call_id="call_1", session_id="s-1")
    message = get_pre_tool_call_block_message("terminal", {"command": "true"}, tool_call_id="c2")
    return {"plugins": found, "result": result, "shim_message": message}


def threads(config: dict[str, Any]) -> dict[str, Any]:
    """`threads` threads fire `calls` pre_tool_call hooks at once, then settle."""
    import model_tools  # noqa: F401  (registers hermes' tools, as in any hermes process)
    from gateway.session_context import set_session_vars
    from hermes_cli.plugins import get_pre_tool_call_block_message, invoke_hook

    found = plugins()
    n_threads, per_thread = config["threads"], config["calls_per_thread"]
    start = threading.Barrier(n_threads)
    allowed: list[str] = []
    blocked: list[str] = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        set_session_vars(platform="slack", user_id="U42")  # each gateway task binds its own
        start.wait()
        for i in range(per_thread):
            call_id = f"call_{t}_{i}"
            message = get_pre_tool_call_block_message(
                "terminal", {"command": "true"}, session_id="s-threads", tool_call_id=call_id
            )
            with lock:
                (allowed if message is None else blocked).append(message or call_id)
            if message is None:
                invoke_hook(
                    "post_tool_call",
                    tool_name="terminal",
                    args={"command": "true"},
                    result="{}",
                    session_id="s-threads",
                    tool_call_id=call_id,
                    duration_ms=3,
                    status="ok",
                )

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    [hook] = ratewarden_hooks()
    return {
        "plugins": found,
        "allowed": len(allowed),
        "blocked": blocked,
        "in_flight_after": len(hook.__self__._in_flight),
        "alive": sum(w.is_alive() for w in workers),
    }


def ask(config: dict[str, Any]) -> dict[str, Any]:
    """An `ask` rule: hermes' approval gate with no human, then with one who approves."""
    import os

    from tools.terminal_tool import set_approval_callback

    found = plugins()
    counter = config["counter"]
    results = [terminal_call(counter, 1, tool_call_id="call_1", session_id="s-ask")]
    # No interactive user, no gateway: hermes' gate refuses (fail-closed).
    results.append(terminal_call(counter, 2, tool_call_id="call_2", session_id="s-ask"))
    # An interactive CLI whose user answers "once".
    prompts: list[dict[str, Any]] = []

    def human(command: str, description: str, **kwargs: Any) -> str:
        prompts.append({"command": command, "description": description})
        return "once"

    os.environ["HERMES_INTERACTIVE"] = "1"
    set_approval_callback(human)
    results.append(terminal_call(counter, 3, tool_call_id="call_3", session_id="s-ask"))
    return {"plugins": found, "results": results, "prompts": prompts}


def duplicates(config: dict[str, Any]) -> dict[str, Any]:
    """The entry point plus directory copies named `ratewarden` and `ratewarden-copy`."""
    found = plugins()
    result = terminal_call(config["counter"], 1, tool_call_id="call_1", session_id="s-dup")
    return {"plugins": found, "hooks": len(ratewarden_hooks()), "result": result}


def digest(config: dict[str, Any]) -> dict[str, Any]:
    """Two identical terminal calls through hermes' dispatch, the plugin's guard answered
    `send_result` by the real daemon (send_result.py): the settles, and what the model
    got (the dispatch's result text, which post_tool_call passes as `result`)."""
    import model_tools
    from send_result import SendResult  # type: ignore[import-not-found,unused-ignore]

    from ratewarden.client import Guard

    found = plugins()
    [hook] = ratewarden_hooks()
    transport = SendResult()
    hook.__self__.guard = Guard(transport=transport)  # RATEWARDEN_URL, marked send_result
    results = [
        model_tools.handle_function_call(
            "terminal", {"command": "echo same"}, tool_call_id=f"call_{n}", session_id="s-dig"
        )
        for n in range(2)
    ]
    return {"plugins": found, "results": results, "settles": transport.settles}


SCENARIOS: dict[str, Scenario] = {
    "fail_mode": fail_mode,
    "threads": threads,
    "ask": ask,
    "duplicates": duplicates,
    "digest": digest,
}


def main() -> None:
    scenario, config_path = sys.argv[1], Path(sys.argv[2])
    config = json.loads(config_path.read_text())
    try:
        report = SCENARIOS[scenario](config)
    except Exception:
        report = {"error": traceback.format_exc()}
    Path(config["out"]).write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
