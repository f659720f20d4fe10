"""A scripted OpenAI Responses API on 127.0.0.1, enough for the real Codex CLI.

Codex takes a custom provider from its config.toml (`model_providers.<id>.base_url`,
`wire_api = "responses"`) and streams `POST <base_url>/responses` (server-sent events).
The fake model asks for its shell tool (`exec_command`, which Codex's hooks call `Bash`)
with one command, `calls` times in a row (one call per response, or `parallel` at once:
Codex runs those at the same time), then ends its turn with "done". Every tool result
Codex sends back is recorded by call id, so a test reads what the model was told; and in
the order of the conversation, for a model that gives every call the same id
(`same_id`: `call_0`, as several local and open-model servers do).
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.fake_api import FakeApiHandler, serving_api

SHELL_TOOL = "exec_command"


@dataclass
class FakeModel:
    command: str
    calls: int
    call_ids: list[str] = field(default_factory=list)  # in the order they were asked
    same_id: str | None = None  # every call's id, else a fresh one per call
    parallel: int = 1  # calls per response
    tool_results: dict[str, str] = field(default_factory=dict)  # call id -> output
    outputs: list[str] = field(default_factory=list)  # every tool output so far, in order
    offered: list[list[str | None]] = field(default_factory=list)  # tool names, per request
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The output items of the next response."""
        with self.lock:
            outputs = [
                item
                for item in body.get("input") or []
                if isinstance(item, dict) and item.get("type") == "function_call_output"
            ]
            for item in outputs:
                self.tool_results[item["call_id"]] = _text(item.get("output"))
            self.outputs = [_text(item.get("output")) for item in outputs]  # the whole history
            tools = [tool.get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)]
            self.offered.append(tools)
            if SHELL_TOOL not in tools or len(self.call_ids) >= self.calls:
                return [_message("done")]
            count = min(self.parallel, self.calls - len(self.call_ids))
            call_ids = [self.same_id or f"call_{uuid.uuid4().hex[:16]}" for _ in range(count)]
            self.call_ids.extend(call_ids)
        return [self._call(call_id) for call_id in call_ids]

    def _call(self, call_id: str) -> dict[str, Any]:
        arguments = json.dumps({"cmd": self.command})
        return {
            "type": "function_call",
            "call_id": call_id,
            "name": SHELL_TOOL,
            "arguments": arguments,
        }


def _message(text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text}]
    return {
        "type": "message",
        "role": "assistant",
        "id": f"msg_{uuid.uuid4().hex}",
        "content": content,
    }


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):  # content items
        return "\n".join(str(part.get("text", "")) for part in output if isinstance(part, dict))
    return json.dumps(output)


def _events(items: list[dict[str, Any]]) -> bytes:
    """One response, as the streaming API sends it."""
    response_id = f"resp_{uuid.uuid4().hex}"
    usage = {
        "input_tokens": 10,
        "input_tokens_details": None,
        "output_tokens": 1,
        "output_tokens_details": None,
        "total_tokens": 11,
    }
    events = [
        {"type": "response.created", "response": {"id": response_id}},
        *({"type": "response.output_item.done", "item": item} for item in items),
        {"type": "response.completed", "response": {"id": response_id, "usage": usage}},
    ]
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def _handler(fake: FakeModel) -> type[FakeApiHandler]:
    class Handler(FakeApiHandler):
        def post(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            if self.path.rstrip("/").endswith("/responses"):
                self.reply(200, "text/event-stream", _events(fake.answer(body)))
            else:
                self.reply(404, "application/json", b"{}")

    return Handler


@contextlib.contextmanager
def fake_responses_api(
    command: str, calls: int, same_id: str | None = None, parallel: int = 1
) -> Iterator[tuple[str, FakeModel]]:
    """Serve the fake model on a free loopback port; yields (base URL ending in /v1, model)."""
    fake = FakeModel(command, calls, same_id=same_id, parallel=parallel)
    with serving_api(_handler(fake)) as url:
        yield f"{url}/v1", fake
