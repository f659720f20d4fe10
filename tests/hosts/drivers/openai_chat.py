"""A scripted OpenAI-compatible chat completions API on 127.0.0.1: the provider behind a
LiteLLM proxy in its host test.

`POST /v1/chat/completions` (or `/chat/completions`) answers "ok" with the usage it was
given, in OpenAI's names (`prompt_tokens` counts every input token, cached ones included;
`prompt_tokens_details.cached_tokens` the cached part), or, with `stream: true`, the same
answer as server-sent events whose last chunk carries the usage (as OpenAI, only when
`stream_options.include_usage` asks for it). While `fail` is set it
answers 500, as a provider that broke. It records what reached it (`requests`), so a test
can tell a request the proxy refused from one the provider answered.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.fake_api import FakeApiHandler, serving_api


@dataclass
class FakeProvider:
    usage: dict[str, int]  # input_tokens, output_tokens, cache_read_tokens
    fail: bool = False  # answer 500 while set
    fail_next: int = 0  # answer 500 to this many requests, then answer again
    requests: list[dict[str, Any]] = field(default_factory=list)  # the bodies received
    lock: threading.Lock = field(default_factory=threading.Lock)

    def openai_usage(self) -> dict[str, Any]:
        prompt, completion = self.usage["input_tokens"], self.usage["output_tokens"]
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.usage.get("cache_read_tokens", 0)},
        }


def _completion(body: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "gpt-4o"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }


def _chunks(body: dict[str, Any], usage: dict[str, Any]) -> list[dict[str, Any]]:
    base = {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "gpt-4o"),
    }
    delta = {"role": "assistant", "content": "ok"}
    return [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**base, "choices": [], "usage": usage},
    ]


def _handler(fake: FakeProvider) -> type[FakeApiHandler]:
    class Handler(FakeApiHandler):
        protocol_version = "HTTP/1.1"

        def post(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            with fake.lock:
                fake.requests.append(body)
                failing = fake.fail or fake.fail_next > 0
                fake.fail_next = max(0, fake.fail_next - 1)
            if failing:
                error = {"error": {"message": "the provider broke", "type": "server_error"}}
                self.reply(500, "application/json", json.dumps(error).encode())
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self.reply(404, "application/json", b'{"error": {"message": "no such path"}}')
                return
            if body.get("stream"):
                chunks = _chunks(body, fake.openai_usage())
                if not (body.get("stream_options") or {}).get("include_usage"):
                    chunks = chunks[:-1]  # as OpenAI: a stream's usage only when asked for
                events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
                self.reply(200, "text/event-stream", (events + "data: [DONE]\n\n").encode())
                return
            answer = _completion(body, fake.openai_usage())
            self.reply(200, "application/json", json.dumps(answer).encode())

        def get(self) -> None:
            self.reply(200, "application/json", b'{"object": "list", "data": []}')

    return Handler


@contextlib.contextmanager
def fake_openai_api(usage: dict[str, int]) -> Iterator[tuple[str, FakeProvider]]:
    """The fake provider's base URL (`.../v1`) and its state, until the block ends."""
    fake = FakeProvider(usage=dict(usage))
    with serving_api(_handler(fake)) as url:
        yield f"{url}/v1", fake
