"""Envoy's rate limit service and external authorization, on a gRPC listener of the
daemon (docs/envoy.md). Off unless `RATEWARDEN_GRPC_PORT` is set; the protocols' stubs
and hpack (the `envoy` extra) are imported only then.

- calls.py: what a ShouldRateLimit or a Check asks about, as a `CheckRequest`;
- answers.py: a decision in each protocol's words;
- server.py: the two methods, their auth, and the listener (http/grpc.py carries them).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ratewarden.service.settings import Settings

log = logging.getLogger("ratewarden.envoy")
EXTRA = "--grpc-port (RATEWARDEN_GRPC_PORT) needs the envoy extra: pip install 'ratewarden[envoy]'"


def missing_extra() -> str | None:
    """Why the listener cannot start here (its packages are not installed), or None."""
    try:
        import envoy.service.auth.v3.external_auth_pb2
        import envoy.service.ratelimit.v3.rls_pb2  # noqa: F401
        import hpack  # noqa: F401
    except ImportError as exc:
        return f"{EXTRA} ({exc})"
    return None


@asynccontextmanager
async def listening(app: Any, settings: Settings) -> AsyncIterator[None]:
    """The gRPC listener while the block runs, when `settings.grpc_port` is set."""
    if settings.grpc_port is None:
        yield
        return
    problem = missing_extra()
    if problem is not None:
        raise RuntimeError(problem)
    from ratewarden.service.envoy.server import build

    server = build(app, settings)
    try:  # several workers share the port; one alone finds a busy port an error
        await server.start(settings.host, settings.grpc_port, reuse_port=settings.workers > 1)
    except OSError as exc:
        raise RuntimeError(f"cannot listen for gRPC on port {settings.grpc_port}: {exc}") from None
    log.info(
        "envoy: rate limit service and ext_authz on grpc://%s:%s", settings.host, settings.grpc_port
    )
    try:
        yield
    finally:
        await server.stop(grace=1.0)
