"""Canonical tool names on the policy's side: a request in a host's names becomes a call in
canonical terms (service/convert.py), a rule matches either name (policy/model.py), and
the policy's own `same_as` lines extend and override the built-in table.

The built-in rows used here are wire/tools.py's provisional ones: claude-code `Bash`
(terminal) and `Read` (read_file, `file_path` -> `path`), gemini `run_shell_command`.
"""

from __future__ import annotations

from ratewarden.calls import Call
from ratewarden.engine.engine import fingerprint
from ratewarden.policy import parse_policy
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
