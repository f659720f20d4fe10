"""Talk to a running daemon: a sync and an async client over httpx.

Used by the CLI and the framework adapters. Only `ratewarden.wire` is imported, so a
host agent loads this without FastAPI or Redis.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from ratewarden.wire import (
    CheckRequest,
    CheckResponse,
    ErrorResponse,
    SettleRequest,
    SettleResponse,
    UsageResponse,
)

DEFAULT_TIMEOUT_S = 2.0


class ClientError(Exception):
    """The daemon answered, but refused the request (a 4xx: bad input or auth)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class DaemonUnavailable(Exception):
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


def _settle_path(call_id: str) -> str:
    return f"/v1/calls/{quote(call_id, safe='')}/settle"


def _check_body(request: CheckRequest) -> dict[str, Any]:
    return request.model_dump(exclude_none=True, exclude_defaults=True)


class Client:
    """Blocking client with keep-alive; one per thread or process is plenty."""

    def __init__(
        self, url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self._http = httpx.Client(base_url=url, headers=_headers(token), timeout=timeout)

    def check(self, request: CheckRequest) -> CheckResponse:
        return CheckResponse.model_validate(
            self._call("POST", "/v1/check", json=_check_body(request))
        )

    def usage(self, user: str, **parts: str | None) -> UsageResponse:
        params = {"user": user, **{k: v for k, v in parts.items() if v is not None}}
        return UsageResponse.model_validate(self._call("GET", "/v1/usage", params=params))

    def settle(self, call_id: str, request: SettleRequest | None = None) -> SettleResponse:
        body = (request or SettleRequest()).model_dump(exclude_none=True)
        return SettleResponse.model_validate(self._call("POST", _settle_path(call_id), json=body))

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
        self, url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self._http = httpx.AsyncClient(base_url=url, headers=_headers(token), timeout=timeout)

    async def check(self, request: CheckRequest) -> CheckResponse:
        body = await self._call("POST", "/v1/check", json=_check_body(request))
        return CheckResponse.model_validate(body)

    async def usage(self, user: str, **parts: str | None) -> UsageResponse:
        params = {"user": user, **{k: v for k, v in parts.items() if v is not None}}
        return UsageResponse.model_validate(await self._call("GET", "/v1/usage", params=params))

    async def settle(self, call_id: str, request: SettleRequest | None = None) -> SettleResponse:
        body = (request or SettleRequest()).model_dump(exclude_none=True)
        return SettleResponse.model_validate(
            await self._call("POST", _settle_path(call_id), json=body)
        )

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise DaemonUnavailable(f"{type(exc).__name__}: {exc}") from exc
        _raise_for(response)
        return response.json()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
