"""Drive a real CrewAI Crew's model calls, offline, through RatewardenHooks.

Runs inside the crewai host venv (tests/helpers/hostenv.py), never in the main one:

    python crewai_models.py '{"work": ..., "user": ..., "usage": {...}, "fail_at": N}'

(RATEWARDEN_URL in the environment.) One `crew.kickoff` of a one-agent, one-task Crew
whose LLM is CrewAI's own OpenAI provider (`LLM(model="openai/gpt-4o", max_tokens=8000)`)
talking to a fake chat-completions server on 127.0.0.1 that answers every request with
one `terminal` tool call and reports `usage` (OpenAI's names). `fail_at`: from that
answer on, the server answers 500 (the SDK's retries too), so that model call fails.
The tool is a CrewAI `@tool` that appends a line to a file, so the test counts what
really ran. The last line of stdout is a JSON report:
the requests the server answered, the tool runs, and the kickoff's output or the
exception it raised (a ratewarden refusal is CrewAI's HookAborted, its `reason` ours).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

for _name in ("CREWAI_DISABLE_TELEMETRY", "CREWAI_DISABLE_TRACKING", "OTEL_SDK_DISABLED"):
    os.environ[_name] = "true"
os.environ["CREWAI_DISABLE_VERSION_CHECK"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"

from crewai import LLM, Agent, Crew, Task  # noqa: E402
from crewai.events import crewai_event_bus  # noqa: E402
from crewai.hooks import HookAborted  # noqa: E402
from crewai.tools import tool  # noqa: E402

from ratewarden.integrations.crewai import RatewardenHooks  # noqa: E402


@tool("terminal")
def terminal(command: str) -> str:
    """Run a shell command (recorded, not executed)."""
    with Path(os.environ["RAN_FILE"]).open("a") as out:
        out.write(command + "\n")
    return f"ran {command}"


class Server:
    """A chat-completions server: a terminal call per request, reporting `usage`."""

    def __init__(self, usage: dict[str, Any], fail_at: int | None) -> None:
        self.usage, self.fail_at = usage, fail_at
        self.answered = 0
        self.lock = threading.Lock()

    def serve(self) -> ThreadingHTTPServer:
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                with host.lock:
                    turn = host.answered
                    down = host.fail_at is not None and turn >= host.fail_at
                    host.answered += 0 if down else 1
                if down:  # from then on (the SDK's retries too): the call fails
                    self._json({"error": {"message": "the provider is down"}}, 500)
                    return
                call = {
                    "id": f"call_{turn}",
                    "type": "function",
                    "function": {
                        "name": "terminal",
                        "arguments": json.dumps({"command": f"echo {turn}"}),
                    },
                }
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                self._json(
                    {
                        "id": f"chatcmpl-{time.monotonic_ns()}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": "gpt-4o",
                        "choices": [
                            {"index": 0, "message": message, "finish_reason": "tool_calls"}
                        ],
                        "usage": host.usage,
                    }
                )

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


class NoModelSettle(RatewardenHooks):
    """The negative control: checks model calls, never settles them."""

    def llm_call_finished(self, source: Any, event: Any) -> None:
        return None


def main(config: dict[str, Any]) -> dict[str, Any]:
    ran = Path(config["work"]) / "ran.txt"
    ran.touch()
    os.environ["RAN_FILE"] = str(ran)
    model = Server(config["usage"], config.get("fail_at"))
    server = model.serve()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    llm = LLM(model="openai/gpt-4o", base_url=base_url, api_key="sk-fake", max_tokens=8000)
    agent = Agent(
        role="operator",
        goal="run what you are asked to",
        backstory="a careful operator",
        llm=llm,
        tools=[terminal],
        max_iter=60,
        max_retry_limit=0,
    )
    task = Task(description="Run commands.", expected_output="done", agent=agent)
    hooks_type = NoModelSettle if config.get("settle") is False else RatewardenHooks
    found: dict[str, Any] = {"output": None, "refusal": None, "error": None}
    with hooks_type(fail=config.get("fail")):
        crew = Crew(agents=[agent], tasks=[task])
        try:
            inputs = {"user_id": config["user"]}
            if config.get("use_async"):  # CrewAI's async path: the same hooks, awaited LLM
                output = asyncio.run(crew.akickoff(inputs=inputs))
            else:
                output = crew.kickoff(inputs=inputs)
            found["output"] = str(output)
        except HookAborted as refused:
            found["refusal"] = refused.reason
        except Exception as exc:
            found["error"] = f"{type(exc).__name__}: {exc}"
        crewai_event_bus.flush()
    server.shutdown()
    found["requests"] = model.answered
    found["ran"] = len(ran.read_text().splitlines())
    return found


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
