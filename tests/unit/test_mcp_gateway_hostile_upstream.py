"""A URL upstream that answers with an endless head, behind the gateway: the SDK's own
client gets a JSON-RPC error naming the cap, and the gateway's memory stays bounded
(http/keepalive.py reads at most `MAX_ANSWER_HEAD_BYTES` of a head)."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator

import pytest
from mcp.shared.exceptions import MCPError

from ratewarden.http.head import MAX_ANSWER_HEAD_BYTES
from ratewarden.mcp.upstream import Upstream
from tests.unit.test_mcp_gateway_upstream_headers import client, gateway_to

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def endless_heads() -> AsyncIterator[str]:
    """A server that answers every request with a header after header, for ever."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n")
        n = 0
        with contextlib.suppress(ConnectionError):
            while not reader.at_eof():
                writer.write(b"".join(b"x-%d: v\r\n" % (n + i) for i in range(2000)))
                n += 2000
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_an_upstream_with_an_endless_head_is_an_error_not_a_memory_leak() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    async with endless_heads() as upstream_url:
        upstream = Upstream.parse(f"endless={upstream_url}/mcp")
        async with gateway_to(upstream) as url:
            with pytest.raises(BaseExceptionGroup) as refused:  # the SDK's task groups
                async with client(url, "legacy") as alice:
                    await alice.list_tools()
    assert refused.group_contains(MCPError, match=f"head passed {MAX_ANSWER_HEAD_BYTES} bytes")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, grown_mb  # before the cap: 400 MB in 5 s, until the 30 s timeout
