"""Canonical names against a hostile caller: a call in a host's names must never be less
restricted than the same call sent in canonical names (service/convert.py, wire/tools.py).
"""

from __future__ import annotations

import pytest

from ratewarden.policy import parse_policy
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


@pytest.mark.xfail(
    strict=True,
    reason="wire/tools.py _renamed keeps a canonical key the host also sent: Claude Code's "
    "Read reads file_path, but the rule reads the decoy `path` (owned by the hosts helper)",
)
def test_a_decoy_canonical_key_does_not_hide_the_hosts_own_path() -> None:
    policy = parse_policy(DENY_ETC.encode())
    args = {"file_path": "/etc/shadow", "path": "/tmp/harmless"}
    call = to_call(request(tool="Read", host="claude-code", args=args), policy.names)
    honest = to_call(request(tool="Read", host="claude-code", args={"file_path": "/etc/shadow"}))
    assert [a.rule.name for a in policy.applicable(honest)] == ["no-etc"]
    assert [a.rule.name for a in policy.applicable(call)] == ["no-etc"]
