"""Drive the FastAPI app in-process: its lifespan runs, requests go through httpx's ASGI
transport, and time is whatever clock the store was given (no sockets, no sleeps)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from ratewarden.clock import FakeClock
from ratewarden.policy import parse_policy
from ratewarden.service.app import Daemon, create_app
from ratewarden.service.settings import Settings
from ratewarden.store import MemoryStore, Store


def build_app(
    policy_text: str,
    store: Store | None = None,
    clock: FakeClock | None = None,
    *,
    hot: bool = True,
    **settings: Any,
) -> FastAPI:
    """An app on `policy_text`, with `store` (default: a memory store on `clock`).

    `settings` override the defaults below; `hot=False` sends every request through
    FastAPI's whole stack (no hot path in front).
    """
    if store is None:
        store = MemoryStore(clock or FakeClock())
    # Explicit values, so a RATEWARDEN_* variable in the test environment changes nothing.
    values: dict[str, Any] = {"store_url": "memory://", "fail": None, "store_timeout_ms": 100}
    app = create_app(
        Settings(**(values | settings)), store=store, policy=parse_policy(policy_text.encode())
    )
    if not hot:
        assert isinstance(app, Daemon)
        app.front = None
    return app


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and yield a client talking to it in-process."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def assert_error_shape(body: Any) -> None:
    """Every refusal: {"error": str, "message": str, "fields": [{"field", "message"}]}."""
    assert isinstance(body, dict), body
    assert set(body) == {"error", "message", "fields"}, body
    assert isinstance(body["error"], str)
    assert body["error"]
    assert isinstance(body["message"], str)
    assert body["message"]
    assert isinstance(body["fields"], list)
    for entry in body["fields"]:
        assert set(entry) == {"field", "message"}, entry
        assert isinstance(entry["field"], str)
        assert entry["field"]
        assert isinstance(entry["message"], str)
        assert entry["message"]
