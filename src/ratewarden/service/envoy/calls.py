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

from ratewarden import vocabulary
from ratewarden.arguments import MAX_CUT, WHOLE_ARGS
from ratewarden.vocabulary import METADATA_FLAGS, CallKind
from ratewarden.wire.bodies import CheckRequest
from ratewarden.wire.bounded import TooManyItems, read_json
from ratewarden.wire.names import call_args

# A descriptor entry's key -> the check's field. `model` makes it a model call.
NAMED = ("user", "tool", "model", "session", "team", "host", "call_id")
FLAGS = {"true": True, "false": False}
KNOWN_KEYS = (*NAMED, *METADATA_FLAGS, "tag")
MICROS = 1_000_000  # a tool call's hits_addend is its cost in millionths of the currency
MCP = "envoy.filters.http.mcp"  # the namespace of Envoy's MCP filter's dynamic metadata
TOOLS_CALL = "tools/call"


class Refused(Exception):
    """A request that names no call ratewarden can decide, its message naming why.

    It is refused in the protocol (OVER_LIMIT, a denied response), not with a gRPC error:
    Envoy answers an error by its failure mode, by default letting the request through,
    and a client that can make a descriptor invalid (an oversized header) would pass
    unchecked. `code` is the gRPC status it stands for, in the log and the metric;
    `status` the HTTP status ext_authz answers with."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT", status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


TOO_LARGE = (
    "its request is larger than Envoy's MCP filter reads (max_request_body_size), and it "
    "does not say it calls no tool"
)


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
    a request that calls no tool on an MCP route (one naming no `tool`): its other
    messages, its stream (GET) and its end (DELETE) pass, as through the MCP gateway."""
    fields: dict[str, Any] = {k: extensions[k] for k in PLAIN_KEYS if k in extensions}
    where = {k: f"context extension {k!r}" for k in fields}
    rpc, exact = _rpc_message(headers, body, mcp)
    found = None
    if rpc is not None:
        if rpc.get("method") != TOOLS_CALL:
            if not exact and rpc.get("is_exceeding_limit") is True:
                # The filter stopped reading before it knew the method: a tools/call
                # whose `method` comes after padding would reach the server unchecked.
                raise Refused(vocabulary.TOO_LARGE.format(reason=TOO_LARGE), status=413)
            return None
        found = McpCall(_rpc_id(rpc.get("id")))
        _add_tool_call(fields, where, rpc, exact)
    elif "tool" not in fields:
        return None
    if user_header in headers:  # else the credential's own user, or refused (server.py)
        fields["user"] = headers[user_header]
    where["user"] = f"header {user_header!r}"
    return validated(fields, where), found


PLAIN_KEYS = ("tool", "host", "team", "session")


def _add_tool_call(
    fields: dict[str, Any], where: dict[str, str], rpc: Mapping[str, Any], exact: bool
) -> None:
    """A tools/call's name and arguments into `fields`. From the MCP filter's metadata
    they are not exact: numbers arrive as floats (whole ones are made ints again), lists
    are dropped, and past the filter's body limit the arguments are partial, so they are
    sent as cut (`args_cut`: a condition on them is decided as for a cut argument)."""
    params = rpc.get("params")
    params = params if isinstance(params, Mapping) else {}
    fields["tool"] = params.get("name")
    where["tool"] = "the MCP request's params.name"
    arguments = params.get("arguments")
    sent = call_args(arguments if exact else _whole_numbers(arguments))
    cut = list(sent.cut) if sent is not None else []
    if sent is not None:  # a bounded copy, as every client sends (docs/policy.md)
        fields["args"] = sent.value
        where["args"] = "the MCP request's params.arguments"
    if not exact and rpc.get("is_exceeding_limit") is True:
        cut = [WHOLE_ARGS]
    if cut:
        fields["args_cut"] = cut if len(cut) <= MAX_CUT else [WHOLE_ARGS]


def _whole_numbers(value: Any) -> Any:
    """Protobuf's Struct holds every number as a double: 7 arrives as 7.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _rpc_id(value: Any) -> int | str | None:
    """The request's id as the client sent it: the MCP filter passes a number as a float
    (`3.0`), and the SDK client matches an answer to its request only by an equal int."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value if isinstance(value, int | str) else None


def _rpc_message(
    headers: Mapping[str, str], body: bytes, mcp: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, bool]:
    """The JSON-RPC request, and whether it is exact: from the body Envoy sent
    (`with_request_body`) when it reads as one, else the MCP filter's metadata."""
    if body and "json" in headers.get("content-type", ""):
        try:
            message = read_json(body)
        except (TooManyItems, json.JSONDecodeError, UnicodeDecodeError):
            message = None  # a body Envoy cut (or garbage): the metadata, if any, says more
            if not mcp:
                raise Refused("the request's body is not JSON ratewarden can read") from None
        if isinstance(message, list):
            raise Refused("a JSON-RPC batch: send one message per request")
        if isinstance(message, Mapping) and message.get("jsonrpc") == "2.0":
            return message, True
    return (mcp, False) if mcp else (None, False)
