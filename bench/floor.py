"""The two reference servers ratewarden is measured against, on the same uvicorn settings.

- `floor`: the naive guard. A minimal FastAPI app whose handler parses the same JSON body
  and makes one EVALSHA of a trivial script: what any daemon that asks Redis once per
  request costs at least.
- `echo`: a bare FastAPI app that parses the body and sends it back, no Redis: what the
  web stack alone costs.

    python -m bench.floor floor --port 9000 --store-url redis://127.0.0.1:6400/0
    python -m bench.floor echo --port 9001
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

TRIVIAL_SCRIPT = "return 1"


def floor_app(store_url: str) -> FastAPI:
    client = aioredis.Redis.from_url(store_url)
    sha = ""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal sha
        sha = await client.script_load(TRIVIAL_SCRIPT)
        yield
        await client.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/check")
    async def check(request: Request) -> JSONResponse:
        body: dict[str, Any] = await request.json()
        await client.evalsha(sha, 1, f"floor:{{{body['user']}}}", body["tool"])
        return JSONResponse({"decision": "allow", "allowed": True, "message": ""})

    return app


def echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/check")
    async def check(request: Request) -> JSONResponse:
        return JSONResponse(await request.json())

    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("kind", choices=["floor", "echo"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    app = floor_app(args.store_url) if args.kind == "floor" else echo_app()
    # The settings `ratewarden serve` runs uvicorn with (cli._run_uvicorn).
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_config=None, access_log=False)


if __name__ == "__main__":
    main()
