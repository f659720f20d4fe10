"""Posting one notification to one webhook: the body signed, retried with backoff.

A notification is a JSON body (service/notify.py builds it) posted with

- `X-Ratewarden-Event`: the event (`budget.soft_limit`, ...);
- `X-Ratewarden-Delivery`: the notification's `id` (the same on every retry: a receiver
  that saw it already can say 2xx and do nothing);
- `X-Ratewarden-Timestamp`: Unix seconds when this attempt was signed;
- `X-Ratewarden-Signature`: `sha256=` and the hex HMAC-SHA256, keyed by the webhook's
  secret, of `<timestamp>.<body>` (the exact bytes posted). Signing the timestamp lets a
  receiver refuse an old post replayed (`verify`'s tolerance). Without a secret, no
  signature header.

An attempt that fails to connect, times out, or is answered 429 or 5xx is tried again
after a backoff: exponential (BASE_S doubled per attempt, at most CAP_S) with jitter (the
wait is half of that plus a random share of the other half, so that daemons that failed
together do not retry together); a `Retry-After` of seconds or an HTTP date is honoured
up to CAP_S. Any other answer (a 3xx, a 4xx but 429) is final: the receiver refused the
post, and the same post would be refused again. At most `attempts` in all.

A URL can be a secret (a Slack webhook's is): logs name only its scheme, host and port,
and httpx's own line for each request (`HTTP Request: POST <url>`, at INFO) is kept out
of the log for a webhook's URL (`_HiddenUrls`).
"""

from __future__ import annotations

import asyncio
import email.utils
import hmac
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

log = logging.getLogger("ratewarden.notify")

SIGNATURE_HEADER = "X-Ratewarden-Signature"
TIMESTAMP_HEADER = "X-Ratewarden-Timestamp"
EVENT_HEADER = "X-Ratewarden-Event"
DELIVERY_HEADER = "X-Ratewarden-Delivery"
BASE_S = 0.5  # the first retry's backoff; doubled per attempt
CAP_S = 30.0  # the longest wait between two attempts, Retry-After included
TOLERANCE_S = 300  # how old a signed timestamp `verify` accepts


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The `X-Ratewarden-Signature` value of `body` signed at `timestamp`."""
    signed = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret, signed, "sha256").hexdigest()


def verify(
    secret: bytes,
    timestamp: str,
    body: bytes,
    given: str,
    *,
    now_s: float | None = None,
    tolerance_s: float = TOLERANCE_S,
) -> bool:
    """What a receiver checks: the signature is ours for this body and timestamp (compared
    in constant time), and the timestamp is recent."""
    if not timestamp.isdigit() or len(timestamp) > 12:
        return False
    now_s = time.time() if now_s is None else now_s
    if abs(now_s - int(timestamp)) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, int(timestamp), body), given)


def backoff_s(attempt: int, draw: Callable[[], float] = random.random) -> float:
    """The wait after failed attempt number `attempt` (1, 2, ...): BASE_S * 2^(attempt-1),
    at most CAP_S, of which the second half is drawn at random."""
    ceiling = min(CAP_S, BASE_S * 2.0 ** min(attempt - 1, 32))
    return ceiling / 2 + draw() * ceiling / 2


def retry_after_s(value: str | None, now_s: float | None = None) -> float | None:
    """A `Retry-After` header's wait in seconds (delay-seconds or an HTTP date), at most
    CAP_S; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(CAP_S, float(value[:12]))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    now_s = time.time() if now_s is None else now_s
    return min(CAP_S, max(0.0, when.timestamp() - now_s))


@dataclass(frozen=True, slots=True)
class Target:
    """One webhook, its URL and secret read from the environment."""

    url: str
    secret: bytes | None
    events: frozenset[str]

    @property
    def name(self) -> str:
        """What a log line may say of it: scheme, host and port, never the path."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class _HiddenUrls(logging.Filter):
    """Drops httpx's log records that name one of `urls` (its "HTTP Request" line)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(str(arg) in self.urls for arg in args)


_HIDDEN = _HiddenUrls()
logging.getLogger("httpx").addFilter(_HIDDEN)


class Sender:
    """Posts notifications, each until it is answered 2xx or runs out of attempts."""

    def __init__(
        self,
        attempts: int,
        timeout_s: float,
        *,
        client: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.attempts = attempts
        self.timeout_s = timeout_s
        self._client = client  # made on the first post: a daemon without webhooks has none
        self.sleep = sleep
        self.draw = draw

    async def deliver(self, target: Target, event: str, delivery: str, body: bytes) -> bool:
        """Post `body`; True once a 2xx answers it, False when it never does."""
        why = ""
        _HIDDEN.urls.add(str(httpx.URL(target.url)))  # as httpx writes it in its line
        for attempt in range(1, self.attempts + 1):
            wait: float | None = None
            try:
                response = await self.client().post(
                    target.url, content=body, headers=self._headers(target, event, delivery, body)
                )
            except httpx.HTTPError as exc:  # connect, read, timeouts: try again
                why = f"{type(exc).__name__}"
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return True
                why = f"answered {status}"
                if status != 429 and status < 500:
                    break  # refused: the same post would be refused again
                wait = retry_after_s(response.headers.get("retry-after"))
            if attempt < self.attempts:
                await self.sleep(backoff_s(attempt, self.draw) if wait is None else wait)
        log.warning(
            "notification %s (%s) not delivered to %s: %s", delivery, event, target.name, why
        )
        return False

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s),
                follow_redirects=False,  # a redirect is the receiver's mistake: reported
                limits=httpx.Limits(max_connections=16, max_keepalive_connections=4),
                headers={"User-Agent": "ratewarden-notify"},
            )
        return self._client

    @staticmethod
    def _headers(target: Target, event: str, delivery: str, body: bytes) -> dict[str, str]:
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            EVENT_HEADER: event,
            DELIVERY_HEADER: delivery,
            TIMESTAMP_HEADER: str(timestamp),
        }
        if target.secret is not None:
            headers[SIGNATURE_HEADER] = signature(target.secret, timestamp, body)
        return headers

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
