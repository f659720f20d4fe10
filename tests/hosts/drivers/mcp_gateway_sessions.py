"""What one user can take of the gateway (issue 25, items 7 and 8), over raw HTTP and the
official MCP SDK's client, in the mcp host venv.

argv[1] is a JSON config: `gateway` (its base URL), `tokens` (user -> token), `work`
(where the servers write what ran, `demo.ran`, and a line per process started,
`demo.started`), `scenario` (`lazy`, `caps`, `bodies`). The report, one JSON line on
stdout, holds what each request was answered and how many server processes had started.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from ratewarden.wire.bodies import MAX_ARGS_DEPTH
from ratewarden.wire.bounded import MAX_ITEMS, count_items

CONFIG: dict[str, Any] = json.loads(sys.argv[1])
WORK = Path(CONFIG["work"])
URL = f"{CONFIG['gateway']}/demo/mcp"
VERSION = "2025-11-25"
INIT = {
    "protocolVersion": VERSION,
    "capabilities": {},
    "clientInfo": {"name": "raw", "version": "0"},
}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def started() -> int:
    """Server processes started so far."""
    path = WORK / "demo.started"
    return len(path.read_text().splitlines()) if path.exists() else 0


def ran(marker: str) -> list[str]:
    path = WORK / "demo.ran"
    return (
        [line for line in path.read_text().splitlines() if marker in line] if path.exists() else []
    )


def bearer(user: str) -> dict[str, str]:
    return {**ACCEPT, "Authorization": f"Bearer {CONFIG['tokens'][user]}"}


def request(method: str, request_id: int = 1, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def call(request_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return request("tools/call", request_id, name=name, arguments=arguments)


async def open_session(
    http: httpx2.AsyncClient, user: str, url: str = URL
) -> tuple[int, dict[str, str]]:
    """initialize, then initialized, by raw HTTP: the status, and the session's headers."""
    answer = await http.post(url, json=request("initialize", 0, **INIT), headers=bearer(user))
    if answer.status_code != 200:
        return answer.status_code, {}
    headers = bearer(user) | {
        "mcp-session-id": answer.headers["mcp-session-id"],
        "mcp-protocol-version": VERSION,
    }
    await http.post(
        url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    return 200, headers


async def ping(http: httpx2.AsyncClient, headers: dict[str, str], url: str = URL) -> int:
    return int((await http.post(url, json=request("ping", 7), headers=headers)).status_code)


def result_text(answer: httpx2.Response) -> str:
    """A call's result text, else its error's message (else the answer's text)."""
    if answer.status_code != 200:
        try:
            return str(answer.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return str(answer.text)
    text = answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
    message = json.loads(text)
    if "error" in message:
        return f"error {message['error']['message']}"
    return str(message["result"]["content"][0]["text"])


# -- lazy: no server process until a request needs it ----------------------------------------


async def lazy() -> dict[str, Any]:
    report: dict[str, Any] = {"before": started()}
    # An SDK client lists the tools: its server starts (and the gateway learns its greeting).
    async with (
        httpx2.AsyncClient(headers=bearer("gw-warm"), timeout=30) as http,
        streamable_http_client(URL, http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        report["warm_tools"] = sorted(tool.name for tool in (await client.list_tools()).tools)[:2]
    report["after_warm"] = started()
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        sessions = [await open_session(http, "gw-lazy") for _ in range(3)]
        report["opened"] = [status for status, _ in sessions]
        report["pinged"] = [await ping(http, headers) for _, headers in sessions]
        await asyncio.sleep(1)  # time for a process, were one started
        report["after_open"] = started()
        headers = sessions[0][1]
        answer = await http.post(
            URL, json=call(2, "terminal", {"command": "echo lazy-1"}), headers=headers
        )
        report["first_call"] = result_text(answer)
        report["after_call"] = started()
        report["pinged_after"] = await ping(http, headers)
        for _, headers in sessions:
            await http.delete(URL, headers=headers)
    # An SDK client, whose session starts its server lazily, sees everything as before.
    async with (
        httpx2.AsyncClient(headers=bearer("gw-lazy"), timeout=30) as http,
        streamable_http_client(URL, http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        greeting = await client.initialize()
        report["sdk_server"] = greeting.server_info.name
        listed = await client.list_tools()
        result = await client.call_tool("terminal", {"command": "echo lazy-2"})
        report["sdk_tools"] = len(listed.tools)
        report["sdk_call"] = [block.text for block in result.content if hasattr(block, "text")]
    report["ran"] = ran("echo lazy-")
    report["unstartable"] = await unstartable()
    return report


async def unstartable() -> dict[str, Any]:
    """`flaky` runs the server only while its flag file is there: a session opened after
    the flag went is greeted from memory, and its first call is answered with an error."""
    url = f"{CONFIG['gateway']}/flaky/mcp"
    report: dict[str, Any] = {}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        _, headers = await open_session(http, "gw-lazy", url)  # its server learns the greeting
        await http.post(url, json=request("tools/list", 1), headers=headers)
        await http.delete(url, headers=headers)
        Path(CONFIG["flag"]).unlink()
        report["opened"], headers = await open_session(http, "gw-lazy", url)
        answer = await http.post(
            url, json=call(2, "terminal", {"command": "echo lazy-never"}), headers=headers
        )
        report["call"] = result_text(answer)
        again = await http.post(url, json=request("tools/list", 3), headers=headers)
        report["again"] = again.json().get("error", {}).get("message")
        report["pinged"] = await ping(http, headers, url)
        await http.delete(url, headers=headers)
    return report


# -- caps: one user's sessions ----------------------------------------------------------------


async def caps() -> dict[str, Any]:
    cap = CONFIG["max_user_sessions"]
    report: dict[str, Any] = {}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        # One user opens cap + 5 sessions, one after the other, and uses none.
        hog = [await open_session(http, "gw-hog") for _ in range(cap + 5)]
        report["hog_opened"] = [status for status, _ in hog]
        report["hog_alive"] = [await ping(http, headers) for _, headers in hog]
        report["started_idle"] = started()
        # Another user still gets in, and their call runs.
        status, bob = await open_session(http, "gw-bob")
        report["bob_opened"] = status
        answer = await http.post(
            URL, json=call(2, "terminal", {"command": "echo caps-bob"}), headers=bob
        )
        report["bob_call"] = result_text(answer)
        await http.delete(URL, headers=bob)
        # The hog's live sessions each run a call that hangs: none is idle, so a session
        # more is refused, and no call in flight is cut.
        live = [
            headers
            for (_, headers), alive in zip(hog, report["hog_alive"], strict=True)
            if alive == 200
        ]
        hanging = [
            asyncio.create_task(
                http.post(URL, json=call(3, "hang", {"label": f"caps-hang-{n}"}), headers=headers)
            )
            for n, headers in enumerate(live)
        ]
        while len(ran("caps-hang-")) < len(live):
            await asyncio.sleep(0.05)
        more, _ = await open_session(http, "gw-hog")
        report["hog_busy_open"] = more
        report["busy_alive"] = [await ping(http, headers) for headers in live]
        status, carol = await open_session(http, "gw-carol")
        report["carol_opened"] = status
        for headers in live:
            await http.delete(URL, headers=headers)  # ends the hanging calls (settled)
        await asyncio.gather(*hanging, return_exceptions=True)
        if carol:
            await http.delete(URL, headers=carol)
        # Two users race, cap + 5 opens each at once: neither holds more than the cap.
        racing = await asyncio.gather(
            *(
                open_session(http, user)
                for _ in range(cap + 5)
                for user in ("gw-race-a", "gw-race-b")
            )
        )
        report["race_opened"] = sorted(status for status, _ in racing)
        alive: dict[str, int] = {}
        for (status, headers), user in zip(
            racing, ["gw-race-a", "gw-race-b"] * (cap + 5), strict=True
        ):
            if status == 200 and await ping(http, headers) == 200:
                alive[user] = alive.get(user, 0) + 1
                await http.delete(URL, headers=headers)
        report["race_alive"] = alive
    return report


# -- bodies: refused before they are read ------------------------------------------------------


def padded(command: str, pad: Any) -> bytes:
    return json.dumps(
        call(4, "terminal", {"command": command, "pad": pad}), separators=(",", ":")
    ).encode()


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def bodies() -> dict[str, Any]:
    cases = {
        # 2 MB of 500 000 small items, what held the event loop for seconds: over the
        # gateway's body cap now; 1 MB of them within it
        "2 MB of 500 000 items": padded("echo body-items", ["a"] * 500_000),
        "500 000 items": padded("echo body-items", [0] * 500_000),
        # the item cap exactly, and one over
        "at the item cap": b"",
        "one item over": b"",
        # arguments as deep as the daemon's cap (`pad` one level less), and one deeper
        "at the depth cap": padded("echo body-deep-cap", nested(MAX_ARGS_DEPTH - 1)),
        "one level over": padded("echo body-deep-over", nested(MAX_ARGS_DEPTH)),
        "deep as a string": padded("echo body-deep-string", "[" * 100_000),
        # 900 KB of escapes in one string (10 bytes each as JSON): one item
        "escapes": padded("echo body-escapes", '\\"\u00e9' * 90_000),
    }
    # `"pad": []` is one item (its bracket), as is `"pad": [0]`; each 0 more, one more
    from_items = MAX_ITEMS - count_items(padded("echo body-cap", [])) + 1
    cases["at the item cap"] = padded("echo body-cap", [0] * from_items)
    cases["one item over"] = padded("echo body-over", [0] * (from_items + 1))
    report: dict[str, Any] = {"items": {name: count_items(body) for name, body in cases.items()}}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        _, headers = await open_session(http, "gw-bodies")
        answers = {}
        for name, body in cases.items():
            answer = await http.post(
                URL, content=body, headers=headers | {"content-type": "application/json"}
            )
            answers[name] = {"status": answer.status_code, "text": result_text(answer)}
        report["answers"] = answers
        opening = padded("x", [0] * 10_000).replace(b'"tools/call"', b'"initialize"')
        refused = await http.post(
            URL, content=opening, headers=bearer("gw-bodies") | {"content-type": "application/json"}
        )
        report["initialize"] = {
            "status": refused.status_code,
            "session": "mcp-session-id" in refused.headers,
        }
        after = await http.post(
            URL, json=call(5, "terminal", {"command": "echo body-after"}), headers=headers
        )
        report["after"] = result_text(after)
        await http.delete(URL, headers=headers)
    report["ran"] = ran("echo body-")
    return report


if __name__ == "__main__":
    scenario = {"lazy": lazy, "caps": caps, "bodies": bodies}[CONFIG["scenario"]]
    print(json.dumps(asyncio.run(scenario())))
