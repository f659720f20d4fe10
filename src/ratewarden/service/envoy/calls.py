"""What Envoy asks about, as the call a `POST /v1/check` would name (docs/envoy.md).

Both protocols end here in a `CheckRequest`, validated by the same model as the HTTP
API's body, so a name Envoy passes on is held to the same caps (length, control
characters) and refused naming where it came from: a descriptor entry, a context
extension, a header or the MCP request. Nothing here decides or counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ratewarden.vocabulary import METADATA_FLAGS, CallKind
from ratewarden.wire.bodies import CheckRequest
from ratewarden.wire.bounded import TooManyItems, read_json

# A descriptor entry's key -> the check's field. `model` makes it a model call.
NAMED = ("user", "tool", "model", "session", "team", "host", "call_id")
FLAGS = {"true": True, "false": False}
KNOWN_KEYS = (*NAMED, *METADATA_FLAGS, "tag")
MICROS = 1_000_000  # a tool call's hits_addend is its cost in millionths of the currency
MCP = "envoy.filters.http.mcp"  # the namespace of Envoy's MCP filter's dynamic metadata
TOOLS_CALL = "tools/call"


class Refused(Exception):
    """A request that names no call: INVALID_ARGUMENT (or `code`), its message naming why."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.code = code


def validated(fields: dict[str, Any], where: Mapping[str, str]) -> CheckRequest:
    """`fields` as a CheckRequest, or Refused naming the first bad field by `where` it came
    from (a field missing from `where` by its own name)."""
    try:
        return CheckRequest.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field = str(error["loc"][0]) if error["loc"] else "request"
        raise Refused(f"{where.get(field, field)}: {error['msg']}") from None


# The rate limit service -----------------------------------------------------------------


def from_descriptors(
    domain: str, descriptors: list[list[tuple[str, str]]], hits: int
) -> CheckRequest:
    """One call from all of a ShouldRateLimit's descriptors (each its entries' key, value),
    `hits` its hits_addend (0: none given)."""
    if not descriptors:
        raise Refused("descriptors: a request names at least one descriptor")
    merged, tags = _merged(descriptors)
    if domain and "model" not in merged:  # a model call carries no metadata
        tags.insert(0, f"domain:{domain}")
    named = {k: f"descriptor entry {k!r}" for k in merged}
    named["metadata"] = "descriptor entries 'tag' and the flags (with the domain's tag)"
    return validated(_fields(merged, tags, hits), named)


def _merged(descriptors: list[list[tuple[str, str]]]) -> tuple[dict[str, str], list[str]]:
    """The descriptors' entries as one call's: each key once (two values refused), and
    every `tag`."""
    merged: dict[str, str] = {}
    tags: list[str] = []
    for index, entries in enumerate(descriptors):
        for key, value in entries:
            where = f"descriptors[{index}] entry {key!r}"
            if key == "tag":
                tags.append(value)
            elif key not in KNOWN_KEYS:
                raise Refused(f"{where}: not a key ratewarden knows ({', '.join(KNOWN_KEYS)})")
            elif merged.setdefault(key, value) != value:
                raise Refused(f"{where}: {value!r}, and {merged[key]!r} in another descriptor")
    return merged, tags


def _fields(merged: dict[str, str], tags: list[str], hits: int) -> dict[str, Any]:
    fields: dict[str, Any] = {k: merged[k] for k in NAMED if k in merged}
    flags = {}
    for name in METADATA_FLAGS:
        if name in merged:
            if merged[name] not in FLAGS:
                raise Refused(f"descriptor entry {name!r}: true or false, not {merged[name]!r}")
            flags[name] = FLAGS[merged[name]]
    if (flags or tags) and "model" in merged:
        said = "tag" if tags else next(iter(flags))
        raise Refused(f"descriptor entry {said!r}: a model call carries no tool metadata")
    if flags or tags:
        fields["metadata"] = {**flags, "tags": tags}
    if "model" in merged:
        fields["kind"] = CallKind.MODEL
        if hits > 0:
            fields["input_tokens"] = hits
    elif hits > 1:
        fields["cost"] = hits / MICROS
    return fields


# External authorization -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class McpCall:
    """A JSON-RPC `tools/call` through Envoy: its id, for the refusal's answer."""

    id: int | str | None


def from_authorization(
    headers: Mapping[str, str],
    extensions: Mapping[str, str],
    mcp: Mapping[str, Any] | None,
    body: bytes,
    user_header: str,
) -> tuple[CheckRequest, McpCall | None] | None:
    """The call an ext_authz Check asks about, with its MCP request if it is one; None for
    an MCP message that is not a tool call (it passes, as through the MCP gateway)."""
    rpc = mcp if mcp else _rpc_body(headers, body)
    fields: dict[str, Any] = {
        k: extensions[k] for k in ("tool", "host", "team", "session") if k in extensions
    }
    where = {k: f"context extension {k!r}" for k in fields}
    found = None
    if rpc is not None:
        if rpc.get("method") != TOOLS_CALL:
            return None
        found = McpCall(_rpc_id(rpc.get("id")))
        fields["tool"], arguments = _tool_call(rpc)
        where["tool"] = "the MCP request's params.name"
        if arguments is not None:
            fields["args"] = arguments
            where["args"] = "the MCP request's params.arguments"
    elif "tool" not in fields:
        raise Refused("no tool: name one in the route's ext_authz context_extensions (tool)")
    if user_header in headers:  # else the credential's own user, or refused (server.py)
        fields["user"] = headers[user_header]
    where["user"] = f"header {user_header!r}"
    return validated(fields, where), found


def _tool_call(rpc: Mapping[str, Any]) -> tuple[Any, Any]:
    """A tools/call's name and arguments, from the MCP filter's metadata (flat keys such
    as `params.name`) or from the JSON-RPC body (nested `params`)."""
    params = rpc.get("params")
    if isinstance(params, Mapping):
        return params.get("name"), params.get("arguments")
    return rpc.get("params.name"), rpc.get("params.arguments")


def _rpc_id(value: Any) -> int | str | None:
    """The request's id as the client sent it: the MCP filter passes a number as a float
    (`3.0`), and the SDK client matches an answer to its request only by an equal int."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value if isinstance(value, int | str) else None


def _rpc_body(headers: Mapping[str, str], body: bytes) -> Mapping[str, Any] | None:
    """The JSON-RPC request in a body Envoy sent (`with_request_body`), if it is one."""
    if not body or "json" not in headers.get("content-type", ""):
        return None
    try:
        message = read_json(body)
    except (TooManyItems, json.JSONDecodeError, UnicodeDecodeError):
        raise Refused("the request's body is not a JSON-RPC message ratewarden can read") from None
    if isinstance(message, Mapping) and message.get("jsonrpc") == "2.0" and "method" in message:
        return message
    return None
