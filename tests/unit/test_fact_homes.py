"""Each fact in one home (issue 27, item 3): the settle statuses, an admitted call's
lifecycle, the daemon's default URL and the client settings' reader, the policy version,
the settle route and the daemon's own call ids are each spelled in one module, and every
other module takes them from there."""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ratewarden import vocabulary
from ratewarden.integrations._lifecycle import AdmittedCall, settlement
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import SettleRequest

PACKAGE = Path(vocabulary.__file__).parent
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "vocabulary.py")
HOME = PACKAGE / "vocabulary.py"


def name(path: Path) -> str:
    return str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else path.name


def where(path: Path, node: ast.AST) -> str:
    return f"{name(path)}:{getattr(node, 'lineno', 0)}"


def constants(tree: ast.AST) -> Iterator[tuple[ast.Constant, ast.AST]]:
    """Each string constant of `tree` with the node holding it (docstrings included: they
    are not where these facts hide)."""
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if isinstance(child, ast.Constant) and isinstance(child.value, str):
                yield child, parent


# -- the settle statuses ---------------------------------------------------------------------

# Words that are a status wherever they appear (but a metric's key, which names the metric).
STATUS_WORDS = {CallStatus.CANCELLED, CallStatus.ABANDONED, CallStatus.BLOCKED}
# `ok` and `error` are also JSON-RPC's, HTTP's and the hosts' own words: they count as a
# status where a settle's status is made (a `status=` argument, a comparison with a name
# `status`, or what a function named `*status*` returns).
ALSO_STATUS = {CallStatus.OK, CallStatus.ERROR}
NOT_OURS = {
    # LangChain's own ToolMessage status, not a settle's.
    ("integrations/langchain.py", "error"),
    # the METRICS table's key of ratewarden_blocked_calls_total.
    ("service/metrics.py", "blocked"),
}


def _status_spellings(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text())
    functions = {
        id(node): fn.name
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and "status" in fn.name
        for node in ast.walk(fn)
    }
    for const, parent in constants(tree):
        value = const.value
        if (name(path), value) in NOT_OURS:
            continue
        if value in STATUS_WORDS or (
            value in ALSO_STATUS and _made_as_status(const, parent, functions)
        ):
            found.append(f"{where(path, const)} {value!r}")
    return found


def _made_as_status(const: ast.Constant, parent: ast.AST | None, functions: dict[int, str]) -> bool:
    if isinstance(parent, ast.keyword):
        return parent.arg == "status"
    if isinstance(parent, ast.Compare):
        sides = [parent.left, *parent.comparators]
        return any(isinstance(side, ast.Name) and side.id == "status" for side in sides)
    if isinstance(parent, ast.Return | ast.IfExp):
        return id(parent) in functions
    return False


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_spells_a_settle_status(path: Path) -> None:
    assert _status_spellings(path) == []


def test_the_status_check_sees_a_spelling(tmp_path: Path) -> None:
    copy = tmp_path / "spelled_here.py"
    copy.write_text(
        'def f(status):\n    g(status="ok")\n    return status == "error"\n\n'
        'def result_status():\n    return "ok"\n\nX = "abandoned"\n'
    )
    assert len(_status_spellings(copy)) == 4


def test_the_statuses_are_the_words_on_the_wire() -> None:
    assert [status.value for status in CallStatus] == [
        "ok",
        "error",
        "cancelled",
        "abandoned",
        "blocked",
    ]
    body = SettleRequest(status=CallStatus.BLOCKED, duration_ms=0.0, cost=0.0)
    assert json.loads(body.model_dump_json(exclude_none=True))["status"] == "blocked"
    assert json.dumps({"status": CallStatus.OK}) == '{"status": "ok"}'


# -- one lifecycle of an admitted call ------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_admitted_call_settles_with_its_duration_and_status() -> None:
    clock = FakeClock()
    call = AdmittedCall("c~1", "guard", clock=clock)
    clock.now += 0.25
    assert call.settlement(CallStatus.OK) == SettleRequest(status="ok", duration_ms=250.0)
    clock.now += 0.5
    assert call.settlement(CallStatus.ERROR) == SettleRequest(status="error", duration_ms=750.0)
    assert (call.call_id, call.guard) == ("c~1", "guard")


def test_a_call_not_yet_started_has_no_duration_until_it_starts() -> None:
    clock = FakeClock()
    call = AdmittedCall("mcp-1~2", started=False, clock=clock)
    assert call.settlement(CallStatus.CANCELLED) == SettleRequest(status="cancelled")
    call.start()
    clock.now += 0.125
    assert call.settlement(CallStatus.ABANDONED).duration_ms == 125.0


def test_a_blocked_call_took_no_time_and_costs_nothing() -> None:
    clock = FakeClock()
    call = AdmittedCall("c~3", clock=clock)
    clock.now += 9
    blocked = SettleRequest(status="blocked", duration_ms=0.0, cost=0.0)
    assert call.settlement(CallStatus.BLOCKED) == blocked
    assert settlement("blocked", 12.0) == blocked  # a host's own status, spelled by it


def test_a_hosts_own_duration_is_never_negative() -> None:
    assert settlement("ok", -3.0).duration_ms == 0.0
    assert settlement("ok", None).duration_ms is None
    assert settlement("done", 4.5) == SettleRequest(status="done", duration_ms=4.5)


LIFECYCLE_HOLDERS = [
    *sorted((PACKAGE / "integrations").glob("*.py")),
    PACKAGE / "mcp" / "guard.py",
]


@pytest.mark.parametrize("path", LIFECYCLE_HOLDERS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_adapter_times_a_call_or_builds_a_settle_itself(path: Path) -> None:
    """The elapsed-time formula and the settle body live in `_lifecycle.py` alone."""
    if path.name == "_lifecycle.py":
        return
    tree = ast.parse(path.read_text())
    found = [
        where(path, node)
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr in {"perf_counter", "monotonic"})
        or (
            isinstance(node, ast.Name)
            and node.id == "SettleRequest"
            and isinstance(node.ctx, ast.Load)
            and not _in_annotation(tree, node)
        )
    ]
    assert found == []


def _in_annotation(tree: ast.AST, name: ast.Name) -> bool:
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            annotations.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            annotations.append(node.returns)
        if any(name is inner for a in annotations for inner in ast.walk(a)):
            return True
    return False


class Recorder:
    """A guard that keeps what it was asked to settle."""

    def __init__(self) -> None:
        self.settled: list[tuple[str, SettleRequest | None]] = []
        self.fail = vocabulary.FailMode.OPEN

    async def check(self, request: Any) -> Any:
        from ratewarden.wire.bodies import CheckResponse

        held = SimpleNamespace(kind=vocabulary.RuleKind.CONCURRENCY)  # it holds a slot
        return CheckResponse.model_construct(
            decision="allow",
            allowed=True,
            message="",
            call_id=request.call_id,
            limits=[held],  # type: ignore[list-item]
        )

    async def settle(self, call_id: str, request: SettleRequest | None = None) -> None:
        self.settled.append((call_id, request))


def test_the_mcp_guard_settles_through_the_lifecycle() -> None:
    from ratewarden.mcp.guard import GuardAction, SessionGuard

    async def run() -> list[tuple[str, SettleRequest | None]]:
        daemon = Recorder()
        session = SessionGuard(daemon, user="ann")
        params = {"name": "search", "arguments": {}}

        async def never(tool: str, message: str) -> bool:
            return False

        assert (await session.check(1, params, never)).decision is GuardAction.FORWARD
        assert (await session.check(2, params, never)).decision is GuardAction.FORWARD
        session.sent(1)
        settle = session.finish(1, error=True)
        assert settle is not None
        await settle()
        await session.close()  # call 2 never went to the server: no duration
        return daemon.settled

    settled = asyncio.run(run())
    requests = [request for _, request in settled if request is not None]
    assert [(request.status, request.duration_ms is None) for request in requests] == [
        ("error", False),
        ("abandoned", True),
    ]
    assert [call_id.split(vocabulary.SEPARATOR)[0] for call_id, _ in settled] == ["1", "2"]


# -- one default URL, one reader of RATEWARDEN_URL and RATEWARDEN_TOKEN ----------------------


def _code_strings(path: Path) -> Iterator[tuple[ast.Constant, ast.AST]]:
    """`constants` without the docstrings (an example config may show the default URL)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    for const, parent in constants(tree):
        if id(const) not in docstrings:
            yield const, parent


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_default_url_and_the_client_variables_have_one_home(path: Path) -> None:
    port = str(vocabulary.DEFAULT_PORT)
    tree = ast.parse(path.read_text())
    numbers = [
        where(path, node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value == vocabulary.DEFAULT_PORT
    ]
    spelled = [
        f"{where(path, const)} {const.value!r}"
        for const, _ in _code_strings(path)
        if isinstance(const.value, str)
        and (port in const.value or const.value in {"RATEWARDEN_URL", "RATEWARDEN_TOKEN"})
    ]
    assert numbers + spelled == []


def test_the_daemons_settings_hold_no_client_url_or_token() -> None:
    from ratewarden.service.settings import Settings

    assert {"url", "token"} & set(Settings.model_fields) == set()
    daemon = Settings()
    assert f"http://{daemon.host}:{daemon.port}" == vocabulary.DEFAULT_URL


def test_the_cli_reads_the_client_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ratewarden usage` goes where RATEWARDEN_URL says, with RATEWARDEN_TOKEN; a flag wins."""
    from ratewarden import cli

    seen: list[tuple[str, str | None]] = []

    class Client:
        def __init__(self, url: str, token: str | None, timeout: float) -> None:
            seen.append((url, token))

        def __enter__(self) -> Client:
            raise _Stop

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr("ratewarden.client.Client", Client)
    monkeypatch.setenv("RATEWARDEN_URL", "http://env:1")
    monkeypatch.setenv("RATEWARDEN_TOKEN", "env-token")
    for argv in (["usage", "--user", "u"], ["usage", "--user", "u", "--url", "http://flag:2"]):
        with pytest.raises(_Stop):
            cli.main(argv)
    monkeypatch.delenv("RATEWARDEN_URL")
    with pytest.raises(_Stop):
        cli.main(["usage", "--user", "u", "--token", "flag-token"])
    assert seen == [
        ("http://env:1", "env-token"),
        ("http://flag:2", "env-token"),
        (vocabulary.DEFAULT_URL, "flag-token"),
    ]


class _Stop(Exception):
    """Stops a CLI command once it has made its client."""


# -- one policy version ---------------------------------------------------------------------


def test_the_policy_version_is_computed_in_one_place() -> None:
    from ratewarden.policy import parse_policy
    from ratewarden.policy.compile import policy_version

    raw = b"version: 1\nrules: []\n"
    assert parse_policy(raw).version == policy_version(raw)
    hashing = [
        where(path, node).split(":")[0]
        for path in SOURCES
        if path.parent.name in {"policy", "service"}
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "sha256"
    ]
    assert hashing == ["policy/compile.py"]


# -- the settle route ------------------------------------------------------------------------


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_settle_route_is_spelled_once(path: Path) -> None:
    if name(path) == "vocabulary.py":  # stdlib-only: the command hook reads it too
        return
    spelled = [
        where(path, const)
        for const, _ in _code_strings(path)
        if isinstance(const.value, str) and "/settle" in const.value
    ]
    assert spelled == []


def test_the_client_the_route_and_the_auth_table_share_it() -> None:
    from ratewarden.client import _settle_path
    from ratewarden.service.auth import ROLES, ApiRole
    from ratewarden.service.routes import router
    from ratewarden.wire.bodies import SETTLE_PATH

    assert _settle_path("a/b~1") == "/v1/calls/a%2Fb~1/settle"
    assert ROLES[SETTLE_PATH.format(call_id="{call_id:path}")] is ApiRole.DECIDE
    paths = {getattr(route, "path", "") for route in router.routes}
    assert SETTLE_PATH.format(call_id="{call_id:anytext}") in paths


# -- the daemon's own call ids ---------------------------------------------------------------


def test_the_daemons_call_ids_are_the_vocabularys_second_scheme() -> None:
    from ratewarden.service.convert import to_call
    from ratewarden.wire.bodies import CheckRequest

    made = {to_call(CheckRequest(user="u", tool="t")).call_id for _ in range(3)}
    assert len(made) == 3
    for call_id in made:
        assert call_id.startswith(vocabulary.DAEMON_CALL_ID_PREFIX)
        assert len(call_id) == len(vocabulary.DAEMON_CALL_ID_PREFIX) + 32
        int(call_id.removeprefix(vocabulary.DAEMON_CALL_ID_PREFIX), 16)
    named = to_call(CheckRequest(user="u", tool="t", call_id="mine~1"))
    assert named.call_id == "mine~1"


@pytest.mark.parametrize("folder", ["service", "engine"])
def test_no_other_module_of_the_daemon_makes_a_call_id(folder: str) -> None:
    made = [
        where(path, node)
        for path in sorted((PACKAGE / folder).glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute | ast.Name)
        and getattr(node, "attr", getattr(node, "id", "")) in {"token_hex", "urandom", "uuid4"}
        # not call ids: an audit line's own id, an override's id
        and name(path) not in {"service/audit.py", "service/overrides.py"}
    ]
    assert made == []
