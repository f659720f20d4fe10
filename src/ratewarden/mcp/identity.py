"""Who a gateway request comes from: a bearer token's user, or a trusted proxy's header.

The tokens file (`--tokens`, else `$RATEWARDEN_USER_TOKENS`: the daemon's user tokens)
maps each user to a token or a list of tokens; its format and reader are in
ratewarden/tokens.py. Tokens are held as SHA-256 digests and looked up by digest. A
request that names a token the file does not hold is refused, whatever else it carries.
`--user-header H` (off unless given) believes header H only from the front proxy's
addresses (`--trusted-proxy`, loopback by default): anyone else could set it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from ratewarden.vocabulary import MAX_NAME
from ratewarden.wire.tokens import digest, read_tokens

__all__ = ["LOOPBACK", "Identities", "read_tokens"]

LOOPBACK = ("127.0.0.0/8", "::1/128")
Scope = Mapping[str, Any]  # an ASGI request's scope


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
        self._users = {digest(token): user for token, user in tokens.items()}
        self._header = header.lower().encode("latin-1") if header else None
        self._proxies = [ipaddress.ip_network(proxy, strict=False) for proxy in proxies]

    def user_of(self, scope: Scope) -> str | None:
        headers = dict(scope["headers"])  # ASGI: lower-case names
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            # A token that is given but unknown is refused, never passed to the header.
            return self._users.get(digest(token.strip()))
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
