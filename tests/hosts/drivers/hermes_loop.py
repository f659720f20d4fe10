"""Drive hermes-agent's real agent loop offline, with ratewarden's plugin loaded.

Run with the python of hermes' venv: `python hermes_loop.py CONFIG.json`. CONFIG holds
`mode` ("entrypoint" or "directory"), `counter` (a file each terminal call appends a
line to), `tool_calls` (how many times the fake model asks for terminal) and `out`
(where the report goes). The environment gives HERMES_HOME (config.yaml enabling the
plugin) and RATEWARDEN_URL.

A fake OpenAI-compatible chat-completions server on 127.0.0.1 (a free port) answers
every main-loop request with one `terminal` call until it has asked `tool_calls` times,
then with a final text; it records every request's messages for the test to read.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "fake-model"


class FakeModel:
    def __init__(self, counter: Path, tool_calls: int) -> None:
        self.counter = counter
        self.tool_calls = tool_calls
        self.asked = 0
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The assistant message for one chat-completions request."""
        with self.lock:
            self.requests.append(body)
            if not body.get("tools") or self.asked >= self.tool_calls:
                return {"role": "assistant", "content": "Done counting."}
            self.asked += 1
            n = self.asked
        command = f"echo call-{n} >> {self.counter}"
        call = {
            "id": f"call_fake_{n}",
            "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}


def serve(model: FakeModel) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._json({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            else:
                self._json({"error": {"message": "not found"}}, 404)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json({"error": {"message": f"not found: {self.path}"}}, 404)
                return
            message = model.answer(body)
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            usage = getattr(model, "usage", None) or {
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "total_tokens": 15,
            }
            if body.get("stream"):
                self._stream(message, finish, usage)
                return
            self._json(
                {
                    "id": f"chatcmpl-{time.monotonic_ns()}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )

        def _stream(self, message: dict[str, Any], finish: str, usage: dict[str, int]) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            if message.get("tool_calls"):
                delta["tool_calls"] = [
                    {"index": i, **call} for i, call in enumerate(message["tool_calls"])
                ]
            base = {
                "id": f"chatcmpl-{time.monotonic_ns()}",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": MODEL,
            }
            chunks = [
                {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                {**base, "choices": [], "usage": usage},
            ]
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _json(self, payload: dict[str, Any], status: int = 200) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def hide_ratewarden_entry_point() -> None:
    """Directory mode: hermes must find ratewarden only in $HERMES_HOME/plugins.

    ratewarden is pip-installed in this venv, so its entry point exists, and hermes keeps
    one plugin per name, preferring the entry point. Hiding it from hermes' scan leaves
    the directory plugin as the only `ratewarden`, as on a machine where ratewarden is
    importable but not installed with its entry point.
    """
    from hermes_cli.plugins import PluginManager

    scan = PluginManager._scan_entry_points

    def without_ratewarden(self: Any) -> list[Any]:
        return [m for m in scan(self) if m.name != "ratewarden"]

    PluginManager._scan_entry_points = without_ratewarden  # type: ignore[method-assign]


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    report: dict[str, Any] = {}
    model = FakeModel(Path(config["counter"]), config["tool_calls"])
    server = serve(model)
    try:
        if config["mode"] == "directory":
            hide_ratewarden_entry_point()
        from gateway.session_context import set_session_vars
        from run_agent import AIAgent

        # What the gateway does for each incoming message: bind the session's identity.
        set_session_vars(platform="discord", user_id="1234", user_name="alice")
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
        started = time.monotonic()
        result = agent.run_conversation("Count to eleven with the terminal, please.")
        report["loop_seconds"] = time.monotonic() - started
        report["final_response"] = result.get("final_response")

        from hermes_cli.plugins import get_plugin_manager

        manager = get_plugin_manager()
        report["plugins"] = manager.list_plugins()
        report["pre_tool_call_hooks"] = len(manager._hooks.get("pre_tool_call", []))
    except Exception:
        report["error"] = traceback.format_exc()
    finally:
        server.shutdown()
    report["requests"] = model.requests
    report["asked"] = model.asked
    Path(config["out"]).write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
