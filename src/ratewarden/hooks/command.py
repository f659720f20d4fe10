"""`ratewarden hook HOST`: the command hook a host runs around each tool call.

It reads the host's payload (stdin, and for agent-code environment variables) with the
host's module, posts the event to the daemon's `/v1/hooks/HOST/decision` (which maps
names, checks or settles, and checks a reused call id as a new call:
ratewarden.service.hooks), and answers the host in its own terms. An allowed call prints
nothing at all (Claude Code reads an explicit "allow" as "skip the user's own permission
prompt"). After the tool ran, the hosts that name the call get it settled.

When the daemon cannot answer (down, too slow, or refusing the request), `--fail open`
(the default) allows the call and says so on stderr; `--fail closed` blocks it with "Tool
guard unavailable; Bash calls are paused". Input the hook cannot read (not JSON, no tool
name) is a broken installation, not a decision: failing open, it is the host's
non-blocking hook error; failing closed, the call is blocked.

A process per tool call pays for every module it imports, so this one imports the
standard library and ratewarden.hooks only: no pydantic, httpx, FastAPI or redis
(tests/unit/test_hook_imports.py; its start is a row of the benchmark). For the same
reason it speaks HTTP/1.1 on a socket of its own: `http.client` imports the `email`
package, which was a third of a hook's start.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ratewarden import vocabulary
from ratewarden.hooks.contract import (
    BadInput,
    HookOutput,
    Host,
    ModelCall,
    ModelDone,
    PostCall,
    PreCall,
    one_line,
)
from ratewarden.hooks.hosts import HOSTS, SUMMARIES
from ratewarden.http import exchange

if TYPE_CHECKING:
    import argparse

# The wire's cap on a check's `args` (wire.bodies.MAX_ARGS_BYTES): larger ones are bounded here
# (arguments.bounded_args) rather than sent to be refused.
MAX_ARGS_BYTES = 64 * 1024


class HookOptions(NamedTuple):
    """The command's flags; `None` falls back to RATEWARDEN_USER / _URL / _TOKEN."""

    user: str | None = None
    team: str | None = None
    url: str | None = None
    token: str | None = None
    fail: str = "open"
    timeout: float = vocabulary.ADAPTER_TIMEOUT_S


class Unanswered(Exception):
    """The daemon gave no decision: unreachable, too slow, or it refused the request."""


class NeedsUser(Unanswered):
    """A request naming no user, from a token that is no user's (422 on `user`)."""


class NotVouched(Exception):
    """The daemon refused the user the hook named (403 on `user`): its token may not act
    as them. A decision, not an outage: the call is refused whatever `--fail` says."""


# -- the command -------------------------------------------------------------------------


def add_parser(commands: Any) -> None:
    """`hook HOST [flags]` under the `ratewarden` command's subcommands."""
    hook = commands.add_parser(
        "hook", help="run as a host agent's tool hook (the host's payload on stdin)"
    )
    hosts = hook.add_subparsers(title="hosts", metavar="HOST", required=True)
    for name, summary in SUMMARIES.items():
        host = hosts.add_parser(name, help=summary, description=summary)
        add_client_flags(
            host,
            user_help="who calls (default: a user token's user; with a service token, the "
            "user the host names, else $RATEWARDEN_USER, else the OS login name)",
            fail_default="open",
        )
        host.set_defaults(run=run_command, host=name)


def add_client_flags(
    parser: argparse.ArgumentParser,
    *,
    user_help: str | None,
    fail_default: str | None,
    several_daemons: bool = False,
) -> None:
    """The flags of a command that asks the daemon on a host's behalf (`ratewarden hook`,
    `ratewarden mcp`): who calls, where the daemon is, and what to do when it cannot
    answer. `user_help` None: no --user (the MCP gateway knows its users otherwise);
    `fail_default` None: $RATEWARDEN_FAIL decides; `several_daemons`: --url repeats."""
    if user_help is not None:
        parser.add_argument("--user", help=user_help)
    parser.add_argument("--team", help="the caller's team, for rules matching or scoped by team")
    if several_daemons:
        parser.add_argument(
            "--url",
            action="append",
            help="a daemon URL; repeat for several on one store (default $RATEWARDEN_URL)",
        )
    else:
        parser.add_argument(
            "--url", help=f"daemon URL (default $RATEWARDEN_URL or {vocabulary.DEFAULT_URL})"
        )
    parser.add_argument("--token", help="API token (default $RATEWARDEN_TOKEN)")
    default = "the default" if fail_default == "open" else "default $RATEWARDEN_FAIL"
    parser.add_argument(
        "--fail",
        choices=["open", "closed"],
        default=fail_default,
        help=f"when the daemon cannot answer: allow (open, {default}) or block (closed)",
    )
    parser.add_argument(
        "--timeout", type=_seconds_flag, default=1.0, help="seconds to wait for the daemon (1)"
    )


def seconds(text: str) -> float:
    """A timeout flag's value: seconds in (0, 60]; ValueError (argparse's way to refuse a
    value with this message) otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 60:
        raise ValueError(f"expected seconds in (0, 60], got {text!r}")
    return value


def cli(argv: Sequence[str]) -> int:
    """`ratewarden hook ...` alone, without building (or importing) the rest of the CLI.

    A well-formed command line (`HOST [--flag value | --flag=value]...`) is read here;
    anything else (help, a mistake, an abbreviated flag) goes to argparse, which says what
    is wrong exactly as `ratewarden --help` documents it. argparse (with `re`) is a tenth
    of a hook's start, paid only then.
    """
    quick = _quick_parse(argv)
    if quick is not None:
        return main(*quick)
    import argparse

    parser = argparse.ArgumentParser(prog="ratewarden")
    add_parser(parser.add_subparsers(title="commands", metavar="COMMAND"))
    return run_command(parser.parse_args(["hook", *argv]))


_FLAGS = frozenset({"user", "team", "url", "token", "fail", "timeout"})


def _quick_parse(argv: Sequence[str]) -> tuple[str, HookOptions] | None:
    """The host and options of a plain, valid command line; None for anything else."""
    if not argv or argv[0] not in HOSTS:
        return None
    given: dict[str, str] = {}
    words = list(argv[1:])
    while words:
        flag, equals, value = words.pop(0).partition("=")
        name = flag.removeprefix("--")
        if not flag.startswith("--") or name not in _FLAGS or name in given:
            return None
        if not equals:
            if not words or words[0].startswith("-"):
                return None
            value = words.pop(0)
        given[name] = value
    timeout = given.pop("timeout", "1")
    if given.get("fail", "open") not in ("open", "closed") or _seconds_or_none(timeout) is None:
        return None
    options = HookOptions(**given, timeout=float(timeout))
    return argv[0], options


def _seconds_flag(text: str) -> float:
    """`seconds`, for argparse: its own error type, so the message is shown."""
    import argparse

    try:
        return seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds_or_none(text: str) -> float | None:
    try:
        return seconds(text)
    except ValueError:  # argparse.ArgumentTypeError is one
        return None


def run_command(args: argparse.Namespace) -> int:
    options = HookOptions(args.user, args.team, args.url, args.token, args.fail, args.timeout)
    return main(args.host, options)


def main(host_name: str, options: HookOptions) -> int:
    """Stdin in, the host's answer out."""
    payload = sys.stdin.buffer.read() if sys.stdin is not None else b""
    output = run(HOSTS[host_name], options, payload, os.environ)
    if output.stdout:
        sys.stdout.write(output.stdout + "\n")
        sys.stdout.flush()
    for line in output.stderr:
        print(line, file=sys.stderr)
    return output.code


def run(host: Host, options: HookOptions, payload: bytes, environ: Mapping[str, str]) -> HookOutput:
    """Read the host's payload, ask the daemon (or settle with it), and answer the host."""
    try:
        event = host.read(payload, environ)
    except BadInput as exc:
        return _unreadable(host, options, str(exc))
    if event is None:
        return host.allow
    if isinstance(event, ModelCall | ModelDone):
        return _model(host, options, event, environ)
    settings = vocabulary.ClientSettings.read(environ)
    url = options.url or settings.url
    body = _event(event, options, settings)
    try:
        answer = _post(url, f"/v1/hooks/{host.name}/decision", body, options, settings)
    except Unanswered as exc:
        return _unanswered(host, event, options, url, str(exc))
    except NotVouched as exc:
        return _not_vouched(host, event, str(exc))
    notes = tuple(one_line(f"ratewarden: {note}") for note in answer.get("notes", ()))
    decision = answer.get("decision")
    if decision not in ("deny", "ask"):
        return host.allow._replace(stderr=(*notes, *_opened(host, event, environ)))
    refusal = host.refuse(decision, str(answer.get("message", "")), str(answer.get("detail", "")))
    return refusal._replace(stderr=(*refusal.stderr, *notes))


# -- model calls (Gemini CLI's BeforeModel and AfterModel) -----------------------------------

HOLDING = frozenset({"concurrency", "budget"})  # vocabulary.HOLDING_KINDS, by name


def _model(
    host: Host, options: HookOptions, event: ModelCall | ModelDone, environ: Mapping[str, str]
) -> HookOutput:
    """Check a model call (`POST /v1/check`, `kind: model`), keeping its id in the hook
    ledger when it holds a reservation; or settle the call its answer ends, with the
    provider's usage (`POST /v1/calls/ID/settle`)."""
    settings = vocabulary.ClientSettings.read(environ)
    if isinstance(event, ModelDone):
        return _settle_model(host, options, event, environ, settings)
    refuse = host.refuse_model or (lambda decision, message: host.refuse(decision, message, ""))
    try:
        answer = _check_model(host, options, event, settings)
    except Unanswered as exc:
        note = one_line(f"ratewarden: {exc}; failing {options.fail}")
        if options.fail == "open":
            return host.allow._replace(stderr=(note,))
        refusal = refuse("deny", vocabulary.unavailable(event.model))
        return refusal._replace(stderr=(*refusal.stderr, note))
    except NotVouched as exc:
        refusal = refuse("deny", vocabulary.NOT_VOUCHED.format(field="--user"))
        return refusal._replace(stderr=(one_line(f"ratewarden: {exc}"),))
    if answer.get("allowed") is not True:
        decision: vocabulary.DecisionName = "ask" if answer.get("decision") == "ask" else "deny"
        return refuse(decision, str(answer.get("message", "")))
    call_id = answer.get("call_id")
    if not _holds(answer) or not isinstance(call_id, str):
        return host.allow
    return _keep_model_call(host, event, call_id, environ)


def _check_model(
    host: Host, options: HookOptions, event: ModelCall, settings: Any
) -> dict[str, Any]:
    """The daemon's answer to the model call's check. Who calls, as for a tool call:
    `--user` is a claim the token must allow; without it a user token is its user, and a
    service token (or none) takes RATEWARDEN_USER, else the login name."""
    url = options.url or settings.url
    token = options.token or settings.token
    default = (settings.user or _login_name()) if options.user is None else None
    check = {
        "user": options.user if options.user is not None or token is not None else default,
        "team": options.team,
        "kind": "model",
        "model": event.model,
        "input_tokens": event.input_tokens,
        "max_output_tokens": event.max_output_tokens,
        "session": event.session,
        "call_id": vocabulary.call_id(host.name),
    }
    sent = {k: _sendable(k, v) for k, v in check.items() if v is not None}
    try:
        return _post(url, "/v1/check", sent, options, settings)
    except NeedsUser:  # a service token: the default user, as a tool call's hook sends
        named = {**sent, "user": _sendable("user", default)}
        return _post(url, "/v1/check", named, options, settings)


def _holds(answer: Mapping[str, Any]) -> bool:
    """Whether an allowed call holds something until settled (CheckResponse.holds)."""
    given = answer.get("limits")
    limits = given if isinstance(given, list) else []
    return answer.get("send_result") is True or any(
        isinstance(limit, dict) and limit.get("kind") in HOLDING for limit in limits
    )


def _keep_model_call(
    host: Host, event: ModelCall, call_id: str, environ: Mapping[str, str]
) -> HookOutput:
    """Keep the allowed call's id for the AfterModel that ends its answer."""
    from ratewarden.hooks import ledger

    try:
        where = ledger.folder(host.name, environ)
        if where is None:
            raise OSError("no folder for the hook ledger")
        ledger.keep(where, event.session or "", (ledger.key(event.model),), call_id, _now_ms())
    except OSError as exc:
        lost = f"ratewarden: could not keep model call {call_id} for its AfterModel ({exc})"
        return host.allow._replace(stderr=(one_line(f"{lost}; it is charged its reservation"),))
    return host.allow


def _settle_model(
    host: Host, options: HookOptions, event: ModelDone, environ: Mapping[str, str], settings: Any
) -> HookOutput:
    """Settle the call the ledger kept for this model's answer, with its usage."""
    from ratewarden.hooks import ledger

    where = ledger.folder(host.name, environ)
    found_by = (ledger.key(event.model),)  # the key digests: hashlib, only now
    call_id = ledger.take(where, event.session or "", found_by, _now_ms()) if where else None
    if call_id is None:  # refused, held nothing, or kept nowhere
        return host.allow
    body: dict[str, Any] = {"status": "ok"}
    if event.usage is not None:
        body["usage"] = dict(event.usage)
    path = vocabulary.SETTLE_PATH.format(call_id=_quoted(call_id))
    try:
        _post(options.url or settings.url, path, body, options, settings)
    except (Unanswered, NotVouched) as exc:
        return HookOutput(stderr=(one_line(f"ratewarden: could not settle {call_id}: {exc}"),))
    return host.allow


def _quoted(call_id: str) -> str:
    """A call id as one path segment (the client's `quote(call_id, safe="")`, without
    importing urllib): every byte outside the unreserved set percent-encoded."""
    unreserved = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
    return "".join(chr(b) if b in unreserved else f"%{b:02X}" for b in call_id.encode())


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


def _opened(host: Host, event: PreCall | PostCall, environ: Mapping[str, str]) -> tuple[str, ...]:
    """A call the daemon allowed: the host keeps what its PostToolUse will need, else the
    call is left to its rules' leases (a note)."""
    if host.opened is None or not isinstance(event, PreCall):
        return ()
    try:
        host.opened(event, environ)
    except OSError as exc:
        lost = f"ratewarden: could not keep call {event.call_id} for its PostToolUse ({exc})"
        return (one_line(f"{lost}; its rules' leases free it"),)
    return ()


def _event(event: PreCall | PostCall, options: HookOptions, settings: Any) -> dict[str, Any]:
    """The event as `/v1/hooks/HOST/decision` takes it (wire.HookEvent).

    Who calls: `--user`, if given, is a claim the token must allow. Otherwise the token
    says: a user token is its user (the daemon fills it in), and a service token takes
    `default_user`: the host's user, else $RATEWARDEN_USER, else the login name (the
    order used before user tokens). A user token ignores it, so with one the hook needs
    no user configured, and a stray RATEWARDEN_USER changes nothing.
    """
    body: dict[str, Any] = {"user": options.user, "team": options.team}
    if isinstance(event, PreCall) and options.user is None:
        body["default_user"] = event.user or settings.user or _login_name()
    if isinstance(event, PostCall):
        body.update(
            finished=True,
            call_id=event.call_id,
            status=event.status,
            duration_ms=event.duration_ms,
            cost=event.cost,
            result_digest=event.result_digest,
        )
    else:
        body.update(tool=event.tool, session=event.session, call_id=event.call_id)
        body["args"], body["args_cut"] = _args(event.args)
    return {key: _sendable(key, value) for key, value in body.items() if value not in (None, [])}


_NAMES = frozenset({"user", "default_user", "team", "tool", "session", "call_id"})


def _sendable(key: str, value: Any) -> Any:
    """A name or id JSON can carry: one with a lone surrogate (a `\\ud800` in the host's
    JSON) cannot be read back as text, so it goes mapped, exactly as the daemon maps any
    name it cannot take (wire/names.py: `<prefix>~<digest>`). Args are the
    daemon's to read or leave out (`_args`)."""
    if key not in _NAMES or not isinstance(value, str) or vocabulary.sendable(value):
        return value
    limit = vocabulary.MAX_CALL_ID if key == "call_id" else vocabulary.MAX_NAME
    return vocabulary.tagged(value, vocabulary.digest(value), limit)


def _args(value: object) -> tuple[object, list[str]]:
    """The tool's input as sent, and the paths of it that were cut.

    JSON text or an object within the wire's cap goes as it is (the daemon bounds what
    it would still refuse: too deep, `1e400`). Anything larger, or that cannot be written
    as JSON text, is bounded here (`arguments.bounded_args`): a call is never sent as one
    without arguments because it had too much of them.
    """
    if isinstance(value, bytes | bytearray):
        with contextlib.suppress(UnicodeDecodeError):  # bounded below: unreadable, not absent
            value = value.decode()
    if value is None or _fits(value):
        return value, []
    from ratewarden.arguments import bounded_args  # seldom needed: not at import

    bounded = bounded_args(value)
    return (None, []) if bounded is None else (bounded.value, list(bounded.cut))


def _fits(value: object) -> bool:
    """Whether `value` is text or an object the wire's cap takes as it is."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, dict):
        try:
            text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            return False
    else:
        return False
    try:
        return len(text.encode()) <= MAX_ARGS_BYTES
    except UnicodeEncodeError:  # a lone surrogate: not text the daemon can read
        return False


def _login_name() -> str:
    import getpass  # not at import: most hooks are given --user or RATEWARDEN_USER

    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name: a container user without a passwd entry
        return f"uid-{os.getuid()}"


def _post(
    url: str, path: str, body: dict[str, Any], options: HookOptions, settings: Any
) -> dict[str, Any]:
    """POST `body` as JSON to the daemon; its JSON answer, or Unanswered."""
    token = options.token or settings.token
    if token is not None and not token.isprintable():
        raise Unanswered("the token holds a control character")
    try:
        status, raw = exchange.post(url, path, json.dumps(body).encode(), token, options.timeout)
    except (OSError, ValueError) as exc:
        raise Unanswered(f"daemon unreachable at {url} ({exc or type(exc).__name__})") from None
    if status == 403 and _names_user(raw):
        raise NotVouched(_error_message(raw))
    if status == 422 and "user" not in body and _names_user(raw):
        raise NeedsUser(_error_message(raw))
    if status != 200:
        raise Unanswered(f"the daemon refused the hook ({status}: {_error_message(raw)})")
    try:
        answer = json.loads(raw)
    except ValueError:
        raise Unanswered("the daemon's answer is not JSON") from None
    if not isinstance(answer, dict):
        raise Unanswered("the daemon's answer is not a JSON object")
    return answer


def _names_user(raw: bytes) -> bool:
    """Whether an error answer names the field `user` (vouch.py's 403)."""
    try:
        fields = json.loads(raw).get("fields", [])
        return any(isinstance(f, dict) and f.get("field") == "user" for f in fields)
    except (ValueError, AttributeError):
        return False


def _error_message(raw: bytes) -> str:
    try:
        return str(json.loads(raw).get("message", ""))[:300]
    except (ValueError, AttributeError):
        return raw[:300].decode(errors="replace")


def _unanswered(
    host: Host, event: PreCall | PostCall, options: HookOptions, url: str, reason: str
) -> HookOutput:
    if isinstance(event, PostCall):  # the daemon is away: the call's lease frees it
        return HookOutput(
            stderr=(one_line(f"ratewarden: could not settle {event.call_id}: {reason}"),)
        )
    note = one_line(f"ratewarden: {reason}; failing {options.fail}")
    if options.fail == "open":
        return host.allow._replace(stderr=(note,))
    refusal = host.refuse("deny", vocabulary.unavailable(event.tool), "")
    return refusal._replace(stderr=(*refusal.stderr, note))


def _not_vouched(host: Host, event: PreCall | PostCall, reason: str) -> HookOutput:
    note = one_line(f"ratewarden: the daemon refused the hook's user: {reason}")
    if isinstance(event, PostCall):
        return HookOutput(stderr=(note,))
    refusal = host.refuse("deny", vocabulary.NOT_VOUCHED.format(field="--user"), "")
    return refusal._replace(stderr=(*refusal.stderr, note))


def _unreadable(host: Host, options: HookOptions, reason: str) -> HookOutput:
    reason = one_line(reason)  # agent-code shows only the first line
    if options.fail == "open":
        note = f"ratewarden: {reason}; failing open"
        return HookOutput(code=host.unreadable_open_code, stderr=(note,))
    return host.refuse_unreadable(vocabulary.UNREADABLE.format(host=host.name, reason=reason))
