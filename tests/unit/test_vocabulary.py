"""One vocabulary (issue 16, item 3): every shared word spelled once, in ratewarden.vocabulary.

The module loads nothing of the server; no sentence a model can read is written anywhere
else; the policy's schema and model use its enums; the metadata fields are its list;
every host makes its call ids one way; the client side reads `RATEWARDEN_*` one way.
"""

from __future__ import annotations

import ast
import enum
import json
import re
import string
import subprocess
import sys
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from ratewarden import vocabulary
from ratewarden.calls import ToolFacts
from ratewarden.client import AsyncGuard, Guard, unreachable_answer
from ratewarden.policy import PolicyError, model, parse_policy, schema
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleResponse, ToolMetadata

PACKAGE = Path(vocabulary.__file__).parent
PATTERN = re.compile(vocabulary.CALL_ID_PATTERN)

# -- the module loads nothing of the server ------------------------------------------------

SERVER = ("fastapi", "starlette", "redis", "uvicorn", "pydantic_settings", "yaml")
DAEMON = ("policy", "engine", "store", "limiter", "service", "settings", "metrics", "audit")


def modules_loaded_by(module: str) -> set[str]:
    probe = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(found.stdout))


def test_the_vocabulary_loads_only_the_standard_library() -> None:
    loaded = modules_loaded_by("ratewarden.vocabulary")
    assert "ratewarden.vocabulary" in loaded  # the probe did import it
    ours = {m for m in loaded if m.split(".")[0] == "ratewarden"}
    assert ours == {"ratewarden", "ratewarden.vocabulary"}
    others = {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names)
    assert others - {"ratewarden", "__main__", "_distutils_hack"} == set()  # not even pydantic


@pytest.mark.parametrize(
    "module",
    [
        "ratewarden.client",
        "ratewarden.hooks.command",
        "ratewarden.integrations.langchain",
        "ratewarden.integrations.adk",
        "ratewarden.integrations.crewai",
        "ratewarden.integrations.hermes",
        "ratewarden.integrations.strands",
        "ratewarden.integrations.openai_agents",
        "ratewarden.integrations.pydantic_ai",
    ],
)
def test_the_client_and_the_adapters_load_nothing_of_the_server(module: str) -> None:
    loaded = modules_loaded_by(module)
    assert "ratewarden.vocabulary" in loaded  # their words come from it
    assert {m for m in loaded if m.split(".")[0] in SERVER} == set()
    daemon = {f"ratewarden.{part}" for part in DAEMON}
    assert {m for m in loaded if m in daemon or m.rsplit(".", 1)[0] in daemon} == set()


# -- every sentence a model can read is the vocabulary's ---------------------------------------


def strings_in(path: Path, *, prose_only: bool = False) -> list[tuple[int, str]]:
    """The string literals of `path` (f-strings' literal parts included), docstrings left
    out; with `prose_only`, only those of three words or more outside a `raise` or a
    logging call (what could be a sentence for a model)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    if prose_only:
        skipped |= {id(node) for node in _notes(tree)}
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skipped
        and (not prose_only or len(node.value.split()) >= 3)
    ]


def _notes(tree: ast.AST) -> list[ast.AST]:
    """Everything inside a `raise` or a logging call: words for the operator."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        logging_call = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"debug", "info", "warning", "error", "exception", "log"}
        )
        if isinstance(node, ast.Raise) or logging_call:
            found += list(ast.walk(node))
    return found


def fragments(sentence: str) -> list[str]:
    """The literal text between a sentence's `{fields}`, where it is long enough to tell
    (three words, or twelve characters: "calls per" alone is no copy)."""
    parts = [text.strip() for text, *_ in string.Formatter().parse(sentence)]
    return [part for part in parts if len(part.split()) >= 3 or len(part) >= 12]


def test_no_sentence_of_the_vocabulary_is_written_anywhere_else() -> None:
    copies = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "vocabulary.py":
            continue
        for line, text in strings_in(path):
            for name, sentence in vocabulary.SENTENCES.items():
                copies += [
                    f"{path.name}:{line} {name}" for part in fragments(sentence) if part in text
                ]
    assert copies == []


def test_the_copy_check_sees_a_copy(tmp_path: Path) -> None:
    copy = tmp_path / "copy.py"
    copy.write_text('def refuse(tool):\n    return f"ratewarden refused this {tool} call"\n')
    [(_, text)] = [s for s in strings_in(copy) if "refused" in s[1]]
    assert any(part in text for part in fragments(vocabulary.REFUSED))


# Text in the modules that talk to a model which is not the vocabulary's: each is a note
# for the operator (a hook's stderr after its answer, a log line's argument), never read by
# a model. A new sentence for a model belongs in the vocabulary, not on this list.
OPERATOR_NOTES = {
    "refused the guard's token",  # client.py: what the log line says the daemon did
    "refused a check",
    "ratewarden: call id ",  # hooks.py: notes on stderr, after the answer
    " was already used; checked as a new call",
    "; failing open",
    "the daemon refused the check (",
    "ratewarden: daemon unreachable at ",
    "ratewarden: could not settle ",
    # crewai.py: CrewAI's own texts, read to tell a call a hook blocked or a tool that
    # failed, and its console prompt to the human approving a call.
    "Tool execution blocked by hook.",
    "Error executing tool: ",
    "Type 'approve' to run this tool call, anything else to refuse it:",
}
TALKERS = [
    PACKAGE / "client.py",
    *sorted((PACKAGE / "integrations").rglob("*.py")),
    # The hosts' contracts (command.py and hosts.py hold the CLI's help and the notes
    # for the operator's log, not sentences for a model).
    *sorted(
        p for p in (PACKAGE / "hooks").glob("*.py") if p.name not in ("command.py", "hosts.py")
    ),
    *sorted((PACKAGE / "engine").glob("*.py")),
    PACKAGE / "policy" / "messages.py",
]


@pytest.mark.parametrize("path", TALKERS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_modules_that_talk_to_a_model_take_their_sentences_from_the_vocabulary(
    path: Path,
) -> None:
    assert {text for _, text in strings_in(path, prose_only=True)} - OPERATOR_NOTES == set()


def test_the_sentences_read_as_they_always_have() -> None:
    """Moved, not reworded: the fallbacks byte for byte (the templates: test_messages.py)."""
    assert vocabulary.unavailable("Bash") == "Tool guard unavailable; Bash calls are paused"
    refused = CheckRequest(user="u", tool="Bash")
    answer = unreachable_answer(refused, "closed", OSError("down"))
    assert answer.message == "Tool guard unavailable; Bash calls are paused"
    assert vocabulary.REFUSED.format(tool="Bash") == "ratewarden refused this Bash call"
    assert vocabulary.REFUSED_BY.format(decision="ask") == "ask by ratewarden"
    assert vocabulary.BLOCKED == "Blocked by ratewarden"
    assert vocabulary.ASK_REASON.format(tool="Bash") == (
        "ratewarden asks a human to approve this Bash call"
    )
    assert vocabulary.needs_approval("Rate limit: max 1 x calls per minute.") == (
        "Rate limit: max 1 x calls per minute. A human must approve this call before it can "
        "run: tell the user why, and do not retry it until they have approved it."
    )
    assert vocabulary.UNREADABLE.format(host="hermes", reason="stdin is not JSON") == (
        "Tool guard unavailable: cannot read the hermes hook input (stdin is not JSON); "
        "tool calls are paused"
    )
    warning = vocabulary.SOFT_LIMIT_WARNING.format(
        label="browser", share=80.4, limit=5, currency="USD", period="day", rule="b"
    )
    assert warning == "Budget soft limit: browser tools at 80% of 5.00 USD this day (b)"


# -- the policy's words are the vocabulary's enums ---------------------------------------------


def literals_in(annotation: Any) -> list[Any]:
    """Every `Literal[...]` inside a field's annotation."""
    if typing.get_origin(annotation) is typing.Literal:
        return [annotation]
    return [found for arg in typing.get_args(annotation) for found in literals_in(arg)]


def enums_in(annotation: Any) -> set[type[enum.Enum]]:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {annotation}
    return {found for arg in typing.get_args(annotation) for found in enums_in(arg)}


SPECS: list[type[BaseModel]] = [
    schema.PolicySpec,
    schema.DefaultsSpec,
    schema.RuleSpec,
    schema.OverrideSpec,
    schema.MatchSpec,
    schema.ToolSpec,
]


def test_the_schema_spells_no_value_of_its_own() -> None:
    found = {
        f"{spec.__name__}.{name}": literals_in(field.annotation)
        for spec in SPECS
        for name, field in spec.model_fields.items()
        if literals_in(field.annotation)
    }
    assert list(found) == ["PolicySpec.version"]  # `version: 1`, the file format's own


def test_the_schema_and_the_model_use_the_vocabularys_enums() -> None:
    enum_fields = {
        (spec.__name__, name): enums_in(field.annotation)
        for spec in SPECS
        for name, field in spec.model_fields.items()
        if enums_in(field.annotation)
    }
    assert enum_fields == {
        ("DefaultsSpec", "mode"): {vocabulary.Mode},
        ("DefaultsSpec", "fail"): {vocabulary.FailMode},
        ("DefaultsSpec", "algorithm"): {vocabulary.Algorithm},
        ("RuleSpec", "algorithm"): {vocabulary.Algorithm},
        ("RuleSpec", "mode"): {vocabulary.Mode},
        ("RuleSpec", "on_exceed"): {vocabulary.OnExceed},
        ("RuleSpec", "fail"): {vocabulary.FailMode},
        ("MatchSpec", "kind"): {vocabulary.MatchKind},
    }
    assert (model.Mode, model.OnExceed, model.Algorithm) == (
        vocabulary.Mode,
        vocabulary.OnExceed,
        vocabulary.Algorithm,
    )


def test_a_rule_kind_is_the_name_of_its_limit_field() -> None:
    for spec in (schema.RuleSpec, schema.OverrideSpec):
        assert {str(kind) for kind in vocabulary.COUNTED_KINDS} <= set(spec.model_fields)
    # An access rule states its answer instead, as the field of the answer's name.
    assert set(vocabulary.ACCESS_ANSWERS) <= set(schema.RuleSpec.model_fields)
    assert set(vocabulary.ACCESS_ANSWERS) == set(vocabulary.OnExceed)
    assert set(vocabulary.COUNTED_KINDS) | {vocabulary.RuleKind.ACCESS} == set(vocabulary.RuleKind)
    assert set(vocabulary.TEMPLATE_FIELDS) == set(vocabulary.RuleKind)
    assert set(vocabulary.COUNTED_KINDS) <= set(vocabulary.TEMPLATES)
    kinds = {
        model.RateLimit.kind,
        model.ConcurrencyLimit.kind,
        model.BudgetLimit.kind,
        model.AccessLimit.kind,
    }
    assert kinds == set(vocabulary.RuleKind)
    assert set(vocabulary.RuleKind) > vocabulary.HOLDING_KINDS
    # Each parses to its own kind, named the same way everywhere.
    rules = {
        "rate": {"name": "r", "rate": "1/minute"},
        "concurrency": {"name": "c", "concurrency": 1},
        "budget": {"name": "b", "budget": "1/day"},
        "access": {"name": "a", "deny": "no"},
    }
    for kind, rule in rules.items():
        assert schema.RuleSpec.model_validate(rule).kind == kind
    assert schema.kind_of({}) is vocabulary.RuleKind.RATE


def test_the_policy_document_and_the_errors_show_plain_values() -> None:
    text = (
        "version: 1\ndefaults: {mode: shadow, fail: closed}\n"
        "rules:\n  - {name: r, rate: 1/minute, per: [user, tool], algorithm: token_bucket}\n"
    )
    policy = parse_policy(text.encode(), "p.yaml")
    [rule] = policy.rules
    assert rule.per == ("user", "tool")
    assert all(type(part) is str for part in rule.per)  # the counter keys' parts
    assert json.dumps(policy.document["rules"][0]["per"]) == '["user", "tool"]'
    assert policy.document["defaults"]["fail"] == "closed"
    twice = b"version: 1\nrules: [{name: r, rate: 1/minute, per: [user, user]}]\n"
    with pytest.raises(PolicyError, match=r"lists a dimension twice: \['user', 'user'\]"):
        parse_policy(twice, "p")


def test_the_decision_and_settle_names_are_the_apis() -> None:
    decision = CheckResponse.model_fields["decision"].annotation
    assert typing.get_args(decision) == vocabulary.DECISIONS == ("allow", "deny", "ask")
    outcome = SettleResponse.model_fields["outcome"].annotation
    assert set(typing.get_args(outcome)) == set(vocabulary.SETTLE_OUTCOMES) - {"unknown"}
    assert set(vocabulary.OnExceed) < set(vocabulary.DECISIONS)  # deny and ask


def test_a_fail_mode_is_checked_once() -> None:
    assert vocabulary.fail_mode("closed") is vocabulary.FailMode.CLOSED
    for wrong in ("shut", "", None, 1):
        with pytest.raises(ValueError, match=r"fail must be 'open' or 'closed'"):
            vocabulary.fail_mode(wrong)
    with pytest.raises(ValueError, match="fail must be"):
        Guard("http://127.0.0.1:9", fail="shut")


# -- the metadata fields -------------------------------------------------------------------------


def test_the_metadata_fields_are_the_vocabularys_everywhere() -> None:
    assert [f.name for f in fields(ToolFacts)] == list(vocabulary.METADATA_FIELDS)
    assert [n for n in ToolMetadata.model_fields if n != "title"] == list(
        vocabulary.METADATA_FIELDS
    )
    call_parts = {"kind", "model", "tool", "user", "group", "session", "team", "args"}
    assert [n for n in schema.MatchSpec.model_fields if n not in call_parts] == list(
        vocabulary.METADATA_FIELDS
    )
    for mcp, ours in vocabulary.MCP_HINTS.items():
        assert ToolMetadata.model_validate({mcp: True}).model_dump()[ours] is True
    assert set(vocabulary.MCP_HINTS.values()) < set(vocabulary.METADATA_FLAGS)


def test_the_metadata_reaches_the_engine_field_by_field() -> None:
    from ratewarden.service.convert import to_call

    given = dict.fromkeys(vocabulary.METADATA_FLAGS, True) | {"tags": ["a"]}
    call = to_call(CheckRequest(user="u", tool="t", metadata=ToolMetadata(**given)))
    assert call.facts == ToolFacts(
        **dict.fromkeys(vocabulary.METADATA_FLAGS, True), tags=frozenset({"a"})
    )


# -- one call-id scheme for every host ------------------------------------------------------------


@dataclass
class Daemon:
    """A stand-in daemon behind httpx's MockTransport: records each check and settle."""

    checks: list[dict[str, Any]]
    settles: list[str]

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/capabilities":  # asked before a check with args
            return httpx.Response(200, json={"policy_version": "v", "send_args": False})
        if request.url.path.endswith("/settle"):
            self.settles.append(request.url.path.split("/")[3])
            return httpx.Response(200, json={"call_id": "x", "outcome": "settled"})
        body = json.loads(request.content)
        self.checks.append(body)
        allow = {"decision": "allow", "allowed": True, "message": ""}
        return httpx.Response(200, json=allow | {"call_id": body.get("call_id", "rw-1")})

    def ids(self) -> list[str]:
        return [check["call_id"] for check in self.checks]


@pytest.fixture
def daemon() -> Daemon:
    return Daemon([], [])


def transport(daemon: Daemon) -> httpx.MockTransport:
    return httpx.MockTransport(daemon.answer)


def assert_one_scheme(ids: list[str], lead: str) -> None:
    assert len(ids) == 2
    for made in ids:
        assert PATTERN.fullmatch(made), made
        assert made.rsplit(vocabulary.SEPARATOR, 1)[0] == lead
        assert len(made) <= vocabulary.MAX_CALL_ID


def test_hermes_plugin_ids(daemon: Daemon) -> None:
    from ratewarden.integrations.hermes import RatewardenPlugin

    plugin = RatewardenPlugin(guard=Guard(transport=transport(daemon)), user=lambda hook: "u")
    for _ in range(2):
        plugin.pre_tool_call(tool_name="terminal", tool_call_id="call_0")
    assert_one_scheme(daemon.ids(), "call_0")
    assert len(set(daemon.ids())) == 2  # a reused tool-call id is still a new call
    daemon.checks.clear()
    for _ in range(2):
        plugin.pre_tool_call(tool_name="terminal")
    assert_one_scheme(daemon.ids(), "hermes")
    plugin.guard.close()


async def test_strands_ids(daemon: Daemon) -> None:
    from ratewarden.integrations.strands import RatewardenHook

    hook = RatewardenHook(guard=Guard(transport=transport(daemon)))
    for use in ({"toolUseId": "tooluse_7"}, {"toolUseId": "tooluse_7"}, {}, {}):
        event = SimpleNamespace(
            cancel_tool=False,
            tool_use={"name": "terminal", "input": {}, **use},
            invocation_state={"user_id": "u"},
            selected_tool=None,
        )
        await hook.before_tool_call(event)
    assert_one_scheme(daemon.ids()[:2], "tooluse_7")
    assert_one_scheme(daemon.ids()[2:], "strands")
    hook.guard.close()


class _Decision(enum.Enum):  # pydantic-ai-middleware's ToolDecision
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


@dataclass
class _Permission:  # its ToolPermissionResult
    decision: _Decision
    reason: str = ""


class _GuardrailOutput:  # the OpenAI Agents SDK's ToolGuardrailFunctionOutput
    @classmethod
    def allow(cls, output_info: Any = None) -> str:
        return "allow"

    @classmethod
    def reject_content(cls, message: str, output_info: Any = None) -> str:
        return message


@dataclass(eq=False)
class _ToolContext:  # its ToolContext (weak-referenceable)
    tool_name: str
    tool_call_id: str | None
    context: Any


@dataclass
class _InputGuardrail:  # its ToolInputGuardrail
    guardrail_function: Any
    name: str


def stand_in(monkeypatch: pytest.MonkeyPatch, module: str, **attributes: Any) -> None:
    fake = types.ModuleType(module)
    for name, value in attributes.items():
        setattr(fake, name, value)
    monkeypatch.setitem(sys.modules, module, fake)


async def test_pydantic_ai_ids(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(
        monkeypatch,
        "pydantic_ai_middleware",
        ToolDecision=_Decision,
        ToolPermissionResult=_Permission,
    )
    from ratewarden.integrations.pydantic_ai import RatewardenMiddleware

    guard = AsyncGuard(transport=transport(daemon))
    middleware = RatewardenMiddleware(guard)
    for ctx in (SimpleNamespace(tool_call_id="call_9"),) * 2 + (None, None):
        await middleware.before_tool_call("terminal", {}, {"user_id": "u"}, ctx)
    assert_one_scheme(daemon.ids()[:2], "call_9")
    assert_one_scheme(daemon.ids()[2:], "pydantic-ai")
    await guard.aclose()


async def test_openai_agents_ids(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(
        monkeypatch,
        "agents",
        ToolGuardrailFunctionOutput=_GuardrailOutput,
        ToolInputGuardrail=_InputGuardrail,
    )
    from ratewarden.integrations.openai_agents import make_ratewarden_guardrail

    guard = AsyncGuard(transport=transport(daemon))
    check = make_ratewarden_guardrail(guard).guardrail_function
    for tool_call_id in ("call_1", "call_1", None, None):
        data = SimpleNamespace(context=_ToolContext("terminal", tool_call_id, {"user_id": "u"}))
        assert await check(data) == "allow"
    assert_one_scheme(daemon.ids()[:2], "call_1")
    assert_one_scheme(daemon.ids()[2:], "openai-agents")
    await guard.aclose()


def test_hermes_shell_hook_ids() -> None:
    """Pre and post run in two processes: the digits are a digest, the same in both."""
    from ratewarden.hooks import hermes
    from ratewarden.hooks.contract import PostCall, PreCall

    def read(event: str, response: str) -> str:
        extra = {"tool_call_id": "call_0", "api_request_id": response, "status": "ok"}
        payload = {"hook_event_name": event, "tool_name": "terminal", "extra": extra}
        found = hermes.read(json.dumps(payload).encode(), {})
        assert isinstance(found, PreCall | PostCall)
        assert found.call_id is not None
        return found.call_id

    pre = [read("pre_tool_call", response) for response in ("t1:api:1", "t2:api:1")]
    post = [read("post_tool_call", response) for response in ("t1:api:1", "t2:api:1")]
    assert_one_scheme(pre, "call_0")
    assert len(set(pre)) == 2  # `call_0` on both turns, two calls
    assert post == pre  # each post hook names its own pre hook's call


def test_a_host_id_the_api_refuses_is_cut_and_cleaned(daemon: Daemon) -> None:
    """Control characters left out, the lead cut to fit: always an id the API takes."""
    made = vocabulary.call_id("host", "call\x00\n\u0085_7" + "x" * 300)
    assert PATTERN.fullmatch(made)
    assert made.startswith("call_7xxx")
    assert len(made) == vocabulary.MAX_CALL_ID
    assert vocabulary.call_id("host", "\x00\x01").startswith("host~")  # nothing left: the host
    assert vocabulary.call_id("host", 42).startswith("host~")  # not a string: not an id
    # Cut leads still tell two hook calls apart.
    long_id = "c" * 200
    assert vocabulary.call_id("h", long_id, unique="r") != vocabulary.call_id(
        "h", long_id + "d", unique="r"
    )


def test_a_mapped_name_has_the_same_shape() -> None:
    from ratewarden.wire import names

    assert PATTERN.fullmatch(names.usable_call_id("c\x00"))
    assert re.fullmatch(r".{0,239}~[0-9a-f]{16}", names.subject("x" * 300))


# -- one reader of the client settings -------------------------------------------------------------


def test_the_client_settings_are_read_in_one_place() -> None:
    settings = vocabulary.ClientSettings.read(
        {
            "RATEWARDEN_URL": "http://d:1",
            "RATEWARDEN_TOKEN": "t",
            "RATEWARDEN_USER": "ann",
            "RATEWARDEN_FAIL": " Closed ",
        }
    )
    assert (settings.url, settings.token, settings.user, settings.fail) == (
        "http://d:1",
        "t",
        "ann",
        "closed",
    )
    empty = vocabulary.ClientSettings.read({"RATEWARDEN_TOKEN": "", "RATEWARDEN_USER": ""})
    assert (empty.url, empty.token, empty.user, empty.fail) == (
        vocabulary.DEFAULT_URL,
        None,
        None,
        "open",
    )
    assert vocabulary.ClientSettings.read({"RATEWARDEN_FAIL": "shut"}).fail == "closed"


def test_a_guard_reads_the_environment_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATEWARDEN_URL", "http://late:2")
    monkeypatch.setenv("RATEWARDEN_TOKEN", "secret")
    guard = Guard()
    assert (guard.url, guard.token) == ("http://late:2", "secret")
    given = Guard("http://given:3", "mine")
    assert (given.url, given.token) == ("http://given:3", "mine")
    guard.close()
    given.close()


CLIENT_SIDE = [PACKAGE / "client.py", *sorted((PACKAGE / "integrations").rglob("*.py"))]


@pytest.mark.parametrize("path", CLIENT_SIDE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_other_client_module_reads_a_ratewarden_variable(path: Path) -> None:
    assert [text for _, text in strings_in(path) if text.startswith("RATEWARDEN_")] == []
