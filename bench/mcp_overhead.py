"""What `ratewarden mcp` adds to an MCP tool call (issue 19), over stdio and over HTTP.

One client (the MCP SDK's `ClientSession`) times sequential `tools/call`s of one tool
that answers at once (bench/mcp_server.py), four ways side by side:
- **stdio, direct**: the server as the client's subprocess;
- **stdio, proxy**: `ratewarden mcp --user bench -- <the server>`;
- **HTTP, direct**: the server on streamable HTTP;
- **HTTP, gateway**: `ratewarden mcp --listen …` with a token, fronting that server (URL
  upstream) and, on a second path, the same server as a command (command upstream).
Each guarded call is a real check and settle with a real `ratewarden serve` (memory store,
one rule matching every call). The sessions stay open and take turns, call by call, so
drift in the machine's speed falls on all of them alike. The gateway is measured twice:
fronting the server on HTTP (a second HTTP hop: URL upstream), and starting it per
session (command upstream). Reported: each way's median ms, and for each guarded way what
it adds to the direct call over the same transport, as a difference and a ratio. The
target: at most 2 ms more at the median.

    python -m bench.mcp_overhead --calls 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.hookstart import daemon
from bench.redis_server import free_port

POLICY = "version: 1\nrules:\n  - {name: per-user, per: [user], rate: 100000/minute}\n"
SERVER = str(Path(__file__).with_name("mcp_server.py"))
TOKEN = "bench-token-0123456789abcdef"
WAYS = ("stdio direct", "stdio proxy", "http direct", "http gateway", "http gateway (command)")


def measure(calls: int = 1000) -> dict[str, Any]:
    """Median ms of a tools/call each way, and what the guard adds per transport."""
    with tempfile.TemporaryDirectory(prefix="ratewarden-mcp-bench-") as tmp:
        return asyncio.run(_measure(Path(tmp), calls))


async def _measure(workdir: Path, calls: int) -> dict[str, Any]:
    from mcp.client.session import ClientSession

    with daemon(workdir, POLICY) as url, _http_pair(workdir, url) as (direct_url, gateway_url):
        async with contextlib.AsyncExitStack() as stack:
            streams = {
                "stdio direct": await stack.enter_async_context(_stdio([sys.executable, SERVER])),
                "stdio proxy": await stack.enter_async_context(
                    _stdio([_ratewarden(), "mcp", "--user", "bench", "--url", url, "--",
                            sys.executable, SERVER])
                ),
                "http direct": await stack.enter_async_context(_http(direct_url, None)),
                "http gateway": await stack.enter_async_context(_http(gateway_url, TOKEN)),
                "http gateway (command)": await stack.enter_async_context(
                    _http(gateway_url.replace("/bench/", "/local/"), TOKEN)
                ),
            }  # fmt: skip
            sessions = {}
            for way, (read, write) in streams.items():
                sessions[way] = await stack.enter_async_context(ClientSession(read, write))
                await sessions[way].initialize()
            timed: dict[str, list[float]] = {way: [] for way in WAYS}
            for n in range(-20, calls):  # the first 20: a warm-up
                for way in WAYS:
                    started = time.perf_counter()
                    result = await sessions[way].call_tool("echo", {"text": f"call {n}"})
                    elapsed = (time.perf_counter() - started) * 1000
                    if result.is_error:
                        raise RuntimeError(f"{way}: the call was refused: {result.content}")
                    if n >= 0:
                        timed[way].append(elapsed)
    medians = {way: statistics.median(times) for way, times in timed.items()}
    report: dict[str, Any] = {"calls": calls, "median_ms": medians}
    for guarded in WAYS:
        if "direct" not in guarded:
            direct = medians[f"{guarded.split()[0]} direct"]
            report[guarded] = {
                "added_ms": medians[guarded] - direct,
                "ratio": medians[guarded] / direct,
            }
    return report


def _ratewarden() -> str:
    return str(Path(sys.executable).with_name("ratewarden"))


@contextlib.asynccontextmanager
async def _stdio(command: list[str]) -> AsyncIterator[Any]:
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    async with stdio_client(params) as streams:
        yield streams


@contextlib.asynccontextmanager
async def _http(url: str, token: str | None) -> AsyncIterator[Any]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


@contextlib.contextmanager
def _http_pair(workdir: Path, daemon_url: str) -> Iterator[tuple[str, str]]:
    """The server on streamable HTTP, and the gateway in front of it: their MCP URLs."""
    tokens = workdir / "tokens.yaml"
    tokens.write_text(f"bench: {TOKEN}\n")
    server_port, gateway_port = free_port(), free_port()
    direct = f"http://127.0.0.1:{server_port}/mcp"
    with contextlib.ExitStack() as stack:
        stack.enter_context(_process([sys.executable, SERVER, "--http", str(server_port)], direct))
        gateway = [
            _ratewarden(), "mcp", "--listen", f"127.0.0.1:{gateway_port}",
            "--server", f"bench={direct}", "--server", f"local={sys.executable} {SERVER}",
            "--tokens", str(tokens), "--url", daemon_url,
        ]  # fmt: skip
        stack.enter_context(_process(gateway, f"http://127.0.0.1:{gateway_port}/healthz"))
        yield direct, f"http://127.0.0.1:{gateway_port}/bench/mcp"


@contextlib.contextmanager
def _process(command: list[str], ready: str) -> Iterator[subprocess.Popen[bytes]]:
    """`command` started, once `ready` answers (then yielded); stopped after."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[:3]} exited with {process.returncode}")
            try:
                urllib.request.urlopen(ready, timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # it answers (an MCP endpoint refuses a bare GET)
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{command[:3]} did not answer in 30 s") from None
                time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


def report(results: dict[str, Any]) -> list[str]:
    """The Markdown table of one run: each way's median, and what the guard added."""
    lines = ["| way | median ms | added ms | ratio |", "|---|---|---|---|"]
    for way, median in results["median_ms"].items():
        added = results.get(way)
        shown = "- | -" if added is None else f"{added['added_ms']:.2f} | {added['ratio']:.2f}"
        lines.append(f"| {way} | {median:.2f} | {shown} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_overhead")
    parser.add_argument("--calls", type=int, default=1000, help="calls each way (default 1000)")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    print(json.dumps(measure(args.calls), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
