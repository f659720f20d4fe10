"""The HTTP daemon: app factory, routes, error shapes.

`create_app` is imported when first asked for, so a module of this package that serves
outside the daemon (connections.py, for the MCP gateway) loads without FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratewarden.service.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from ratewarden.service.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
