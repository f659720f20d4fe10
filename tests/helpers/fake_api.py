"""What the scripted model APIs of the tests share: a quiet request handler that writes
whole answers, and a threaded server for it on a free loopback port.

Each fake (fake_anthropic.py; tests/hosts/drivers/codex_responses.py, gemini_api.py,
openai_chat.py) keeps only what its API says: its routes and its answers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeApiHandler(BaseHTTPRequestHandler):
    """A fake API's handler: its `post` and `get` answer (a 404 where the API says nothing:
    a GET is mostly a model list), `reply` writes one whole answer, nothing is logged."""

    def do_POST(self) -> None:
        self.post()

    def do_GET(self) -> None:
        self.get()

    def post(self) -> None:
        self.reply(404, "application/json", b"{}")

    def get(self) -> None:
        self.reply(404, "application/json", b"{}")

    def reply(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet


@contextlib.contextmanager
def serving_api(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port, in a thread, until the block ends; yields
    its base URL (`http://127.0.0.1:PORT`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
