"""`ratewarden serve`: the daemon, under uvicorn, with one worker or several.

The port is bound before the daemon starts, so that its "ready" line is only ever
logged by a process that listens: a busy port is refused with a message naming it,
before anything else runs (and exit status 2, like any other start-up refusal).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from ratewarden.cli.common import (
    EXIT_USAGE,
    flags_given,
    usage_error,
)

if TYPE_CHECKING:
    from ratewarden.service.settings import Settings


# The flags of `serve`: each sets the field of `Settings` it names. Only the words are
# here; the type, the choices and the default are read from the field, so that no default
# is restated (tests/service/test_cli.py holds every flag to its field).
FLAGS: dict[str, tuple[str, str, str | None]] = {  # field: (flag, help, metavar)
    "host": ("--host", "address to listen on", None),
    "port": ("--port", "port", None),
    "workers": ("--workers", "worker processes", None),
    "store_url": ("--store-url", "memory://, redis://, rediss://, unix://", None),
    "policy": ("--policy", "policy file (unset: ./ratewarden.yaml, else the example)", None),
    "fail": ("--fail", "answer when the store is down (unset: the policy's)", None),
    "data_dir": (
        "--data-dir",
        "where the memory store's state file goes (unset: $XDG_STATE_HOME/ratewarden, "
        "else ~/.local/state/ratewarden)",
        "DIR",
    ),
    "store_timeout_ms": ("--store-timeout-ms", "store timeout", "MS"),
    "grpc_port": (
        "--grpc-port", "Envoy's rate limit and ext_authz gRPC services' port (unset: off)", None
    ),
    "envoy_user_header": (
        "--envoy-user-header", "the header ext_authz reads the user from (Envoy's)", "HEADER"
    ),
    "log_format": ("--log-format", "log format", None),
    "log_level": ("--log-level", "log level", None),
    "reload_interval_s": (
        "--reload-interval", "seconds between checks of the policy file (0: off)", "SECONDS"
    ),
    "request_timeout_s": (
        "--request-timeout", "seconds a connection has to send a whole request", "SECONDS"
    ),
    "max_connections": (
        "--max-connections",
        "open connections per process (unset: the open-file limit minus a reserve)",
        "N",
    ),
}  # fmt: skip
# The token lists' flags (repeatable, one token each): field -> the role's name.
TOKEN_FLAGS = {
    "api_tokens": "check",
    "admin_tokens": "admin",
    "viewer_tokens": "viewer (read-only)",
}
STARTUP_FAILURE = 3  # uvicorn's exit status when the app's start-up fails, kept
TOKENS = "(repeatable; replaces $RATEWARDEN_%s, safer since flags show in `ps`)"


def add_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the daemon")
    serve.set_defaults(run=_serve, daemon_command="serve")
    try:
        from ratewarden.service.settings import Settings
    except ModuleNotFoundError:  # a client-only install: `serve` says what to install
        return
    for name, (flag, text, metavar) in FLAGS.items():
        kind, choices = _kind(Settings.model_fields[name].annotation)
        default = Settings.model_fields[name].get_default(call_default_factory=True)
        shown = "" if default is None else f" (default {default})"
        serve.add_argument(
            flag, dest=name, type=kind, choices=choices, metavar=metavar, help=text + shown
        )
    for name, role in TOKEN_FLAGS.items():
        serve.add_argument(
            f"--{name.removesuffix('s').replace('_', '-')}",
            dest=name,
            action="append",
            metavar="TOKEN",
            help=f"bearer token of the {role} role " + TOKENS % name.upper(),
        )
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=None,
        help="allow a non-loopback --host with no tokens (auth off)",
    )


def _settings(**given: Any) -> Settings:
    """The settings, from `given` flags over the environment (pydantic-settings loads only
    for the commands that read them: never for a hook)."""
    from ratewarden.service.settings import Settings

    return Settings(**given)


def _kind(annotation: Any) -> tuple[Any, list[str] | None]:
    """A field's type for argparse (None left out of an optional one), and its choices
    if it is a Literal."""
    kinds = [annotation]
    if get_origin(annotation) is not Literal:
        kinds = [arg for arg in get_args(annotation) if arg is not type(None)] or kinds
    if get_origin(kinds[0]) is Literal:
        return str, list(get_args(kinds[0]))
    return (kinds[0] if kinds[0] in (int, float) else str), None


def _serve(args: argparse.Namespace) -> int:
    from ratewarden.http.connections import NoRoomForConnections, connection_limits
    from ratewarden.policy import PolicyError
    from ratewarden.service.auth import bind_problem
    from ratewarden.service.logs import configure_audit, configure_logging

    chosen = flags_given(args, *FLAGS, "insecure_no_auth")
    for name, tokens in flags_given(args, "api_tokens", "admin_tokens", "viewer_tokens").items():
        chosen[name] = ",".join(tokens)  # split like the environment's comma-separated lists
    settings = _settings(**chosen)
    problem = bind_problem(settings)
    if problem is None and settings.grpc_port is not None:
        from ratewarden.service.envoy import missing_extra

        problem = missing_extra()
    if problem is not None:
        return usage_error(problem)
    if settings.workers > 1 and settings.store_url.startswith("memory:"):
        return usage_error(
            "the embedded memory:// store lives in one process; use --workers 1, "
            "or a shared store such as --store-url redis://localhost:6379/0"
        )
    try:
        connection_limits(settings)  # a file limit with no room: refused before anything runs
    except NoRoomForConnections as exc:
        return usage_error(str(exc))
    configure_logging(settings.log_format, settings.log_level)
    configure_audit(settings.audit_log)
    try:
        return _run_uvicorn(settings)
    except PolicyError as exc:
        print(f"cannot load the policy:\n{exc}", file=sys.stderr)
        return EXIT_USAGE


def _run_uvicorn(settings: Settings) -> int:
    import uvicorn

    from ratewarden.http.connections import GuardedHttpProtocol, install
    from ratewarden.service.app import create_app, load_configured_policy
    from ratewarden.store import StoreURLError

    try:
        policy = load_configured_policy(settings)  # fail fast, before binding a port
        app = create_app(settings, policy=policy) if settings.workers == 1 else None
    except StoreURLError as exc:
        return usage_error(str(exc))
    try:
        listening = _listen(settings.host, settings.port)
    except OSError as exc:
        return usage_error(_cannot_listen(settings, exc))
    install(settings)  # workers derive the same limits from the environment
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_config": None,
        "access_log": False,
        # A deadline on every request and a cap on connections (http/connections.py).
        "http": GuardedHttpProtocol,
    }
    if app is not None:
        # On the socket bound above: the app's start-up (which logs "ready") runs once
        # it listens; connections wait in its backlog until then.
        server = uvicorn.Server(uvicorn.Config(app, **options))
        with listening, contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[listening])
        return 0 if server.started else STARTUP_FAILURE
    # Several workers: uvicorn binds the port itself, in this process, before any worker
    # starts (and logs "ready"); the socket above only said why it would fail.
    listening.close()
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


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to the daemon's address and listening, as uvicorn would bind it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((host, port))
        listening.listen(2048)  # uvicorn's default backlog
    except OSError:
        listening.close()
        raise
    listening.set_inheritable(True)
    return listening


def _cannot_listen(settings: Settings, exc: OSError) -> str:
    where = (
        f"[{settings.host}]:{settings.port}"
        if ":" in settings.host
        else (f"{settings.host}:{settings.port}")
    )
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: port {settings.port} is already in use (another "
            "ratewarden?); stop it, or choose another port with --port or RATEWARDEN_PORT"
        )
    return f"cannot listen on {where}: {exc.strerror or exc}"


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
