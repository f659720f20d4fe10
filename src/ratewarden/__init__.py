"""ratewarden: rate limits, concurrency caps and cost budgets for AI-agent tool calls.

The public surface, importable from here: the clients and guards a host uses to ask the
daemon (`Client`, `AsyncClient`, `Guard`, `AsyncGuard`), the wire models they send and
receive, and the error tree rooted at `RatewardenError` (see ratewarden.errors). Run the
daemon with `ratewarden serve`; build one in process with `ratewarden.service.create_app`.

Members load on first use, so `import ratewarden` stays cheap for a hook that needs
little of it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (hooks start fast)

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "Client": "ratewarden.client",
    "AsyncClient": "ratewarden.client",
    "Guard": "ratewarden.client",
    "AsyncGuard": "ratewarden.client",
    "ClientError": "ratewarden.client",
    "DaemonUnavailable": "ratewarden.client",
    "RatewardenError": "ratewarden.errors",
    "CheckRequest": "ratewarden.wire.bodies",
    "CheckResponse": "ratewarden.wire.bodies",
    "BatchRequest": "ratewarden.wire.bodies",
    "BatchResponse": "ratewarden.wire.bodies",
    "ToolMetadata": "ratewarden.wire.bodies",
    "Violation": "ratewarden.wire.bodies",
    "LimitState": "ratewarden.wire.bodies",
    "SettleRequest": "ratewarden.wire.bodies",
    "ModelUsage": "ratewarden.wire.bodies",
    "SettleResponse": "ratewarden.wire.bodies",
    "UsageItem": "ratewarden.wire.bodies",
    "UsageResponse": "ratewarden.wire.bodies",
    "ErrorResponse": "ratewarden.wire.bodies",
    "FieldError": "ratewarden.wire.bodies",
}

__all__ = [  # the same names as _EXPORTS (tests/unit/test_public_surface.py holds them equal)
    "AsyncClient",
    "AsyncGuard",
    "BatchRequest",
    "BatchResponse",
    "CheckRequest",
    "CheckResponse",
    "Client",
    "ClientError",
    "DaemonUnavailable",
    "ErrorResponse",
    "FieldError",
    "Guard",
    "LimitState",
    "ModelUsage",
    "RatewardenError",
    "SettleRequest",
    "SettleResponse",
    "ToolMetadata",
    "UsageItem",
    "UsageResponse",
    "Violation",
    "__version__",
]

if TYPE_CHECKING:
    from ratewarden.client import (
        AsyncClient,
        AsyncGuard,
        Client,
        ClientError,
        DaemonUnavailable,
        Guard,
    )
    from ratewarden.errors import RatewardenError
    from ratewarden.wire.bodies import (
        BatchRequest,
        BatchResponse,
        CheckRequest,
        CheckResponse,
        ErrorResponse,
        FieldError,
        LimitState,
        ModelUsage,
        SettleRequest,
        SettleResponse,
        ToolMetadata,
        UsageItem,
        UsageResponse,
        Violation,
    )


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ratewarden' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
