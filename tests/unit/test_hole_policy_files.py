"""Issue 15, hole 7: a policy file cannot exhaust the daemon.

A few hundred bytes of nested YAML anchors and aliases ("billion laughs") name a tree of
hundreds of millions of nodes; loading one took `policy check` past 20 s and a watching
daemon to 2.2 GB. Such a file, and any file over the documented limits (size, aliases,
nodes, nesting), is refused while it is composed, naming the file, the line and the
cause. The tests count the work rather than time it: the nodes the composer made, the
expanded nodes walked after it, the memory allocated. A reload of such a file leaves the
policy in force; modest anchors, aliases and merge keys still load.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml.composer

from ratewarden.policy import PolicyError, load_policy, parse_policy
from ratewarden.policy import loader as loader_module
from tests.helpers.app import assert_error_shape, serving
from tests.helpers.hostenv import clean_environment
from tests.service.test_reload import (
    POLICY_A,
    VERSION_A,
    eventually,
    make_app,
    policy_of,
    reloads,
    version_of,
    write,
)

# The limits as docs/policy.md states them.
MAX_BYTES = 256 * 1024
MAX_ALIASES = 100
MAX_NODES = 20_000
MAX_DEPTH = 64

SOURCE = "ratewarden.yaml"
TOO_MANY_NODES = f"too many nodes (limit {MAX_NODES}, each alias counted as a copy)"
TOO_DEEP = f"nested too deeply (limit {MAX_DEPTH} levels, aliases expanded)"
TOO_LARGE = f"file too large: more than {MAX_BYTES} bytes (limit 256 KiB)"
# A file that names more nodes than this was expanded: the walk after composing stops it.
WALK_CAP = MAX_NODES + 10_000
# What refusing a small bomb may allocate; expanding one takes gigabytes.
REFUSAL_BYTES = 2 * 1024 * 1024


def bomb(levels: int = 9, width: int = 9) -> tuple[str, int]:
    """A billion-laughs policy (width ** levels nodes once expanded), and the line at which
    the expanded count passes MAX_NODES: the first list whose copies pass it by themselves
    (each list of level k names about width ** k nodes)."""
    lines = ["version: 1", "rules: []", f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * width)}]" for k in range(1, levels)]
    crossing = next(k for k in range(levels) if width ** (k + 1) > MAX_NODES)
    return "\n".join(lines) + "\n", 3 + crossing


@pytest.fixture(autouse=True)
def no_ratewarden_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RATEWARDEN_"):
            monkeypatch.delenv(name)


@dataclass
class Work:
    """Nodes the YAML composer made, and expanded nodes walked after composing."""

    composed: int = 0
    walked: int = 0


class Expanded(AssertionError):
    """The loader walked more nodes than a bounded file can name: it expanded the file."""


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Work:
    """Count the composer's nodes and the loader's walk of the composed tree (the walk
    follows aliases, so it is where an alias bomb expands); stop a walk past WALK_CAP
    so that a loader without limits fails here instead of filling the machine's memory."""
    counted = Work()
    compose = yaml.composer.Composer.compose_node
    walk = loader_module._index_lines

    def counting_compose(self: Any, parent: Any, index: Any) -> Any:
        counted.composed += 1
        return compose(self, parent, index)

    def counting_walk(*args: Any) -> None:
        counted.walked += 1
        if counted.walked > WALK_CAP:
            raise Expanded(f"walked more than {WALK_CAP} nodes: the file was expanded")
        walk(*args)

    monkeypatch.setattr(yaml.composer.Composer, "compose_node", counting_compose)
    monkeypatch.setattr(loader_module, "_index_lines", counting_walk)
    return counted


class Allocated:
    """The peak of memory allocated above the level at the last `mark()` (tracemalloc)."""

    def __init__(self) -> None:
        self.mark()

    def mark(self) -> None:
        self._base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()

    def peak(self) -> int:
        return tracemalloc.get_traced_memory()[1] - self._base


@pytest.fixture
def allocated() -> Iterator[Allocated]:
    tracemalloc.start()
    try:
        yield Allocated()
    finally:
        tracemalloc.stop()


def refusal(raw: str | bytes) -> list[str]:
    """The lines of the PolicyError that parsing `raw` as ratewarden.yaml raises."""
    data = raw.encode() if isinstance(raw, str) else raw
    with pytest.raises(PolicyError) as raised:
        parse_policy(data, source=SOURCE)
    return raised.value.lines()


# -- the alias bomb ----------------------------------------------------------------------


def test_hole7_alias_bomb_is_refused_before_it_expands(
    tmp_path: Path, work: Work, allocated: Allocated
) -> None:
    text, line = bomb()
    assert len(text) < 512  # 9 ** 9: 387 420 489 nodes once expanded
    path = tmp_path / SOURCE
    path.write_text(text)
    with pytest.raises(PolicyError) as raised:
        load_policy(path)
    assert raised.value.lines() == [f"{path}:{line}: (top level): {TOO_MANY_NODES}"]
    assert work.walked == 0  # refused while composing: nothing walked the expanded tree
    assert work.composed < text.count("lol") + text.count("*") + 10  # each node once
    assert allocated.peak() < REFUSAL_BYTES


def test_hole7_policy_check_refuses_a_bomb_naming_file_and_cause(tmp_path: Path) -> None:
    """`ratewarden policy check` as a real process, its address space capped at 512 MiB so
    that a loader without limits dies of MemoryError instead of swapping the machine."""
    text, line = bomb()
    bad = tmp_path / SOURCE
    bad.write_text(text)
    good = tmp_path / "good.yaml"
    good.write_text(POLICY_A)
    capped = (
        "import resource, runpy; resource.setrlimit(resource.RLIMIT_AS, (1 << 29, 1 << 29)); "
        "runpy.run_module('ratewarden', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", capped, "policy", "check", str(good), str(bad)],
        cwd=tmp_path,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"{bad}:{line}: (top level): {TOO_MANY_NODES}\n"
    assert done.stdout == f"{good}: ok (version {VERSION_A}, 3 rules)\n"


# -- each limit: at it, a file loads; one past it, it is refused with its cause ----------


def aliases(count: int) -> str:
    head = "version: 1\nrules: []\ns: &s 0\nx:\n"  # alias k is on line 4 + k
    return head + "  - *s\n" * count


def flat_list(count: int) -> str:
    return "version: 1\nrules: []\nx: [" + ",".join(["0"] * count) + "]\n"  # count + 7 nodes


def nested(levels: int) -> str:
    return "version: 1\nrules: []\nx: " + "[" * levels + "0" + "]" * levels + "\n"


def nested_through_alias(levels: int) -> str:
    """A 32-level anchor, aliased under `levels` more: 2 + levels + 32 - 1 levels."""
    anchor = "a: &a " + "[" * 31 + "0" + "]" * 31
    return f"version: 1\nrules: []\n{anchor}\nb: " + "[" * levels + "*a" + "]" * levels + "\n"


def sized(size: int) -> bytes:
    policy = b"version: 1\nrules: []\nx: 0\n# "
    return policy + b"x" * (size - len(policy) - 1) + b"\n"


# name: (a document at the limit, one past it, the line and cause the second is refused with)
LIMITS: dict[str, tuple[str | bytes, str | bytes, str]] = {
    "aliases": (
        aliases(MAX_ALIASES),
        aliases(MAX_ALIASES + 1),
        f"{SOURCE}:{4 + MAX_ALIASES + 1}: (top level): too many aliases (limit {MAX_ALIASES})",
    ),
    "nodes": (
        flat_list(MAX_NODES - 7),
        flat_list(MAX_NODES - 6),
        f"{SOURCE}:3: (top level): {TOO_MANY_NODES}",
    ),
    "depth": (nested(MAX_DEPTH - 2), nested(MAX_DEPTH - 1), f"{SOURCE}:3: (top level): {TOO_DEEP}"),
    "depth through an alias": (
        nested_through_alias(MAX_DEPTH - 33),
        nested_through_alias(MAX_DEPTH - 32),
        f"{SOURCE}:4: (top level): {TOO_DEEP}",
    ),
    "bytes": (
        sized(MAX_BYTES),
        sized(MAX_BYTES + 1),
        f"{SOURCE}: (top level): {TOO_LARGE}",
    ),
}


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.slow
def test_hole7_each_limit_is_refused_with_its_cause(limit: str, work: Work) -> None:
    at_limit, over_limit, refused = LIMITS[limit]
    assert refusal(over_limit) == [refused]
    # At the limit the file gets as far as the schema: only its unknown fields are errors.
    data = at_limit.encode() if isinstance(at_limit, str) else at_limit
    with pytest.raises(PolicyError) as raised:
        parse_policy(data, source=SOURCE)
    assert {issue.message for issue in raised.value.issues} == {"unknown field"}


def test_hole7_a_long_document_is_refused_after_composing_at_most_the_limit(
    work: Work,
) -> None:
    text = flat_list(3 * MAX_NODES)
    assert len(text) < MAX_BYTES
    assert refusal(text) == [f"{SOURCE}:3: (top level): {TOO_MANY_NODES}"]
    assert work.composed == MAX_NODES  # the next node would have been one too many
    assert work.walked == 0


def test_hole7_a_huge_file_is_refused_without_being_read_whole(
    tmp_path: Path, allocated: Allocated
) -> None:
    path = tmp_path / SOURCE
    with path.open("wb") as file:
        file.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of NUL, no disk used
    with pytest.raises(PolicyError) as raised:
        load_policy(path)
    assert raised.value.lines() == [f"{path}: (top level): {TOO_LARGE}"]
    assert allocated.peak() < 4 * MAX_BYTES


# -- values Python cannot hold: an error with a line, not a crash ----------------------


CRASHES = {
    "recursive alias": (
        "rules: &r [*r]",
        "recursive alias (an alias inside the node it names)",
    ),
    "huge integer": (
        "x: " + "9" * 5000,
        f"invalid YAML: cannot read this value as !!int: "
        f"more than {sys.get_int_max_str_digits()} digits",
    ),
    "impossible date": (
        "x: 2024-02-30",
        "invalid YAML: cannot read this value as !!timestamp: day is out of range for month",
    ),
    "tagged bool": ("x: !!bool maybe", "invalid YAML: cannot read this value as !!bool"),
    "tagged timestamp": (
        "x: !!timestamp soon",
        "invalid YAML: cannot read this value as !!timestamp",
    ),
    "tagged empty int": ("x: !!int ''", "invalid YAML: cannot read this value as !!int"),
}


@pytest.mark.parametrize("case", CRASHES)
def test_hole7_a_value_python_cannot_hold_is_refused_with_its_line(case: str, work: Work) -> None:
    value, refused = CRASHES[case]
    assert refusal(f"version: 1\n{value}\n") == [f"{SOURCE}:2: (top level): {refused}"]


def test_a_list_as_a_key_is_refused_with_its_line() -> None:
    lines = refusal("version: 1\nrules: []\n? [a, b]\n: 1\n")
    assert lines == [f"{SOURCE}:3: (top level): invalid YAML: found unhashable key"]


# -- modest anchors still load -----------------------------------------------------------

SHARED = """\
version: 1
groups:
  staff: &staff [alice, bob]
  oncall: *staff
tools:
  "browser_*": &browser {label: browser, cost: 0.05}
  "web_*": *browser
rules:
  - &per-minute
    name: a
    match: &tools {tool: [terminal, deploy]}
    per: [user]
    rate: 10/minute
  - <<: *per-minute
    name: b
    rate: 100/hour
  - name: c
    match: *tools
    per: [user]
    budget: 5.00/day
overrides:
  - groups: [oncall]
    rule: a
    rate: 20/minute
"""


def test_modest_anchors_aliases_and_merge_keys_still_load(work: Work) -> None:
    policy = parse_policy(SHARED.encode(), source=SOURCE)
    assert [rule.name for rule in policy.rules] == ["a", "b", "c"]
    assert work.walked < 100
    # The merge key's overridden `name` and `rate` are not duplicate keys, and a line
    # of an error is still the line of its field.
    broken = SHARED.replace("rate: 100/hour", "rate: 100 per hour")
    assert refusal(broken) == [
        f"{SOURCE}:16: rules[1].rate: "
        'expected "N/window" (e.g. "10/minute", "5/10 minutes"), got \'100 per hour\' '
        "(rule 'b')"
    ]


# -- reload: a bomb leaves the policy in force -------------------------------------------


async def test_hole7_reload_of_a_bomb_keeps_the_old_policy(
    tmp_path: Path, work: Work, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / SOURCE
    path.write_text(POLICY_A)
    app = make_app(path)
    text, line = bomb()
    refused = f"{path}:{line}: (top level): {TOO_MANY_NODES}"
    async with serving(app) as client:
        write(path, text)
        answer = await client.post("/v1/admin/reload")
        assert answer.status_code == 422, answer.text
        body = answer.json()
        assert_error_shape(body)
        assert body["error"] == "invalid_policy"
        assert body["fields"] == [{"field": "(top level)", "message": refused}]
        assert await version_of(client) == VERSION_A
        check = await client.post("/v1/check", json={"user": "u", "tool": "gated"})
        assert policy_of("gated", check.json()) == ["A"]
        assert (reloads(app, "ok"), reloads(app, "error")) == (1, 1)
        logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(logged) == 1
        assert refused in logged[0]
    assert work.walked < 100  # the good file's walk; the bomb's never began


async def test_hole7_a_watching_daemon_refuses_a_bomb_and_keeps_serving(
    tmp_path: Path, work: Work, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / SOURCE
    path.write_text(POLICY_A)
    app = make_app(path, interval_s=0.05)
    text, line = bomb()
    async with serving(app) as client:
        write(path, text)
        await eventually(lambda: reloads(app, "error") == 1, "the watcher refuses the bomb")
        assert await version_of(client) == VERSION_A
        checks = await asyncio.gather(
            *(client.post("/v1/check", json={"user": f"u{i}", "tool": "t"}) for i in range(20))
        )
        assert all(policy_of("t", check.json()) == ["A"] for check in checks)
        logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(logged) == 1
        assert f"{path}:{line}: (top level): {TOO_MANY_NODES}" in logged[0]
    assert work.walked < 100


async def test_hole7_reload_of_a_huge_file_reads_no_more_than_the_limit(
    tmp_path: Path, allocated: Allocated
) -> None:
    path = tmp_path / SOURCE
    path.write_text(POLICY_A)
    app = make_app(path)
    async with serving(app) as client:
        allocated.mark()
        with path.open("wb") as file:
            file.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of NUL, no disk used
        answer = await client.post("/v1/admin/reload")
        assert answer.status_code == 422, answer.text
        assert answer.json()["fields"] == [
            {"field": "(top level)", "message": f"{path}: (top level): {TOO_LARGE}"}
        ]
        assert allocated.peak() < 4 * MAX_BYTES
        assert await version_of(client) == VERSION_A
