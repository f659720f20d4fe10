"""Talk to a running daemon: clients over httpx, and the guard the adapters use.

`Client`/`AsyncClient` raise on trouble (the CLI wants to know); `Guard`/`AsyncGuard`
never raise for an outage and answer by their fail mode instead (a tool call must get
an answer). Only `ratewarden.wire`, `ratewarden.vocabulary` and the async clients' transport
(`ratewarden.http.keepalive`, on httptools) are imported, so a host agent loads this without FastAPI
or Redis.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import httpx
from pydantic_core import from_json, to_json

from ratewarden.errors import RatewardenError
from ratewarden.http.keepalive import KeepAlive, Unreachable
from ratewarden.vocabulary import (
    ADAPTER_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_URL,
    ClientSettings,
    FailMode,
    fail_mode,
    unavailable,
)
from ratewarden.wire.bodies import (
    SETTLE_PATH,
    Capabilities,
    CheckRequest,
    CheckResponse,
    ErrorResponse,
    Override,
    OverrideRemoved,
    OverrideRequest,
    OverridesResponse,
    ResetRequest,
    ResetResponse,
    SettleRequest,
    SettleResponse,
    SpendResponse,
    UsageResponse,
)
from ratewarden.wire.names import subject

__all__ = [
    "ADAPTER_TIMEOUT_S",
    "ARGS_FRESH_S",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_URL",
    "ArgsGate",
    "AsyncClient",
    "AsyncGuard",
    "Client",
    "ClientError",
    "DaemonUnavailable",
    "Guard",
    "unreachable_answer",
]


class ClientError(RatewardenError):
    """The daemon answered, but refused the request (a 4xx: bad input or auth)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class DaemonUnavailable(RatewardenError):
    """The daemon could not be reached, or did not answer in time."""


def _headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    if response.status_code >= 500:
        raise DaemonUnavailable(f"daemon error {response.status_code}")
    try:
        message = ErrorResponse.model_validate(response.json()).message
    except ValueError:
        message = response.text[:200]
    raise ClientError(response.status_code, message)


SPEND_PATH = "/v1/admin/spend"


def _settle_path(call_id: str) -> str:
    return SETTLE_PATH.format(call_id=quote(call_id, safe=""))


def _check_body(request: CheckRequest) -> dict[str, Any]:
    return request.model_dump(exclude_none=True, exclude_defaults=True)


# How long the daemon's word on `send_args` is taken as current. Every check answer
# renews it; a client idle for longer asks GET /v1/capabilities before its next check, so
# a reload that starts (or stops) reading arguments reaches it at its next call.
ARGS_FRESH_S = 2.0


class ArgsGate:
    """Whether a call's `args` go to the daemon: only while its policy reads them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._send = False
        self._until = -math.inf

    def known(self) -> bool | None:
        """What the daemon last said, or None when that is too old to go by."""
        return self._send if self._clock() < self._until else None

    def heard(self, send: bool) -> None:
        self._send, self._until = send, self._clock() + ARGS_FRESH_S

    def strip(self, request: CheckRequest) -> CheckRequest:
        """`request` without its args unless the daemon wants them (known() is set)."""
        if request.args is None or self._send:
            return request
        return request.model_copy(update={"args": None, "args_cut": None})


def _capabilities(body: Any) -> bool:
    return Capabilities.model_validate(body).send_args


# A daemon older than GET /v1/capabilities answers it 404: its policy cannot read args.
_NO_CAPABILITIES = 404


class Client:
    """Blocking client with keep-alive; one per thread or process is plenty."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`transport`: httpx's, e.g. `httpx.MockTransport` to test a host in process."""
        headers = _headers(token)
        self._http = httpx.Client(
            base_url=url, headers=headers, timeout=timeout, transport=transport
        )
        self.args = ArgsGate()

    def check(self, request: CheckRequest) -> CheckResponse:
        """Decide one call. Its `args` are sent only if the daemon's policy reads them."""
        if request.args is not None and self.args.known() is None:
            self.args.heard(self._send_args())
        body = self._call("POST", "/v1/check", json=_check_body(self.args.strip(request)))
        answer = CheckResponse.model_validate(body)
        self.args.heard(answer.send_args)
        return answer

    def usage(self, user: str, **parts: str | None) -> UsageResponse:
        params = {"user": user, **{k: v for k, v in parts.items() if v is not None}}
        return UsageResponse.model_validate(self._call("GET", "/v1/usage", params=params))

    def _send_args(self) -> bool:
        try:
            return _capabilities(self._call("GET", "/v1/capabilities"))
        except ClientError as exc:
            if exc.status == _NO_CAPABILITIES:
                return False
            raise

    def settle(self, call_id: str, request: SettleRequest | None = None) -> SettleResponse:
        body = (request or SettleRequest()).model_dump(exclude_none=True)
        return SettleResponse.model_validate(self._call("POST", _settle_path(call_id), json=body))

    # -- runtime overrides (an admin token) ------------------------------------------------

    def set_override(self, request: OverrideRequest) -> Override:
        body = request.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
        return Override.model_validate(self._call("POST", "/v1/admin/overrides", json=body))

    def overrides(self) -> OverridesResponse:
        return OverridesResponse.model_validate(self._call("GET", "/v1/admin/overrides"))

    def remove_override(self, override_id: str) -> OverrideRemoved:
        path = f"/v1/admin/overrides/{quote(override_id, safe='')}"
        return OverrideRemoved.model_validate(self._call("DELETE", path))

    def reset(self, request: ResetRequest) -> ResetResponse:
        """Forget counters (an admin token); the answer says what they held."""
        body = request.model_dump(exclude_none=True)
        return ResetResponse.model_validate(self._call("POST", "/v1/admin/reset", json=body))

    def spend(self, **filters: str | None) -> SpendResponse:
        """What each budget rule charged per day (a viewer or admin token); `filters`:
        user, team, rule, since, until (docs/api.md, "GET /v1/admin/spend")."""
        params = {k: v for k, v in filters.items() if v is not None}
        return SpendResponse.model_validate(self._call("GET", SPEND_PATH, params=params))

    def spend_csv(self, **filters: str | None) -> str:
        """The same rows as CSV, for chargeback."""
        params = {k: v for k, v in filters.items() if v is not None} | {"format": "csv"}
        try:
            response = self._http.request("GET", SPEND_PATH, params=params)
        except httpx.HTTPError as exc:
            raise DaemonUnavailable(f"{type(exc).__name__}: {exc}") from exc
        _raise_for(response)
        return response.text

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise DaemonUnavailable(f"{type(exc).__name__}: {exc}") from exc
        _raise_for(response)
        return response.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """The same calls for asyncio hosts."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`transport`: e.g. `httpx.ASGITransport(app)` to talk to a daemon in process."""
        headers = _headers(token)
        self._http = httpx.AsyncClient(
            base_url=url, headers=headers, timeout=timeout, transport=transport
        )
        # Plain http:// (the usual daemon): the same requests at a quarter of the CPU.
        plain = transport is None and httpx.URL(url).scheme == "http"
        self._wire = KeepAlive(url, headers, timeout) if plain else None
        self.args = ArgsGate()

    async def check(self, request: CheckRequest) -> CheckResponse:
        """Decide one call. Its `args` are sent only if the daemon's policy reads them."""
        if request.args is not None and self.args.known() is None:
            self.args.heard(await self._send_args())
        body = await self._call("POST", "/v1/check", json=_check_body(self.args.strip(request)))
        answer = CheckResponse.model_validate(body)
        self.args.heard(answer.send_args)
        return answer

    async def usage(self, user: str, **parts: str | None) -> UsageResponse:
        params = {"user": user, **{k: v for k, v in parts.items() if v is not None}}
        return UsageResponse.model_validate(await self._call("GET", "/v1/usage", params=params))

    async def _send_args(self) -> bool:
        try:
            return _capabilities(await self._call("GET", "/v1/capabilities"))
        except ClientError as exc:
            if exc.status == _NO_CAPABILITIES:
                return False
            raise

    async def settle(self, call_id: str, request: SettleRequest | None = None) -> SettleResponse:
        body = (request or SettleRequest()).model_dump(exclude_none=True)
        return SettleResponse.model_validate(
            await self._call("POST", _settle_path(call_id), json=body)
        )

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        if self._wire is not None:
            return await self._call_wire(method, path, json, params)
        try:
            response = await self._http.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise DaemonUnavailable(f"{type(exc).__name__}: {exc}") from exc
        _raise_for(response)
        return response.json()

    async def _call_wire(
        self, method: str, path: str, body: Any, params: dict[str, Any] | None
    ) -> Any:
        assert self._wire is not None
        target = f"{path}?{urlencode(params)}" if params else path
        sent = b"" if body is None else to_json(body)
        try:
            status, data = await self._wire.request(method, target, sent)
        except Unreachable as exc:
            raise DaemonUnavailable(str(exc)) from exc
        if status >= 400:
            _raise_for(httpx.Response(status, content=data))
        return from_json(data)

    async def aclose(self) -> None:
        if self._wire is not None:
            await self._wire.aclose()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- the guard: what adapters use ------------------------------------------------------

log = logging.getLogger("ratewarden.client")


class _GuardBase:
    """What both guards share: where the daemon is, the application's tool names, and
    the answer when the daemon is not there."""

    def __init__(
        self, url: str | None, token: str | None, fail: str, tool_names: ToolNames | None
    ) -> None:
        self.fail = fail_mode(fail)
        self.tool_names = _tool_names(tool_names)
        settings = ClientSettings.read()  # now, not at import: a host may set them late
        self.url = url or settings.url
        self.token = token or settings.token
        self.unreachable = 0  # checks answered by the fail mode
        self._lock = threading.Lock()

    def _named(self, request: CheckRequest) -> CheckRequest:
        """The check under its canonical tool name, when the application gave one: the
        application's own name goes with it as `host_tool` (a rule may still match it)."""
        canonical = self.tool_names.get(request.tool)
        if canonical is None:
            return request
        return request.model_copy(update={"tool": canonical, "host_tool": request.tool})

    def _unreachable(self, request: CheckRequest, error: Exception) -> CheckResponse:
        """The daemon did not answer (or refused the request, e.g. a bad token)."""
        with self._lock:
            self.unreachable += 1
        return unreachable_answer(request, self.fail, error)


class Guard(_GuardBase):
    """Ask the daemon before a tool runs, report after; never raises for an outage.

    When the daemon cannot be reached the answer is explicit: with `fail="open"` (the
    default) the call is allowed, marked `degraded`, logged and counted in
    `unreachable`; with `fail="closed"` it is denied with a message saying the guard is
    unavailable. `url` and `token` default to RATEWARDEN_URL and RATEWARDEN_TOKEN.
    Thread-safe: hosts may call it from worker threads.

    `tool_names` maps the application's own tool names to canonical ones
    (`{"shell": "terminal"}`), so a framework whose tools the application names shares
    the policy's rules and counters with every coding agent's hooks (docs/policy.md,
    "Canonical tool names"); a tool it does not name keeps its name.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = ADAPTER_TIMEOUT_S,
        fail: str = "open",
        transport: httpx.BaseTransport | None = None,
        tool_names: ToolNames | None = None,
    ) -> None:
        super().__init__(url, token, fail, tool_names)
        self._client = Client(self.url, self.token, timeout=timeout, transport=transport)

    def check(self, request: CheckRequest) -> CheckResponse:
        try:
            return self._client.check(self._named(request))
        except (DaemonUnavailable, ClientError) as exc:
            return self._unreachable(request, exc)

    def settle(self, call_id: str, request: SettleRequest | None = None) -> SettleResponse | None:
        """Report a finished call; an outage or an unknown call is logged, not raised."""
        try:
            return self._client.settle(call_id, request)
        except (DaemonUnavailable, ClientError) as exc:
            log.warning("ratewarden settle of %s failed: %s", call_id, exc)
            return None

    def close(self) -> None:
        self._client.close()


class AsyncGuard(_GuardBase):
    """`Guard` for asyncio hosts."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = ADAPTER_TIMEOUT_S,
        fail: str = "open",
        transport: httpx.AsyncBaseTransport | None = None,
        tool_names: ToolNames | None = None,
    ) -> None:
        super().__init__(url, token, fail, tool_names)
        self._timeout, self._transport = timeout, transport
        self._client = self._new_client()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _new_client(self) -> AsyncClient:
        return AsyncClient(self.url, self.token, timeout=self._timeout, transport=self._transport)

    def _client_for_this_loop(self) -> AsyncClient:
        """httpx pools belong to the loop that opened them: hosts that run each turn in a
        fresh `asyncio.run` get a fresh client."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            self._client = self._new_client()
        self._loop = loop
        return self._client

    async def check(self, request: CheckRequest) -> CheckResponse:
        try:
            return await self._client_for_this_loop().check(self._named(request))
        except (DaemonUnavailable, ClientError) as exc:
            return self._unreachable(request, exc)

    async def settle(
        self, call_id: str, request: SettleRequest | None = None
    ) -> SettleResponse | None:
        """Report a finished call; an outage or an unknown call is logged, not raised."""
        try:
            return await self._client_for_this_loop().settle(call_id, request)
        except (DaemonUnavailable, ClientError) as exc:
            log.warning("ratewarden settle of %s failed: %s", call_id, exc)
            return None

    async def aclose(self) -> None:
        await self._client.aclose()


ToolNames = Mapping[str, str]  # the application's tool name -> its canonical name


def _tool_names(given: ToolNames | None) -> dict[str, str]:
    """`tool_names` checked once: each a name the API takes, to a different one."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise TypeError(f"tool_names must be a mapping of names, not {type(given).__name__}")
    names = dict(given)
    for theirs, ours in names.items():
        for name in (theirs, ours):
            if not isinstance(name, str) or subject(name) != name:
                raise ValueError(
                    f"tool_names: {name!r} is not a tool name the daemon takes as it is"
                )
        if theirs == ours:
            raise ValueError(f"tool_names: {theirs!r} is mapped to itself")
    return names


def unreachable_answer(request: CheckRequest, fail: str, error: Exception) -> CheckResponse:
    """The decision when the daemon did not answer: the fail mode, said plainly.

    A refusal (a bad token, a request the daemon rejects) is a misconfiguration, not an
    outage: it is answered the same way, so that a typo never stops every tool of a
    gateway, but logged as an error, since with `fail="open"` nothing is being limited.
    """
    if isinstance(error, ClientError):
        what = "refused the guard's token" if error.status in (401, 403) else "refused a check"
        log.error(
            "ratewarden daemon %s (%s %s); failing %s for %s until it is fixed",
            what, error.status, error, fail, request.tool,
        )  # fmt: skip
    else:
        log.warning(
            "ratewarden daemon unreachable (%s); failing %s for %s", error, fail, request.tool
        )
    call_id = request.call_id or ""
    if fail == FailMode.OPEN:
        return CheckResponse(
            decision="allow", allowed=True, message="", call_id=call_id, degraded=True
        )
    message = unavailable(request.tool)
    return CheckResponse(
        decision="deny", allowed=False, message=message, call_id=call_id, degraded=True
    )
