"""Canonical names against a hostile caller: a call in a host's names must never be less
restricted than the same call sent in canonical names (service/convert.py, wire/tools.py).
"""

from __future__ import annotations

import pytest

from ratewarden.policy import PolicyError, parse_policy
from ratewarden.service.convert import to_call
from ratewarden.wire.bodies import CheckRequest


def request(**fields: object) -> CheckRequest:
    return CheckRequest.model_validate({"user": "u", **fields})


TWO_RENAMES = """\
version: 1
tools:
  my_copy: {same_as: copy_file, args: {src: from, dst: to}}
rules:
  - name: no-writes-to-one
    match: {tool: copy_file, args: {to: {in: [2]}}}
    deny: "not there"
"""


def test_a_cut_argument_sharing_its_value_object_follows_its_own_rename() -> None:
    """`1` is one object wherever it appears: the cut `dst` moved to `to`, not `from`."""
    policy = parse_policy(TWO_RENAMES.encode())
    sent = request(tool="my_copy", args={"src": 1, "dst": 1}, args_cut=["dst"])
    call = to_call(sent, policy.names)
    assert call.args == {"from": 1, "to": 1}
    assert ("to",) in call.args_cut
    # Sent in canonical names, the same cut: the same paths are read as cut.
    plain = to_call(request(tool="copy_file", args={"from": 1, "to": 1}, args_cut=["to"]))
    assert set(plain.args_cut) <= set(call.args_cut)
    # So the rule reads `to` as holding (cut), as for the plain call: never as `1`.
    assert [a.rule.name for a in policy.applicable(call)] == ["no-writes-to-one"]
    assert [a.rule.name for a in policy.applicable(plain)] == ["no-writes-to-one"]


DENY_ETC = """\
version: 1
rules:
  - name: no-etc
    match: {tool: read_file, args: {path: {prefix: "/etc/"}}}
    deny: "not /etc"
"""


def test_a_decoy_canonical_key_does_not_hide_the_hosts_own_path() -> None:
    policy = parse_policy(DENY_ETC.encode())
    args = {"file_path": "/etc/shadow", "path": "/tmp/harmless"}
    call = to_call(request(tool="Read", host="claude-code", args=args), policy.names)
    honest = to_call(request(tool="Read", host="claude-code", args={"file_path": "/etc/shadow"}))
    assert [a.rule.name for a in policy.applicable(honest)] == ["no-etc"]
    assert [a.rule.name for a in policy.applicable(call)] == ["no-etc"]


MY_SHELL = """\
version: 1
tools:
  my_shell: {same_as: terminal, args: {cmd: command}}
rules:
  - name: no-root-delete
    match: {tool: terminal, args: {command: {contains: "rm -rf /"}}}
    deny: "not that"
"""


def test_a_same_as_lines_decoy_canonical_key_does_not_hide_the_tools_own() -> None:
    """my_shell runs `cmd`: a `command` sent beside it is a decoy the rule must not read."""
    policy = parse_policy(MY_SHELL.encode())
    decoyed = {"cmd": "rm -rf /", "command": "ls"}
    call = to_call(request(tool="my_shell", args=decoyed), policy.names)
    assert call.args == {"command": "rm -rf /"}
    assert [a.rule.name for a in policy.applicable(call)] == ["no-root-delete"]
    # Cut, the decoy's path cannot be followed: the whole args read as cut (holding).
    cut = to_call(request(tool="my_shell", args=decoyed, args_cut=["command"]), policy.names)
    assert cut.args_cut == ((),)


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as failed:
        parse_policy(text.encode(), source="p.yaml")
    return failed.value.lines()


@pytest.mark.parametrize(
    ("renames", "problem"),
    [
        ("{a: b, b: c}", "tools.t: args.a: 'b' is itself renamed (args.b)"),
        ("{a: b, b: a}", "'b' is itself renamed"),
        ("{a: path, b: path}", "args: 'a' and 'b' are both renamed to 'path'"),
        ("{a: a}", "args.a: renamed to itself"),
        ("{a: x.y}", "args.a: 'x.y' is a path, not one argument's name"),
        ("{a: '*'}", "args.a: '*' is a path"),
        ("{a: 'x y'}", "args.a: 'x y' is not an argument name"),
    ],
)
def test_renames_whose_outcome_hangs_on_their_order_are_refused(renames: str, problem: str) -> None:
    """`{a: b, b: c}` sent `{a: 1}` put 1 in `c`: a rule on `b` read nothing."""
    text = f"version: 1\ntools:\n  t: {{same_as: read_file, args: {renames}}}\nrules: []\n"
    found = problems(text)
    assert any(problem in line for line in found), found
    assert all(line.startswith("p.yaml:3:") for line in found), found
