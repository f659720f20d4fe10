"""The user tokens file: its one home, read by the daemon (`RATEWARDEN_USER_TOKENS`) and
by the MCP gateway (`--tokens`).

A YAML mapping of each user to a token or a list of tokens:

    alice: 7f3c9a0e5b2d4c18a6e0f1b2c3d4e5f6
    bob: [0a1b2c3d4e5f60718293a4b5c6d7e8f9, 9f8e7d6c5b4a39281706f5e4d3c2b1a0]

A token is a credential bound to its user: whoever presents it is that user, and only
that user. The readers keep SHA-256 digests of the tokens, never the tokens. Names are
taken exactly as written (no case folding, no Unicode normalisation): `Alice` and `alice`
are two users, as they are to every rule. A mistake is named (the file, the user, what is
wrong), never the token: the message may reach a log.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ratewarden.vocabulary import MAX_NAME

__all__ = ["MIN_TOKEN", "digest", "read_tokens"]

MIN_TOKEN = 16  # characters: a token is a secret, not a password to remember


def digest(token: str | bytes) -> bytes:
    """How a token is kept and looked up."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


def read_tokens(path: Path) -> dict[str, str]:
    """The tokens file as token -> user; a mistake raises ValueError naming it."""
    try:
        loaded = yaml.load(path.read_text(), Loader=_UniqueKeys)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise ValueError(f"tokens file {path}: {_where(exc)}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"tokens file {path}: {exc}") from None
    if not isinstance(loaded, Mapping) or not loaded:
        raise ValueError(f"tokens file {path}: expected a mapping of user: token")
    users: dict[str, str] = {}
    for user, given in loaded.items():
        _check_user(path, user)
        tokens = given if isinstance(given, list) else [given]
        if not tokens:
            raise ValueError(f"tokens file {path}: user {user!r}: no token")
        for token in tokens:
            _check_token(path, user, token)
            if users.setdefault(token, user) != user:
                raise ValueError(
                    f"tokens file {path}: users {users[token]!r} and {user!r} share a token"
                )
    return users


def _check_user(path: Path, user: object) -> None:
    if not isinstance(user, str) or not 0 < len(user) <= MAX_NAME:
        raise ValueError(f"tokens file {path}: user {user!r}: a name of 1-{MAX_NAME} characters")
    if not user.isprintable() or user != user.strip():
        # A control character or a stray space is a mistake, not a name anyone sends.
        raise ValueError(
            f"tokens file {path}: user {user!r}: a name of printable characters, "
            "without spaces around it"
        )


def _check_token(path: Path, user: str, token: object) -> None:
    if not isinstance(token, str) or len(token) < MIN_TOKEN:
        raise ValueError(
            f"tokens file {path}: user {user!r}: a token of at least {MIN_TOKEN} characters"
        )
    if not all("!" <= char <= "~" for char in token):
        raise ValueError(
            f"tokens file {path}: user {user!r}: a token of printable ASCII, no spaces"
        )


def _where(exc: yaml.YAMLError) -> str:
    """A YAML error's problem and place, without the snippet of the file PyYAML quotes
    (the line may hold a token)."""
    problem = getattr(exc, "problem", None) or "not valid YAML"
    mark = getattr(exc, "problem_mark", None)
    place = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{place}"


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a user named twice (YAML would keep the last)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool | None):
                continue  # refused below as a name that is not text
            if key in seen:
                raise ValueError(f"user {key!r} is listed twice")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
