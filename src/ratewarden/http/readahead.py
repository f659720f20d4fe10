"""A request's body read ahead of the application that answers it (ASGI), and given to it
again: what the daemon's hot path and the MCP gateway do before they hand a request on.

Why not a library: Starlette's `Request` keeps a body it read for itself only; an ASGI app
that reads a body and then hands the request to another must replay the receive channel,
which is these two functions. The rows that re-check it: bench/run's one rule / floor (the
hot path reads every check this way) and "Worst bodies" at the MCP gateway
(bench/mcp_worstbody.py).
"""

from __future__ import annotations

from starlette.types import Message, Receive


async def read_body(receive: Receive) -> bytes | None:
    """The whole body (any size cap applies outside), or None if the client left first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """`receive` with `body`, already read, given first."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
