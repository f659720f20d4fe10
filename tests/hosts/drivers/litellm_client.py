"""Requests from the real OpenAI client to a LiteLLM proxy: the application side of the
LiteLLM host test. Its one argument is JSON: `url` (the proxy's /v1) and `calls`, each
`{key, max_tokens, user?, stream?, text?}`. It prints one JSON line, `{"answers": [...]}`,
per call either `{"ok": true, "usage": {...}}` or `{"ok": false, "status": N, "class":
<the SDK's error class>, "type": ..., "message": <the error's message>, "retry_after":
<the header>}`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import openai  # type: ignore[import-not-found,unused-ignore]


def call(url: str, spec: dict[str, Any]) -> dict[str, Any]:
    client = openai.OpenAI(base_url=url, api_key=spec["key"], max_retries=0, timeout=60)
    extra: dict[str, Any] = {"user": spec["user"]} if spec.get("user") else {}
    messages = [{"role": "user", "content": spec.get("text", "Say ok.")}]
    try:
        if spec.get("stream"):
            stream = client.chat.completions.create(
                model=spec.get("model", "gpt-4o"),
                messages=messages,  # type: ignore[arg-type]
                max_tokens=spec["max_tokens"],
                stream=True,
                stream_options={"include_usage": True},
                **extra,
            )
            usage = None
            for chunk in stream:
                usage = chunk.usage or usage
            return {"ok": True, "usage": usage.model_dump() if usage else None}
        answer = client.chat.completions.create(
            model=spec.get("model", "gpt-4o"),
            messages=messages,  # type: ignore[arg-type]
            max_tokens=spec["max_tokens"],
            **extra,
        )
        return {"ok": True, "usage": answer.usage.model_dump() if answer.usage else None}
    except openai.APIStatusError as error:
        body = error.body if isinstance(error.body, dict) else {}
        return {
            "ok": False,
            "status": error.status_code,
            "class": type(error).__name__,
            "type": body.get("type"),
            "message": body.get("message"),
            "retry_after": error.response.headers.get("retry-after"),
        }


def main() -> None:
    config = json.loads(sys.argv[1])
    print(json.dumps({"answers": [call(config["url"], spec) for spec in config["calls"]]}))


if __name__ == "__main__":
    main()
