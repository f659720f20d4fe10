"""Worst bodies at the MCP gateway (issue 25, item 7): what the costliest requests within
its caps cost `ratewarden mcp --listen`, next to a normal `tools/call` relay.

One gateway fronts bench/mcp_server.py as a command, in front of a real daemon (memory
store, one rule matching every call). Over one open session, on one kept-alive
connection, each body is POSTed again and again; the gateway's own CPU time (its process
alone, not the server's) is divided by the requests it answered. A normal `tools/call`
of `echo` is measured the same way in the same run, and each body's cost is given as a
multiple of it (the target: the worst at most 10).

    python -m bench.mcp_worstbody --requests 200
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.hookstart import daemon
from bench.mcp_overhead import POLICY, SERVER, TOKEN, _process, _ratewarden
from bench.procstat import cpu_seconds
from bench.redis_server import free_port
from ratewarden.mcp.cli import DEFAULT_MAX_BODY as MAX_BODY
from ratewarden.mcp.gateway import MAX_DEPTH
from ratewarden.wire.bounded import MAX_ITEMS, count_items

TARGET = 10.0  # the worst body's cost, in normal tools/call relays
NORMAL = "tools/call (normal)"
ROOM = 256  # bytes under the body cap: never a 413 for its size
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def call(arguments: dict[str, Any]) -> bytes:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "echo", "arguments": {"text": "x", **arguments}}}  # fmt: skip
    return json.dumps(message, separators=(",", ":")).encode()


def filled(body: bytes, unit: str, end: str = "") -> bytes:
    """`body` with its `@` replaced by `unit` as often as fits under the body cap, then
    `end`."""
    room = MAX_BODY - ROOM - len(body) - len(end)
    return body.replace(b"@", unit.encode() * (room // len(unit)) + end.encode(), 1)


def keys_at_item_cap() -> bytes:
    """A call with as many `pad` keys as the item cap allows, the last a string `@`."""
    keys = {f"k{n}": 0 for n in range(MAX_ITEMS - count_items(call({"pad": {}})))}
    return call({"pad": {**keys, "s": "@"}})


# name -> the body; the worst of each kind found so far. Over a cap: refused unread (413).
BODIES: dict[str, Callable[[], bytes]] = {
    NORMAL: lambda: call({}),
    "1 MB of 500 000 small items": lambda: call({"pad": [0] * 500_000}),
    "1 MiB of empty arrays": lambda: filled(
        call({"pad": ["@"]}).replace(b'"@"', b"@"), "[],", "[]"
    ),
    f"arrays {MAX_DEPTH + 1} levels deep": lambda: call({"pad": "@"}).replace(
        b'"@"', b"[" * (MAX_DEPTH - 2) + b"]" * (MAX_DEPTH - 2)
    ),
    "1 MiB of escaped quotes in a string (relayed)": lambda: filled(call({"pad": "@"}), '\\"'),
    "1 MiB of \\u escapes in a string (relayed)": lambda: filled(call({"pad": "@"}), "\\u00e9"),
    "4 000 items, then 1 MiB of escaped commas (relayed)": lambda: filled(
        keys_at_item_cap(), '\\",,,,,,,'
    ),
}


@contextlib.contextmanager
def gateway(workdir: Path) -> Iterator[tuple[int, int]]:
    """The gateway fronting bench/mcp_server.py as a command: its port and process id."""
    (workdir / "tokens.yaml").write_text(f"bench: {TOKEN}\n")
    port = free_port()
    with daemon(workdir, POLICY) as url:
        command = [
            _ratewarden(), "mcp", "--listen", f"127.0.0.1:{port}",
            "--server", f"local={sys.executable} {SERVER}",
            "--tokens", str(workdir / "tokens.yaml"), "--url", url,
        ]  # fmt: skip
        with _process(command, f"http://127.0.0.1:{port}/healthz") as process:
            yield port, process.pid


class Session:
    """One raw MCP session on one kept-alive connection."""

    def __init__(self, port: int) -> None:
        self.http = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {**HEADERS, "Authorization": f"Bearer {TOKEN}"}
        init = {"protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"}}  # fmt: skip
        self.post(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}))
        self.headers["mcp-session-id"] = self.session_id
        self.headers["mcp-protocol-version"] = "2025-11-25"
        self.post(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    def post(self, body: bytes | str) -> int:
        self.http.request("POST", "/local/mcp", body, self.headers)
        answer = self.http.getresponse()
        self.session_id = answer.getheader("mcp-session-id") or ""
        answer.read()
        return answer.status


def cost(session: Session, pid: int, body: bytes, requests: int) -> dict[str, Any]:
    """The gateway's CPU per request, `body` sent `requests` times (after a few)."""
    statuses: dict[str, int] = {}
    for _ in range(3):
        session.post(body)
    before = cpu_seconds([pid])
    for _ in range(requests):
        status = str(session.post(body))
        statuses[status] = statuses.get(status, 0) + 1
    after = cpu_seconds([pid])
    if before is None or after is None:
        raise RuntimeError("no CPU time to read (this measures on Linux)")
    return {"bytes": len(body), "statuses": statuses, "cpu_us": (after - before) / requests * 1e6}


def measure(requests: int = 200) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="ratewarden-mcp-worst-") as tmp,
        gateway(Path(tmp)) as (port, pid),
    ):
        session = Session(port)
        session.post(call({}))  # the server starts (lazily) before anything is measured
        rows = {name: cost(session, pid, make(), requests) for name, make in BODIES.items()}
    normal = rows[NORMAL]["cpu_us"]
    if normal <= 0:  # /proc counts CPU in ticks (10 ms): too few requests to see one
        raise RuntimeError(f"a tools/call cost no CPU in {requests} requests: send more")
    for row in rows.values():
        row["vs_normal"] = row["cpu_us"] / normal
    worst = max((name for name in rows if name != NORMAL), key=lambda n: rows[n]["vs_normal"])
    ratio = rows[worst]["vs_normal"]
    return {"bodies": rows, "worst": worst, "worst_vs_normal": ratio, "target": TARGET,
            "met": ratio <= TARGET}  # fmt: skip


def report(results: dict[str, Any]) -> list[str]:
    """The Markdown lines for bench/run.py's report."""
    lines = ["| body (MCP gateway) | bytes | answer | gateway CPU us/request "
             "| x a tools/call relay |", "|---|---|---|---|---|"]  # fmt: skip
    for name, row in results["bodies"].items():
        answer = ", ".join(row["statuses"])
        lines.append(
            f"| {name} | {row['bytes']} | {answer} | {row['cpu_us']:.0f} | {row['vs_normal']:.1f} |"
        )
    met = "met" if results["met"] else "NOT met"
    lines += ["", f"Worst body at the gateway: {results['worst']}, "
              f"{results['worst_vs_normal']:.1f} tools/call relays (target <= "
              f"{results['target']:.0f}: {met})."]  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_worstbody", description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="of each body (default 200)")
    args = parser.parse_args(argv)
    results = measure(args.requests)
    print("\n".join(report(results)))
    json.dump(results, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
