"""What a host's hook contract is made of, and the helpers every payload reader shares.

A host's module reads its payload into an `Event` (a call about to run, one that
finished, or nothing to do), and words a refusal (`deny` or `ask`, with ratewarden's
message) as a `HookOutput`: what a command hook exits with and prints. A host that posts
its payload over HTTP also says how that output is sent as an HTTP answer (`http`).

Standard library only, and its cheap part: the command hook imports this on every tool
call, so these are named tuples (dataclasses import `inspect`, a third of a hook's start).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ratewarden.vocabulary import DecisionName


class PreCall(NamedTuple):
    """A tool call about to run; `args` as the host wrote them (names.call_args reads
    them), `user` when the host names one (Cursor's e-mail)."""

    tool: str
    session: str | None = None
    call_id: str | None = None
    args: object = None  # never shown (see __repr__): they may hold secrets
    user: str | None = None

    def __repr__(self) -> str:
        return (
            f"PreCall(tool={self.tool!r}, session={self.session!r}, "
            f"call_id={self.call_id!r}, user={self.user!r})"
        )


class PostCall(NamedTuple):
    """A tool call that finished (or was stopped after ratewarden allowed it)."""

    call_id: str
    status: str | None = None
    duration_ms: float | None = None
    cost: float | None = None
    result_digest: str | None = None  # arguments.result_digest of what the tool returned


class ModelCall(NamedTuple):
    """A model call about to be sent (Gemini CLI's BeforeModel): checked as `kind: model`."""

    model: str
    session: str | None = None
    input_tokens: int = 0  # estimated from the request's text
    max_output_tokens: int | None = None  # the request's own limit; None: the policy's


class ModelDone(NamedTuple):
    """A model call's answer complete, with the usage the provider reported (None: it
    reported none); settles the call its ModelCall opened (hooks/ledger.py)."""

    model: str
    session: str | None = None
    usage: Mapping[str, int] | None = None  # the settle's `usage`, genai-prices' names


Event = PreCall | PostCall | ModelCall | ModelDone | None  # None: nothing to do for it


class HookOutput(NamedTuple):
    """What the hook process says: its exit status, stdout, and stderr lines."""

    code: int = 0
    stdout: str = ""
    stderr: tuple[str, ...] = ()


class HttpAnswer(NamedTuple):
    """A hook's output as the answer to a host's HTTP hook: status and JSON or text body."""

    status: int = 200
    body: str = ""
    media_type: str = "application/json"


class BadInput(Exception):
    """The host's payload cannot be read: a broken installation, not a decision."""


Reader = Callable[[bytes, Mapping[str, str]], Event]


class Host(NamedTuple):
    """How one host speaks.

    - `read`: its payload (and `context`: the environment of a command hook, or the query
      of an HTTP hook) into an event; BadInput when it cannot.
    - `refuse`: a refusal (`deny` or `ask`), its message and its one-line detail
      (docs/api.md, "A refusal's detail"), as the host reads one; a host with a place
      its user sees (a `systemMessage`) puts the detail there, others leave it out.
    - `refuse_unreadable`: the answer when the payload cannot be read, failing closed.
    - `unreadable_open_code`: the exit status for that, failing open (a hook error the
      host does not take as a veto).
    - `context`: what `read` takes from outside the payload (agent-code's event and tool
      are in environment variables): query name -> variable name. A command hook sends
      the variables' values under the query names; an HTTP hook's URL carries them.
    - `http`: how the host reads the answer to its HTTP hook; None if it has none.
    - `allow`: what lets a call run (and answers any event there is nothing to say to):
      nothing at all, for most hosts; Cursor takes no output as a failed hook (refused
      by a hook set `failClosed`), so it gets `{}`, which leaves its own approval alone.
    - `refuse_model`: a refused model call (ModelCall), as the host reads one; None: as
      `refuse` words a tool call's.
    - `opened`: told of a call the daemon allowed (and the command hook's environment),
      for a host whose PostToolUse cannot name the call otherwise (Codex keeps its id:
      hooks/ledger.py); OSError when it could not (a note on stderr).
    """

    name: str
    read: Reader
    refuse: Callable[[DecisionName, str, str], HookOutput]
    refuse_unreadable: Callable[[str], HookOutput]
    unreadable_open_code: int
    context: Mapping[str, str] = {}  # a default never mutated
    http: Callable[[HookOutput], HttpAnswer] | None = None
    allow: HookOutput = HookOutput()
    opened: Callable[[PreCall, Mapping[str, str]], None] | None = None
    refuse_model: Callable[[DecisionName, str], HookOutput] | None = None


# -- reading payloads --------------------------------------------------------------------


def json_object(payload: bytes) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        data = _read_hard(payload)
    if not isinstance(data, dict):
        raise BadInput(f"stdin is JSON but not an object: {type(data).__name__}")
    return data


def _read_hard(payload: bytes) -> Any:
    """A payload `json.loads` refused, read as the daemon reads one (`arguments.read_json`:
    5 000 digits or 1 100 levels of nesting in the args are cut, not unreadable), or
    BadInput. Imported only here: `arguments` costs a hook's start a fifth (dataclasses,
    hashlib), and almost every payload is plain JSON."""
    from ratewarden.arguments import read_json

    try:
        return read_json(payload)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"stdin is not JSON: {exc}") from None


def text(value: Any, max_length: int) -> str | None:
    """An optional short field from the payload; dropped when it would not be valid."""
    if isinstance(value, str) and 0 < len(value) <= max_length:
        return value
    return None


def string(value: Any) -> str | None:
    """An optional name or id from the payload, as the host sent it (names.py maps it)."""
    return value if isinstance(value, str) and value else None


def tool_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadInput(f"no tool name in {where}")
    return value


def duration(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def digest_of(data: Mapping[str, Any], key: str) -> str | None:
    """The `result_digest` of the tool's result the host passed under `key` (None: it
    passed none). A hook process cannot know whether the daemon wants it (the check was
    another process), so it sends it whenever the host shows the result; only the
    digest leaves the hook, never the result. `ratewarden.arguments` (hashlib, dataclasses)
    is imported only then: a pre-call hook's start stays light (tests/unit/test_hook_imports)."""
    if key not in data:
        return None
    from ratewarden.arguments import result_digest

    return result_digest(data[key])


def event_name(data: dict[str, Any], key: str = "hook_event_name") -> str:
    event = data.get(key)
    if not isinstance(event, str) or not event:
        raise BadInput(f"no {key} in the payload")
    return event


def one_line(message: str) -> str:
    return " ".join(message.split())
