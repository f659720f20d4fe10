"""The `ratewarden` command: serve, check, settle, usage, hook, policy check, policy explain
(and override, reset: cli_override.py, cli_reset.py).

Exit codes of `check`: 0 allow, 1 deny (reason on stderr), 3 ask, 4 daemon unreachable,
2 bad usage (a flag, or a request the daemon refused). `hook HOST` answers in the host's
own terms instead (see `ratewarden.hooks`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ratewarden import __version__, cli_override, cli_reset
from ratewarden.hooks import command as hook_command
from ratewarden.vocabulary import METADATA_FLAGS, ClientSettings

if TYPE_CHECKING:
    from pydantic import ValidationError

    from ratewarden.settings import Settings

EXIT_ALLOW, EXIT_DENY, EXIT_USAGE, EXIT_ASK, EXIT_UNREACHABLE = 0, 1, 2, 3, 4
# What the `daemon` extra brings, imported by `serve` and `policy` (a host installs only the
# client: there, these commands say what to install instead of failing on an import).
DAEMON_MODULES = ("fastapi", "uvicorn", "redis", "pydantic_settings", "prometheus_client",
                  "yaml", "re2", "fastapi_offline")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["hook"]:
        # A process per tool call: only what a hook needs is imported (hooks/command.py).
        from ratewarden.hooks import command

        return command.cli(given[1:])
    from pydantic import ValidationError

    parser = build_parser()
    args = parser.parse_args(given)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "daemon_command", None) and (missing := _missing_daemon_module()):
        return _usage_error(
            f"{args.daemon_command} needs the daemon's dependencies (no module {missing!r}): "
            "pip install 'ratewarden[daemon]' (from a clone: pip install '.[daemon]')"
        )
    try:
        code: int = args.run(args)
    except ValidationError as exc:
        return _usage_error(_settings_problem(exc))
    except BrokenPipeError:  # `ratewarden usage ... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error
        return 0
    return code


def _missing_daemon_module() -> str | None:
    return next((name for name in DAEMON_MODULES if importlib.util.find_spec(name) is None), None)


def client_target(args: argparse.Namespace) -> ClientSettings:
    """The daemon's URL and token: the flags over RATEWARDEN_URL and RATEWARDEN_TOKEN, read
    as the client reads them (no pydantic-settings: a host may run `check`)."""
    return ClientSettings.read()._replace(**_given(args, "url", "token"))


def _settings(**given: Any) -> Settings:
    """The settings, from `given` flags over the environment (pydantic-settings loads only
    for the commands that read them: never for a hook)."""
    from ratewarden.settings import Settings

    return Settings(**given)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ratewarden", description="Guard AI-agent tool calls.")
    parser.add_argument("--version", action="version", version=f"ratewarden {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_serve(commands)
    _add_check(commands)
    _add_settle(commands)
    _add_usage(commands)
    hook_command.add_parser(commands)
    _add_mcp_help(commands)
    _add_policy(commands)
    cli_override.add_parser(commands, _add_client_flags)
    cli_reset.add_parser(commands, _add_client_flags)
    return parser


def _add_mcp_help(commands: Any) -> None:
    """`mcp`, for --help only: `ratewarden mcp` runs from __main__ (ratewarden.mcp.stdio)."""
    commands.add_parser(
        "mcp",
        help="MCP servers, their tool calls checked (the mcp extra): over stdio, "
        "mcp [--user U] -- COMMAND ARGS; as a shared gateway, mcp --listen HOST:PORT "
        "--server NAME=URL|COMMAND --tokens FILE (see ratewarden mcp --listen x:1 --help)",
    )


# -- serve ---------------------------------------------------------------------------


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the daemon")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8470)")
    serve.add_argument("--workers", type=int, help="worker processes (default 1)")
    serve.add_argument("--store-url", help="memory:// (default), redis://, rediss://, unix://")
    serve.add_argument("--policy", help="policy file (default ./ratewarden.yaml, else the example)")
    serve.add_argument("--fail", choices=["open", "closed"], help="answer when the store is down")
    serve.add_argument("--store-timeout-ms", type=int, help="store timeout (default 100)")
    serve.add_argument("--log-format", choices=["text", "json"])
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    tokens = "(repeatable; replaces $RATEWARDEN_%s, safer since flags show in `ps`)"
    serve.add_argument(
        "--api-token",
        dest="api_tokens",
        action="append",
        metavar="TOKEN",
        help="bearer token of the check role " + tokens % "API_TOKENS",
    )
    serve.add_argument(
        "--admin-token",
        dest="admin_tokens",
        action="append",
        metavar="TOKEN",
        help="bearer token of the admin role " + tokens % "ADMIN_TOKENS",
    )
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=None,
        help="allow a non-loopback --host with no tokens (auth off)",
    )
    serve.add_argument(
        "--reload-interval",
        dest="reload_interval_s",
        type=float,
        metavar="SECONDS",
        help="seconds between checks of the policy file for changes (default 2; 0: off)",
    )
    serve.add_argument(
        "--request-timeout",
        dest="request_timeout_s",
        type=float,
        metavar="SECONDS",
        help="seconds a connection has to send a whole request, else it is closed (default 5)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="open connections per process (default: the open-file limit minus a reserve)",
    )
    serve.set_defaults(run=_serve, daemon_command="serve")


def _serve(args: argparse.Namespace) -> int:
    from ratewarden.logs import configure_audit, configure_logging
    from ratewarden.policy import PolicyError
    from ratewarden.service.auth import bind_problem
    from ratewarden.service.connections import NoRoomForConnections, connection_limits

    given = _given(args, "host", "port", "workers", "store_url", "policy", "fail",
                   "store_timeout_ms", "log_format", "log_level", "insecure_no_auth",
                   "reload_interval_s", "request_timeout_s", "max_connections")  # fmt: skip
    for name, tokens in _given(args, "api_tokens", "admin_tokens").items():
        given[name] = ",".join(tokens)  # split like the environment's comma-separated lists
    settings = _settings(**given)
    problem = bind_problem(settings)
    if problem is not None:
        return _usage_error(problem)
    if settings.workers > 1 and settings.store_url.startswith("memory:"):
        return _usage_error(
            "the embedded memory:// store lives in one process; use --workers 1, "
            "or a shared store such as --store-url redis://localhost:6379/0"
        )
    try:
        connection_limits(settings)  # a file limit with no room: refused before anything runs
    except NoRoomForConnections as exc:
        return _usage_error(str(exc))
    configure_logging(settings.log_format, settings.log_level)
    configure_audit(settings.audit_log)
    try:
        return _run_uvicorn(settings)
    except PolicyError as exc:
        print(f"cannot load the policy:\n{exc}", file=sys.stderr)
        return EXIT_USAGE


def _run_uvicorn(settings: Settings) -> int:
    import uvicorn

    from ratewarden.service.app import create_app, load_configured_policy
    from ratewarden.service.connections import GuardedHttpProtocol, install
    from ratewarden.store import StoreURLError

    try:
        policy = load_configured_policy(settings)  # fail fast, before binding a port
        app = create_app(settings, policy=policy) if settings.workers == 1 else None
    except StoreURLError as exc:
        return _usage_error(str(exc))
    install(settings)  # workers derive the same limits from the environment
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_config": None,
        "access_log": False,
        # A deadline on every request and a cap on connections (service/connections.py).
        "http": GuardedHttpProtocol,
    }
    if app is not None:
        uvicorn.run(app, **options)
    else:
        # Workers import the app themselves; they read the same settings from the environment,
        # and write their metrics where /metrics in any worker can merge them.
        os.environ.update(_as_environment(settings))
        created = _prepare_multiprocess_metrics()
        try:
            uvicorn.run(
                "ratewarden.service.app:create_app_from_env",
                factory=True,
                workers=settings.workers,
                **options,
            )
        finally:
            if created:  # ours: remove it; an operator's directory stays
                shutil.rmtree(created, ignore_errors=True)
    return 0


def _prepare_multiprocess_metrics() -> str | None:
    """prometheus-client multiprocess mode: a directory that starts empty for this run.

    Returns the directory if this run created it (and should remove it at exit).
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        for stale in Path(directory).glob("*.db"):
            stale.unlink()  # values of a previous run would be merged in otherwise
        return None
    created = tempfile.mkdtemp(prefix="ratewarden-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = created
    return created


def _as_environment(settings: Settings) -> dict[str, str]:
    env = {}
    for name, value in settings.model_dump(exclude_none=True).items():
        text = ",".join(value) if isinstance(value, list) else str(value)
        env[f"RATEWARDEN_{name.upper()}"] = text
    return env


# -- check and usage (clients of a running daemon) -------------------------------------


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", help="daemon URL (default $RATEWARDEN_URL or http://127.0.0.1:8470)"
    )
    parser.add_argument("--token", help="API token (default $RATEWARDEN_TOKEN)")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait (default 2)")
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON answer")


def _add_check(commands: Any) -> None:
    check = commands.add_parser("check", help="ask a running daemon whether a call may run")
    check.add_argument("--user", required=True)
    check.add_argument("--tool", required=True)
    check.add_argument("--session")
    check.add_argument("--team")
    check.add_argument("--cost", type=float)
    check.add_argument("--call-id")
    check.add_argument("--approved", action="store_true", help="a human approved this call")
    check.add_argument(
        "--args",
        type=_args_json,
        help="the call's arguments as a JSON object; sent only if the policy reads them",
    )
    _add_metadata_flags(check)
    _add_client_flags(check)
    check.set_defaults(run=_check)


def _add_metadata_flags(parser: argparse.ArgumentParser) -> None:
    for name in METADATA_FLAGS:
        flag = name.replace("_", "-")
        parser.add_argument(f"--{flag}", dest=name, action=argparse.BooleanOptionalAction)
    parser.add_argument("--tag", dest="tags", action="append", default=[], help="tool tag (repeat)")


def _check(args: argparse.Namespace) -> int:
    from ratewarden.client import Client, ClientError, DaemonUnavailable
    from ratewarden.wire import CheckRequest

    request = CheckRequest.model_validate(
        {
            **_given(
                args, "user", "tool", "session", "team", "cost", "call_id", "approved", "args"
            ),
            "metadata": _metadata(args),
        }
    )
    settings = client_target(args)
    try:
        with Client(settings.url, settings.token, timeout=args.timeout) as client:
            answer = client.check(request)
    except DaemonUnavailable as exc:
        print(f"ratewarden daemon unreachable at {settings.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ClientError as exc:
        return _usage_error(f"the daemon refused the request: {exc}")
    if args.json:
        print(answer.model_dump_json(indent=2))
    if answer.decision != "allow":
        print(answer.message, file=sys.stderr)
    return {"allow": EXIT_ALLOW, "deny": EXIT_DENY, "ask": EXIT_ASK}[answer.decision]


def _metadata(args: argparse.Namespace) -> dict[str, Any] | None:
    given = {
        name: getattr(args, name) for name in METADATA_FLAGS if getattr(args, name) is not None
    }
    if args.tags:
        given["tags"] = args.tags
    return given or None


def _add_settle(commands: Any) -> None:
    settle = commands.add_parser("settle", help="report a finished call: its actual cost")
    settle.add_argument("call_id", metavar="CALL_ID")
    settle.add_argument("--cost", type=float, help="actual cost (default: the estimate)")
    settle.add_argument("--status", help="how the call ended (ok, error...)")
    _add_client_flags(settle)
    settle.set_defaults(run=_settle)


def _settle(args: argparse.Namespace) -> int:
    from ratewarden.client import Client, ClientError, DaemonUnavailable
    from ratewarden.wire import SettleRequest

    request = SettleRequest.model_validate(_given(args, "cost", "status"))
    settings = client_target(args)
    try:
        with Client(settings.url, settings.token, timeout=args.timeout) as client:
            answer = client.settle(args.call_id, request)
    except DaemonUnavailable as exc:
        print(f"ratewarden daemon unreachable at {settings.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ClientError as exc:
        print(f"ratewarden: {exc}", file=sys.stderr)
        return EXIT_DENY if exc.status == 404 else EXIT_USAGE
    if args.json:
        print(answer.model_dump_json(indent=2))
    else:
        charged = ", ".join(f"{rule} {amount:.2f}" for rule, amount in answer.charged.items())
        print(
            f"{answer.call_id}: {answer.outcome.replace('_', ' ')}"
            + (f" ({charged})" if charged else "")
        )
    return 0


def _add_usage(commands: Any) -> None:
    usage = commands.add_parser("usage", help="a user's limits, used and remaining")
    usage.add_argument("--user", required=True)
    usage.add_argument("--tool")
    usage.add_argument("--session")
    usage.add_argument("--team")
    _add_client_flags(usage)
    usage.set_defaults(run=_usage)


def _usage(args: argparse.Namespace) -> int:
    from ratewarden.client import Client, ClientError, DaemonUnavailable

    settings = client_target(args)
    try:
        with Client(settings.url, settings.token, timeout=args.timeout) as client:
            answer = client.usage(args.user, tool=args.tool, session=args.session, team=args.team)
    except DaemonUnavailable as exc:
        print(f"ratewarden daemon unreachable at {settings.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ClientError as exc:
        return _usage_error(f"the daemon refused the request: {exc}")
    if args.json:
        print(answer.model_dump_json(indent=2))
        return 0
    rows = [_usage_row(item) for item in answer.limits]
    print(f"usage for {answer.user}" + (f", tool {answer.tool}" if answer.tool else ""))
    print(table(["RULE", "KIND", "LIMIT", "USED", "REMAINING", "RESETS IN", "MODE"], rows))
    return 0


def _usage_row(item: Any) -> list[str]:
    """One table row; money with two decimals and its currency, reservations shown apart."""
    if item.limit is None:
        return [item.rule, item.kind, "unlimited", "-", "-", "-", item.mode]
    if item.kind == "access":  # no counter: it refuses (or asks about) what it matches
        return [item.rule, item.kind, "refuses what it matches", "-", "-", "-", item.mode]
    resets = f"{item.reset_after:.0f}s" if item.used or item.reserved else "-"
    if item.kind == "budget":
        limit = f"{item.limit:.2f} {item.currency}/{item.period}"
        used = f"{item.used:.2f}" + (f" (+{item.reserved:.2f} reserved)" if item.reserved else "")
        return [item.rule, item.kind, limit, used, f"{item.remaining:.2f}", resets, item.mode]
    if item.kind == "concurrency":  # slots free on settle or lease expiry, not at a time
        limit, resets = f"{item.limit} at once", "-"
    else:
        limit = f"{item.limit}/{item.window}"
    return [item.rule, item.kind, limit, str(item.used), str(item.remaining), resets, item.mode]


def table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart."""
    if not rows:
        return "(no rules apply)"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]  # fmt: skip
    return "\n".join(lines)


# -- policy ----------------------------------------------------------------------------


def _add_policy(commands: Any) -> None:
    policy = commands.add_parser("policy", help="validate or explain a policy file")
    actions = policy.add_subparsers(title="actions", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate policy files (for CI); lists every error")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(run=_policy_check, daemon_command="policy check")
    explain = actions.add_parser("explain", help="which rules apply to a call, and why")
    explain.add_argument("file", metavar="FILE")
    explain.add_argument("--user", required=True)
    explain.add_argument("--tool", required=True)
    explain.add_argument("--session")
    explain.add_argument("--team")
    explain.add_argument("--approved", action="store_true")
    explain.add_argument(
        "--args", type=_args_json, help="the call's arguments as a JSON object (args rules)"
    )
    _add_metadata_flags(explain)
    explain.set_defaults(run=_policy_explain, daemon_command="policy explain")


def _policy_check(args: argparse.Namespace) -> int:
    from ratewarden.policy import PolicyError, load_policy

    failed = False
    for path in args.files:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            failed = True
            print(exc, file=sys.stderr)
            continue
        print(f"{path}: ok (version {policy.version}, {len(policy.rules)} rules)")
    return 1 if failed else 0


def _policy_explain(args: argparse.Namespace) -> int:
    from ratewarden.calls import Call, ToolFacts
    from ratewarden.policy import PolicyError, load_policy

    try:
        policy = load_policy(args.file)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    facts = ToolFacts(
        **{name: getattr(args, name) for name in METADATA_FLAGS}, tags=frozenset(args.tags)
    )
    call = Call(
        args.user,
        args.tool,
        "explain",
        args.session,
        args.team,
        facts=facts,
        approved=args.approved,
        args=args.args,
    )
    print(explain_text(policy, call))
    return 0


def _args_json(text: str) -> dict[str, Any]:
    """`--args`: a JSON object within the API's caps (wire.Args), or a usage error."""
    from pydantic import TypeAdapter, ValidationError

    from ratewarden.wire import Args

    try:
        value: dict[str, Any] = TypeAdapter(Args).validate_json(text)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"]
        raise argparse.ArgumentTypeError(f"not a JSON object of arguments: {problem}") from None
    return value


def explain_text(policy: Any, call: Any) -> str:
    from ratewarden.policy.model import (
        AccessLimit,
        BudgetLimit,
        ConcurrencyLimit,
        RateLimit,
        Unlimited,
    )

    groups = sorted(policy.groups_of(call.user))
    lines = [
        f"policy {policy.source} (version {policy.version}, {len(policy.rules)} rules)",
        f"call: user={call.user!r} tool={call.tool!r} session={call.session!r} team={call.team!r}",
        f"user's groups: {', '.join(groups) if groups else '(none)'}",
        "tool metadata: "
        + ", ".join(f"{name}={call.facts.effective(name)}" for name in METADATA_FLAGS)
        + " (unset fields take the MCP defaults)",
        "",
    ]
    if call.args is not None:
        lines.insert(-1, "args: given (counter keys hold a digest of them, never their text)")
    for item in policy.explain(call):
        rule = item.rule
        if not item.applies:
            lines.append(f"  skip     {rule.name}: {item.reason}")
            lines += _condition_lines(item.conditions)
            continue
        limit = item.limit
        if isinstance(limit, RateLimit):
            what = f"rate {limit.rate}"
        elif isinstance(limit, BudgetLimit):
            what = f"budget {limit.budget} {limit.currency}"
        elif isinstance(limit, ConcurrencyLimit):
            what = f"concurrency {limit.slots} (lease {limit.lease_ms // 1000}s)"
        elif isinstance(limit, AccessLimit):
            what = f"access: {rule.on_exceed} {rule.template.text!r}"
        else:
            what = "unlimited"
        origin = "rule default" if item.source == "rule" else item.source
        if isinstance(rule.limit, AccessLimit):  # no counter, whatever the override
            lines.append(f"  APPLIES  {rule.name}: {what} ({origin}); {rule.mode}")
        else:
            per = ", ".join(rule.per) if rule.per else "everyone (one global counter)"
            lines.append(
                f"  APPLIES  {rule.name}: {what} ({origin}) per {per}; "
                f"{rule.algorithm}, {rule.mode}, on_exceed {rule.on_exceed}"
            )
        if not isinstance(limit, AccessLimit | Unlimited):
            lines.append(f"           counter key: {_counter_key(rule, call)}")
        lines += _condition_lines(item.conditions)
    return "\n".join(lines)


def _condition_lines(conditions: Any) -> list[str]:
    return [f"           {'held  ' if held else 'failed'} {text}" for text, held in conditions]


def _counter_key(rule: Any, call: Any) -> str:
    """The rule's counter key for `call`; an `args` part is a digest, and says so."""
    from ratewarden.engine.engine import KIND_OF
    from ratewarden.limiter.ops import Kind
    from ratewarden.policy.model import BudgetLimit, RateLimit
    from ratewarden.store.keys import CounterKeys

    limit = rule.limit
    if isinstance(limit, RateLimit):
        kind = KIND_OF[limit.algorithm]
    else:
        kind = Kind.BUDGET if isinstance(limit, BudgetLimit) else Kind.CONCURRENCY
    keys = CounterKeys.of(rule.name, kind, rule.per)
    key = keys.for_call(call)
    return key + ("  (args parts are digests of the arguments)" if keys.hashed else "")


# -- helpers ---------------------------------------------------------------------------


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The flags the user actually gave, so unset ones fall back to the environment."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _settings_problem(exc: ValidationError) -> str:
    return "; ".join(
        f"--{'.'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
        for e in exc.errors()
    )


def _usage_error(message: str) -> int:
    print(f"ratewarden: {message}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
