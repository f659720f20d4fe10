"""A request's body read ahead of the application that answers it (ASGI), and given to it
again: what the daemon's hot path and the MCP gateway do before they hand a request on."""

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
