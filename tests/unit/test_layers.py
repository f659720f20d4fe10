"""The layers import downwards only: one row per rule, each a forbidden edge.

Each row is checked twice: in a fresh interpreter that imports every module of the layer
(what another test imported cannot hide an edge there), and on the source's import
statements, the lazy ones inside functions included (an edge a module takes only when a
function runs). docs/architecture.md draws the same table.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

import ratewarden

PACKAGE = Path(ratewarden.__file__).parent
WORDS = ("errors", "vocabulary", "clock", "calls", "arguments")


class Rule(NamedTuple):
    layer: str  # a package under ratewarden, or "words"
    forbidden: tuple[str, ...]  # packages (and root modules) it must not import
    allowed: tuple[str, ...] = ()  # exceptions inside `forbidden`, by full module name


EVERYTHING = ("wire", "http", "service", "cli", "client", "integrations", "hooks", "mcp",
              "engine", "policy", "store", "limiter")  # fmt: skip
RULES = [
    Rule("words", EVERYTHING),
    Rule("wire", tuple(p for p in EVERYTHING if p != "wire")),
    Rule("http", tuple(p for p in EVERYTHING if p != "http")),
    # The command hook's start-up promise: the standard library, the words and its exchange.
    Rule(
        "hooks",
        tuple(p for p in EVERYTHING if p != "hooks"),
        ("ratewarden.http", "ratewarden.http.exchange", "ratewarden.http.head"),
    ),
    Rule("integrations", ("service", "cli")),
    Rule("mcp", ("service", "cli")),
    Rule("limiter", ("policy", "engine")),
    Rule("store", ("policy", "engine")),
    Rule("service", ("integrations", "mcp", "cli")),
]


def modules_of(layer: str) -> list[str]:
    """Every module of a layer (the words: their five modules)."""
    if layer == "words":
        return [f"ratewarden.{word}" for word in WORDS]
    root = PACKAGE / layer
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def breaks(rule: Rule, module: str) -> bool:
    """Whether importing `module` from the rule's layer crosses one of its forbidden edges."""
    if module in rule.allowed or not module.startswith("ratewarden."):
        return False
    top = module.split(".")[1]
    return top in rule.forbidden


def loaded_in_fresh_interpreter(modules: list[str]) -> tuple[set[str], list[str]]:
    """The ratewarden modules loaded by importing `modules`, and those that could not be
    imported here for want of a third-party package (the `mcp` extra, a host framework)."""
    probe = (
        "import importlib, json, sys\n"
        f"skipped = []\nfor name in {modules!r}:\n"
        "    try:\n        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        if (exc.name or '').startswith('ratewarden'): raise\n"
        "        skipped.append(name)\n"
        "print(json.dumps([sorted(m for m in sys.modules if m.startswith('ratewarden')), skipped]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    loaded, skipped = json.loads(done.stdout)
    return set(loaded), skipped


def imported_in_source(module: str) -> set[str]:
    """Every ratewarden module named by an import statement of `module`'s source."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    named = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named.add(node.module)
            named |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in named if name.startswith("ratewarden")}


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.layer)
def test_a_layer_loads_nothing_it_must_not(rule: Rule) -> None:
    modules = modules_of(rule.layer)
    loaded, skipped = loaded_in_fresh_interpreter(modules)
    assert set(modules) - set(skipped) <= loaded  # the probe did import them
    # The package's own modules load the lazy `ratewarden` root, which imports nothing.
    assert sorted(m for m in loaded if breaks(rule, m)) == []


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.layer)
def test_a_layer_names_nothing_it_must_not(rule: Rule) -> None:
    crossed = {
        f"{module} -> {name}"
        for module in modules_of(rule.layer)
        for name in imported_in_source(module)
        if breaks(rule, name)
    }
    assert sorted(crossed) == []


def test_the_rules_can_fail() -> None:
    """A probe that could not see an edge would pass every row: the service, checked
    against the rule of the words, must be caught by both checks."""
    words = RULES[0]
    loaded, _ = loaded_in_fresh_interpreter(["ratewarden.service.app"])
    assert any(breaks(words, m) for m in loaded)
    assert any(breaks(words, name) for name in imported_in_source("ratewarden.service.app"))


def test_the_store_and_the_limiter_do_not_load_yaml() -> None:
    loaded, _ = loaded_in_fresh_interpreter(["ratewarden.store", "ratewarden.store.cluster"])
    assert {m for m in loaded if m.startswith("ratewarden.policy")} == set()
    probe = (
        "import sys, ratewarden.store, ratewarden.limiter.reference; print('yaml' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
