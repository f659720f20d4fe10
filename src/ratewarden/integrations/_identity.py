"""Where adapters find the user: a key or attribute of the host's per-run context."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ratewarden.vocabulary import ClientSettings

UserLookup = Callable[[Any], str | None]


def user_from(context: Any, key: str = "user_id") -> str | None:
    """`context[key]` or `context.key`, as a string; None when absent."""
    if context is None:
        return None
    value = context.get(key) if isinstance(context, dict) else getattr(context, key, None)
    return None if value is None or value == "" else str(value)


def default_user() -> str:
    """Who calls when the host says nothing: RATEWARDEN_USER, else the OS login name."""
    return ClientSettings.read().user_or_login()


def resolve_user(context: Any, lookup: UserLookup | None = None, key: str = "user_id") -> str:
    """The adapter's `user` callable, else the context's `user_id`, else `default_user()`."""
    found = lookup(context) if lookup is not None else user_from(context, key)
    return found or default_user()
