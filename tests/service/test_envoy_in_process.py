"""The gRPC listener in the daemon's own event loop (build_app's lifespan), where a test
can break what is under it: an unexpected error is answered INTERNAL and logged, and the
next request is served; a reused call_id is answered once."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3.ratelimit_pb2 import RateLimitDescriptor
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from ratewarden.clock import FakeClock
from ratewarden.store import MemoryStore
from tests.helpers.app import build_app, serving
from tests.helpers.hostenv import TERMINAL_POLICY
from tests.helpers.redis_server import free_port

OK = rls_pb2.RateLimitResponse.OK


class BreakingStore(MemoryStore):
    """A memory store whose next decision raises what no store should."""

    breaks = False

    async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        if self.breaks:
            self.breaks = False
            raise ZeroDivisionError("a bug under the listener")
        return await super().evaluate(*args, **kwargs)


def request(user: str, **entries: str) -> rls_pb2.RateLimitRequest:
    pairs = [("user", user), ("tool", "terminal"), *entries.items()]
    return rls_pb2.RateLimitRequest(
        domain="agents",
        descriptors=[
            RateLimitDescriptor(
                entries=[RateLimitDescriptor.Entry(key=k, value=v) for k, v in pairs]
            )
        ],
    )


async def test_an_unexpected_error_is_internal_and_the_next_request_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = BreakingStore(FakeClock())
    port = free_port()
    app = build_app(TERMINAL_POLICY, store, grpc_port=port)
    async with serving(app), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        store.breaks = True
        with (
            caplog.at_level(logging.ERROR, "ratewarden.envoy"),
            pytest.raises(grpc.aio.AioRpcError) as raised,
        ):
            await stub.ShouldRateLimit(request("in-1"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.INTERNAL
        assert "see its log" in (raised.value.details() or "")
        assert "ZeroDivisionError" in caplog.text  # the traceback, for the operator
        assert (await stub.ShouldRateLimit(request("in-1"), timeout=10)).overall_code == OK


async def test_a_repeated_call_id_counts_once() -> None:
    """Envoy's `request_headers` action can pass x-request-id as `call_id`: a retried
    request is then answered from the first decision, counted once."""
    port = free_port()
    app = build_app(TERMINAL_POLICY, grpc_port=port)
    async with serving(app) as http, grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for _ in range(3):
            answer = await stub.ShouldRateLimit(request("in-2", call_id="req-1"), timeout=10)
            assert answer.overall_code == OK
        usage = (await http.get("/v1/usage", params={"user": "in-2"})).json()
        assert usage["limits"][0]["used"] == 1


async def test_refusals_cannot_flood_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """A client that can send invalid requests at will gets one line per method and status
    every 10 s, its text escaped; the metric counts every one."""
    port = free_port()
    app = build_app(TERMINAL_POLICY, grpc_port=port)
    forged = RateLimitDescriptor(
        entries=[RateLimitDescriptor.Entry(key="user\nINFO forged", value="x")]
    )
    async with serving(app) as http, grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        with caplog.at_level(logging.WARNING, "ratewarden.envoy"):
            for _ in range(50):
                answer = await stub.ShouldRateLimit(
                    rls_pb2.RateLimitRequest(descriptors=[forged]), timeout=10
                )
                assert answer.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
        metrics = (await http.get("/metrics")).text
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1
    assert "\n" not in lines[0]
    assert "user\\nINFO forged" in lines[0]
    assert (
        'ratewarden_grpc_answers_total{code="INVALID_ARGUMENT",method="ShouldRateLimit"} 50.0'
        in metrics
    )
