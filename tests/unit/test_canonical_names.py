"""Canonical tool names on the policy's side: a request in a host's names becomes a call in
canonical terms (service/convert.py), a rule matches either name (policy/model.py), and
the policy's own `same_as` lines extend and override the built-in table.

The built-in rows used here are wire/tools.py's: claude-code `Bash`
(terminal) and `Read` (read_file, `file_path` -> `path`), gemini `run_shell_command`.
"""

from __future__ import annotations

import pytest

from ratewarden.calls import Call
from ratewarden.engine.engine import fingerprint
from ratewarden.policy import PolicyError, parse_policy
from ratewarden.service.convert import to_call
from ratewarden.wire.bodies import CheckRequest


def request(**fields: object) -> CheckRequest:
    return CheckRequest.model_validate({"user": "u", **fields})


def test_a_request_naming_no_host_is_taken_as_it_is() -> None:
    call = to_call(request(tool="Bash", args={"command": "ls"}))
    assert (call.tool, call.host_tool, call.args) == ("Bash", None, {"command": "ls"})
    sent = to_call(request(tool="terminal", host_tool="Bash"))
    assert (sent.tool, sent.host_tool) == ("terminal", "Bash")


def test_a_hosts_tool_becomes_its_canonical_one_with_its_args_reshaped() -> None:
    call = to_call(request(tool="Read", host="claude-code", args={"file_path": "/etc/passwd"}))
    assert (call.tool, call.host_tool, call.args) == ("read_file", "Read", {"path": "/etc/passwd"})
    shell = to_call(request(tool="run_shell_command", host="gemini", args={"command": "ls"}))
    assert (shell.tool, shell.host_tool, shell.args) == ("terminal", "run_shell_command", {
        "command": "ls"})  # fmt: skip
    # Unknown to the table (the host, or the tool on that host): unchanged.
    assert to_call(request(tool="Read", host="no-such-host")).tool == "Read"
    assert to_call(request(tool="run_shell_command", host="claude-code")).tool == (
        "run_shell_command"
    )
    # A host that calls the tool by its canonical name: no host_tool.
    assert to_call(request(tool="terminal", host="hermes")).host_tool is None


def test_a_cut_argument_is_followed_to_its_canonical_name() -> None:
    """A cut path names the host's argument: renamed with it, else a condition on `path`
    would be decided on a value the client had to cut."""
    args = {"file_path": "/a/" + "x" * 10, "limit": 5}
    call = to_call(request(tool="Read", host="claude-code", args=args, args_cut=["file_path"]))
    assert call.args_cut == (("path",),)
    kept = to_call(request(tool="Read", host="claude-code", args=args, args_cut=["limit"]))
    assert kept.args_cut == (("limit",),)
    whole = to_call(request(tool="Read", host="claude-code", args=args, args_cut=["*"]))
    assert whole.args_cut == ((),)
    # No args sent, all of them cut: nothing to follow.
    bare = to_call(request(tool="Read", host="claude-code", args_cut=["*"]))
    assert (bare.args, bare.args_cut) == ({}, ((),))


def test_the_host_tool_is_part_of_a_named_calls_fingerprint() -> None:
    plain = Call("u", "terminal", "c1")
    hosted = Call("u", "terminal", "c1", host_tool="Bash")
    other = Call("u", "terminal", "c1", host_tool="run_shell_command")
    assert len({fingerprint(plain), fingerprint(hosted), fingerprint(other)}) == 3
    # A call id the daemon made up is never replayed: user and tool are enough.
    made = Call("u", "terminal", "c1", named=False, host_tool="Bash")
    assert fingerprint(made) == fingerprint(Call("u", "terminal", "c1", named=False))


BOTH = """\
version: 1
rules:
  - name: shell
    match: {tool: terminal}
    rate: 10/minute
  - name: bash
    match: {tool: Bash}
    rate: 5/minute
  - name: globbed
    match: {tool: "run_*"}
    rate: 5/minute
  - name: not-bash
    match: {tool: terminal}
    unless: {tool: Bash}
    rate: 5/minute
"""


def names(policy_text: str, call: Call) -> list[str]:
    policy = parse_policy(policy_text.encode())
    return [applied.rule.name for applied in policy.applicable(call)]


def test_a_rule_matches_the_canonical_tool_or_the_hosts_own_name() -> None:
    claude = Call("u", "terminal", "c", host_tool="Bash")
    gemini = Call("u", "terminal", "c", host_tool="run_shell_command")
    plain = Call("u", "terminal", "c")
    assert names(BOTH, claude) == ["shell", "bash"]  # `unless: Bash` excuses it
    assert names(BOTH, gemini) == ["shell", "globbed", "not-bash"]
    assert names(BOTH, plain) == ["shell", "not-bash"]
    # The same policy object, asked in another order, gives the same answers (the caches).
    policy = parse_policy(BOTH.encode())
    for call in (plain, claude, gemini, claude, plain):
        first = [a.rule.name for a in policy.applicable(call)]
        assert first == names(BOTH, call)


def test_a_host_tool_no_rule_names_shares_the_plain_cache_entry() -> None:
    policy = parse_policy(BOTH.encode())
    unnamed = Call("u", "terminal", "c", host_tool="Shell")  # no rule names it
    assert [a.rule.name for a in policy.applicable(unnamed)] == ["shell", "not-bash"]
    assert policy._hosted.cache_info().currsize == 0  # type: ignore[attr-defined]
    policy.applicable(Call("u", "terminal", "c", host_tool="Bash"))
    assert policy._hosted.cache_info().currsize == 1  # type: ignore[attr-defined]


def test_explain_says_a_rule_matched_by_the_hosts_name() -> None:
    policy = parse_policy(BOTH.encode())
    found = {e.rule.name: e for e in policy.explain(Call("u", "terminal", "c", host_tool="Bash"))}
    assert found["bash"].applies
    assert ("tool in ['Bash']", True) in found["bash"].conditions
    assert not found["globbed"].applies
    assert found["globbed"].reason == "tool 'terminal' (the host's 'Bash') is not in ['run_*']"
    assert found["not-bash"].reason == "its unless: matches the call"


# -- the policy's own lines (tools: NAME: {same_as: ...}) -------------------------------


def policy_with(tools: str, rules: str = "") -> str:
    return f"version: 1\ntools:\n{tools}rules:\n{rules or '  []'}\n"


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as failed:
        parse_policy(text.encode(), source="p.yaml")
    return failed.value.lines()


def test_a_same_as_line_with_no_host_maps_every_host_and_plain_checks() -> None:
    policy = parse_policy(
        policy_with("  my_shell: {same_as: terminal, args: {cmd: command}}\n").encode()
    )
    plain = to_call(request(tool="my_shell", args={"cmd": "ls"}), policy.names)
    assert (plain.tool, plain.host_tool, plain.args) == ("terminal", "my_shell", {"command": "ls"})
    hosted = to_call(request(tool="my_shell", host="gemini"), policy.names)
    assert (hosted.tool, hosted.host_tool) == ("terminal", "my_shell")
    # The built-in rows still apply beside it.
    assert to_call(request(tool="Bash", host="claude-code"), policy.names).tool == "terminal"
    # A policy without same_as lines has no names of its own: the request's host decides.
    bare = parse_policy(b"version: 1\nrules: []\n")
    assert bare.names is None
    assert to_call(request(tool="my_shell"), bare.names).tool == "my_shell"


def test_a_same_as_line_to_terminal_joins_an_argv_command_as_the_built_in_rows_do() -> None:
    """A deny on `command` must read `rm -rf /` whichever row said the tool is terminal."""
    policy = parse_policy(
        policy_with("  my_shell: {same_as: terminal, args: {argv: command}}\n").encode()
    )
    call = to_call(
        request(tool="my_shell", args={"argv": ["bash", "-lc", "rm -rf /"]}), policy.names
    )
    assert call.args == {"command": "rm -rf /"}


def test_a_same_as_line_for_a_host_overrides_the_built_in_row_for_that_host_only() -> None:
    tools = "  Bash: {same_as: codex_shell, host: codex}\n  Shell: {same_as: terminal, host: [x]}\n"
    assert problems(policy_with(tools)) == [
        "p.yaml:4: tools.Shell.host[0]: unknown host 'x'; known: claude-code, gemini, cursor, "
        "codex, agent-code, hermes"
    ]
    policy = parse_policy(policy_with(tools.splitlines(keepends=True)[0]).encode())
    codex = to_call(request(tool="Bash", host="codex"), policy.names)
    assert (codex.tool, codex.host_tool) == ("codex_shell", "Bash")
    claude = to_call(request(tool="Bash", host="claude-code"), policy.names)
    assert (claude.tool, claude.host_tool) == ("terminal", "Bash")
    assert to_call(request(tool="Bash"), policy.names).tool == "Bash"  # no host: not codex
    # A host's line wins over a line for every host.
    both = parse_policy(
        b"version: 1\ntools:\n  x: {same_as: a}\n  y: {same_as: b, host: [gemini, cursor]}\n"
    )
    assert both.canonical("gemini", "y").tool == "b"
    assert both.canonical("codex", "y").tool == "y"
    assert both.canonical(None, "x").tool == "a"


@pytest.mark.parametrize(
    ("tools", "problem"),
    [
        ("  a: {same_as: a}\n", "tools.a.same_as: 'a' is the same as itself"),
        (
            "  a: {same_as: b}\n  b: {same_as: c}\n",
            "tools.a.same_as: 'b' is itself the same as "
            "'c' (tools.b): a line maps in one step; write same_as: c",
        ),
        (
            "  a: {same_as: b}\n  b: {same_as: a}\n",
            "tools.a.same_as: 'b' is itself the same as 'a'",
        ),
        ("  a: {same_as: 3}\n", "tools.a.same_as: Input should be a valid string, got 3"),
        ("  a: {same_as: [b]}\n", "tools.a.same_as: Input should be a valid string"),
        ("  a: {same_as: ''}\n", "tools.a.same_as: String should have at least 1 character"),
        ('  a: {same_as: "b\\u0007"}\n', "tools.a.same_as: "),
        (f"  a: {{same_as: {'b' * 300}}}\n", "tools.a.same_as: String should have at most 256"),
        ("  a: {same_as: b, host: 7}\n", "tools.a.host: Input should be a valid list, got 7"),
        ("  a: {same_as: b, host: []}\n", "tools.a.host: Value should have at least 1 item"),
        (
            f"  a: {{same_as: b, host: {'h' * 300}}}\n",
            "tools.a.host[0]: String should have at most 64 characters",
        ),
        ("  a: {same_as: b, args: [x]}\n", "tools.a.args: Input should be a valid dictionary"),
        ("  a: {same_as: b, args: {x: 1}}\n", "tools.a.args.x: Input should be a valid string"),
        ("  a: {host: codex}\n", "tools.a: host only applies with same_as"),
        ("  a: {args: {x: y}}\n", "tools.a: args only applies with same_as"),
        ("  a: {same_as: b, cost: 1}\n", "tools.a: cost does not apply with same_as"),
        ("  a: {same_as: b, label: l}\n", "tools.a: label does not apply with same_as"),
        ("  'a*': {same_as: b}\n", "tools.a*.same_as: a same_as line names one tool exactly"),
        ("  default: {same_as: b}\n", "tools.default.same_as: a same_as line names one tool"),
        ("  a: {same_as: 'b*'}\n", "tools.a.same_as: same_as names one tool exactly, not the glob"),
    ],
)
def test_a_wrong_same_as_line_is_refused_naming_the_field(tools: str, problem: str) -> None:
    found = problems(policy_with(tools))
    assert any(problem in line for line in found), found
    assert all(line.startswith("p.yaml:") for line in found), found  # each with its line


def test_a_same_as_line_is_no_catalogue_entry() -> None:
    """Its name's calls are the canonical tool's: its cost is that tool's."""
    policy = parse_policy(
        policy_with(
            "  terminal: {cost: 0.5, label: shell}\n"
            "  my_shell: {same_as: terminal, host: cursor}\n"
            "  default: {cost: 0.1}\n"
        ).encode()
    )
    assert policy.cost_for("terminal") == 0.5
    assert policy.cost_for("my_shell") == 0.1  # another host's my_shell: not mapped
    assert policy.label_for("my_shell") == "my_shell"


# -- policy check's warnings -------------------------------------------------------------


def test_a_rule_naming_a_hosts_tool_is_warned_of_with_its_line() -> None:
    text = policy_with(
        "  fetcher: {same_as: Bash}\n",
        "  - name: x\n    match: {tool: [Bash, Read]}\n    rate: 1/minute\n"
        "  - name: y\n    match: {tool: [Bash, terminal]}\n    unless: {tool: run_shell_command}\n"
        "    rate: 1/minute\n"
        "  - name: z\n    match: {tool: 'Ba*'}\n    rate: 1/minute\n",
    )
    warned = [(w.field, w.line, w.message) for w in parse_policy(text.encode()).warnings]
    assert warned == [
        ("rules[0].match.tool", 6, "rule 'x' (line 6) names 'Bash', Claude Code's, Codex's and "
         "agent-code's name for 'terminal': it matches only those hosts' calls; name "
         "'terminal' to cover every host"),
        ("rules[0].match.tool", 6, "rule 'x' (line 6) names 'Read', Claude Code's and "
         "Cursor's name for 'read_file': it matches only those hosts' calls; name "
         "'read_file' to cover every host"),
        # y names terminal too: its Bash is no narrowing. Its unless names Gemini's shell.
        ("rules[1].unless.tool", 10, "rule 'y' (line 10) names 'run_shell_command', Gemini "
         "CLI's name for 'terminal': it matches only those hosts' calls; name 'terminal' to "
         "cover every host"),
        ("tools.fetcher.same_as", 3, "tools entry 'fetcher' is the same as 'Bash', Claude "
         "Code's, Codex's and agent-code's name for 'terminal': its calls are counted as "
         "'Bash', apart from every other host's; write same_as: terminal"),
    ]  # fmt: skip
    assert (
        parse_policy(
            b"version: 1\nrules: [{name: a, match: {tool: terminal}, rate: 1/minute}]\n"
        ).warnings
        == ()
    )


def test_check_request_sends_the_host_and_its_name_made_acceptable() -> None:
    from ratewarden.wire.names import check_request

    sent = check_request(user="u", tool="Bash", host="claude-code", args={"command": "ls"})
    assert (sent.tool, sent.host, sent.host_tool) == ("Bash", "claude-code", None)
    assert to_call(sent).tool == "terminal"
    # A host or host name the API would refuse is mapped, like any name: then no host
    # table knows it, and the tool keeps its name.
    long = check_request(user="u", tool="Bash", host="h" * 300, host_tool="t\x00" * 200)
    assert long.host is not None
    assert long.host.startswith("h")
    assert len(long.host) <= 256
    assert long.host_tool is not None
    assert "\x00" not in long.host_tool
    assert to_call(long).tool == "Bash"
    assert check_request(user="u", tool="t", host="", host_tool="").host is None  # empty: absent
