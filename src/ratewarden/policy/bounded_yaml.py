"""YAML for policy files, with the work it may take bounded by the file's size.

A few hundred bytes of nested anchors and aliases ("billion laughs") name a tree of
billions of nodes. PyYAML composes such a file cheaply, since an alias is the very node
its anchor names, but everything that walks the result (the line index, the schema, the
compiler) walks it expanded. So `BoundedLoader` counts while composing, before anything
is expanded or constructed: each alias counts as a copy of the node it names, and a
document over a limit is refused at the line where it crossed it. This module is the
home of the limits; docs/policy.md lists them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

MAX_BYTES = 256 * 1024  # a policy of thousands of users and rules is a few tens of KiB
MAX_ALIASES = 100  # a shared mapping reused a few times needs a handful
MAX_NODES = 20_000  # every key, value and collection, an alias counted as a copy
MAX_DEPTH = 64  # a policy nests about six levels; PyYAML composes by recursion


class LimitError(yaml.MarkedYAMLError):
    """A document over one of the limits, found while composing it."""


def read_bounded(path: Path) -> bytes:
    """The file's content, but never more than one byte over MAX_BYTES (a huge file, or
    /dev/zero, is not read whole only to be refused)."""
    with path.open("rb") as file:
        return file.read(MAX_BYTES + 1)


def size_problem(raw: bytes) -> str | None:
    if len(raw) <= MAX_BYTES:
        return None
    return f"file too large: more than {MAX_BYTES} bytes (limit {MAX_BYTES // 1024} KiB)"


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses, while composing, a document over MAX_ALIASES aliases,
    MAX_NODES nodes or MAX_DEPTH levels, the last two counted with aliases expanded."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0
        self.nodes = 0  # nodes composed so far, each alias counted as a copy of its node
        self._depth = 0
        # Each finished node's (nodes, levels) once expanded; an alias to a node not in
        # here yet is an alias inside its own anchor: a cycle.
        self._sizes: dict[yaml.Node, tuple[int, int]] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        self._depth += 1
        try:
            if isinstance(event, yaml.AliasEvent):
                return self._compose_alias(parent, index, event)
            self._count(1, self._depth, event.start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is not None:
            self._sizes[node] = _measure(node, self._sizes)
        return node

    def _compose_alias(self, parent: yaml.Node | None, index: Any, event: Any) -> yaml.Node | None:
        mark = event.start_mark
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            raise LimitError(problem=f"too many aliases (limit {MAX_ALIASES})", problem_mark=mark)
        node = super().compose_node(parent, index)  # an unknown anchor raises here
        if node is None or node not in self._sizes:
            raise LimitError(
                problem="recursive alias (an alias inside the node it names)", problem_mark=mark
            )
        nodes, levels = self._sizes[node]
        self._count(nodes, self._depth + levels - 1, mark)
        return node

    def _count(self, nodes: int, depth: int, mark: Any) -> None:
        self.nodes += nodes
        if depth > MAX_DEPTH:
            problem = f"nested too deeply (limit {MAX_DEPTH} levels, aliases expanded)"
            raise LimitError(problem=problem, problem_mark=mark)
        if self.nodes > MAX_NODES:
            problem = f"too many nodes (limit {MAX_NODES}, each alias counted as a copy)"
            raise LimitError(problem=problem, problem_mark=mark)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # PyYAML builds some scalars with calls that raise plain Python errors: an integer
        # of 5000 digits, the date 2024-02-30, `!!bool maybe`. Make them YAML errors that
        # point at the value.
        try:
            return super().construct_object(node, deep)
        except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError) as exc:
            problem = _value_problem(node, exc)
            raise ConstructorError(problem=problem, problem_mark=node.start_mark) from None


def _measure(node: yaml.Node, sizes: dict[yaml.Node, tuple[int, int]]) -> tuple[int, int]:
    """(nodes, levels) of a finished node once expanded, from its children's."""
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    measured = [sizes[child] for child in children]
    return 1 + sum(n for n, _ in measured), 1 + max((d for _, d in measured), default=0)


def _value_problem(node: yaml.Node, exc: Exception) -> str:
    tag = node.tag.replace("tag:yaml.org,2002:", "!!")
    if not isinstance(exc, ValueError):
        return f"cannot read this value as {tag}"
    if "integer string conversion" in str(exc):
        return f"cannot read this value as {tag}: more than {sys.get_int_max_str_digits()} digits"
    return f"cannot read this value as {tag}: {exc}"
