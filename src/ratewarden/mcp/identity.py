"""Who a gateway request comes from: a bearer token's user, or a trusted proxy's header.

The tokens file (`--tokens`) is YAML mapping each user to a token or a list of tokens:

    alice: 7f3c9a0e5b2d4c18a6e0f1b2c3d4e5f6
    bob: [0a1b2c3d4e5f60718293a4b5c6d7e8f9, 9f8e7d6c5b4a39281706f5e4d3c2b1a0]

Tokens are held as SHA-256 digests and looked up by digest. A request that names a
token the file does not hold is refused, whatever else it carries. `--user-header H`
(off unless given) believes header H only from the front proxy's addresses
(`--trusted-proxy`, loopback by default): anyone else could set it.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ratewarden.vocabulary import MAX_NAME

__all__ = ["LOOPBACK", "Identities", "read_tokens"]

LOOPBACK = ("127.0.0.0/8", "::1/128")
MIN_TOKEN = 16  # characters: a token is a secret, not a password to remember
Scope = Mapping[str, Any]  # an ASGI request's scope


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def read_tokens(path: Path) -> dict[str, str]:
    """The tokens file: a YAML mapping of user to token (or a list of tokens). The
    answer maps each token to its user; a mistake raises ValueError naming it."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"tokens file {path}: {exc}") from None
    if not isinstance(loaded, Mapping) or not loaded:
        raise ValueError(f"tokens file {path}: expected a mapping of user: token")
    users: dict[str, str] = {}
    for user, given in loaded.items():
        if not isinstance(user, str) or not 0 < len(user) <= MAX_NAME:
            raise ValueError(
                f"tokens file {path}: user {user!r}: a name of 1-{MAX_NAME} characters"
            )
        for token in given if isinstance(given, list) else [given]:
            _check_token(path, user, token)
            if users.setdefault(token, user) != user:
                raise ValueError(
                    f"tokens file {path}: users {users[token]!r} and {user!r} share a token"
                )
    return users


def _check_token(path: Path, user: str, token: object) -> None:
    if not isinstance(token, str) or len(token) < MIN_TOKEN:
        raise ValueError(
            f"tokens file {path}: user {user!r}: a token of at least {MIN_TOKEN} characters"
        )
    if not all("!" <= char <= "~" for char in token):
        raise ValueError(
            f"tokens file {path}: user {user!r}: a token of printable ASCII, no spaces"
        )


class Identities:
    """Who a request comes from: its bearer token's user, else (only when configured, and
    only from a trusted proxy's address) the user its header names; None: nobody known."""

    def __init__(
        self,
        tokens: Mapping[str, str],
        *,
        header: str | None = None,
        proxies: Sequence[str] = LOOPBACK,
    ) -> None:
        self._users = {_digest(token): user for token, user in tokens.items()}
        self._header = header.lower().encode("latin-1") if header else None
        self._proxies = [ipaddress.ip_network(proxy, strict=False) for proxy in proxies]

    def user_of(self, scope: Scope) -> str | None:
        headers = dict(scope["headers"])  # ASGI: lower-case names
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            # A token that is given but unknown is refused, never passed to the header.
            return self._users.get(_digest(token.strip()))
        if self._header is None or not self._from_proxy(scope):
            return None
        named = headers.get(self._header, b"").decode("utf-8", "replace").strip()
        return named if 0 < len(named) <= MAX_NAME and named.isprintable() else None

    def _from_proxy(self, scope: Scope) -> bool:
        client = scope.get("client")
        try:
            peer = ipaddress.ip_address(client[0]) if client else None
        except ValueError:
            return False
        return peer is not None and any(peer in network for network in self._proxies)
