"""Read a policy file: YAML with line numbers, then schema checks, then compilation.

The YAML is composed once into nodes carrying line marks, within the limits of
`bounded_yaml` (size, aliases, nodes, depth), so that every error, from the schema or
from compilation, can point at the line it is about; the data is constructed from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ratewarden.policy.bounded_yaml import BoundedLoader, LimitError, read_bounded, size_problem
from ratewarden.policy.compile import compile_policy
from ratewarden.policy.errors import PolicyError, PolicyIssue
from ratewarden.policy.model import Policy
from ratewarden.policy.notifications import notification_warnings
from ratewarden.policy.references import reference_issues
from ratewarden.policy.schema import OverrideSpec, PolicySpec
from ratewarden.policy.toolnames import name_warnings

Path_ = tuple[str | int, ...]

EXAMPLE_POLICY = "example.yaml"


def load_policy(path: str | Path) -> Policy:
    """Load and validate the policy at `path`; raise PolicyError naming every problem."""
    path = Path(path)
    try:
        raw = read_bounded(path)
    except OSError as exc:
        raise PolicyError(str(path), [PolicyIssue((), f"cannot read: {exc.strerror}")]) from None
    return parse_policy(raw, source=str(path))


def load_example_policy(runtime: Sequence[tuple[str, OverrideSpec]] = ()) -> Policy:
    """The policy shipped inside the package, used when no policy file is given."""
    raw = resources.files("ratewarden.policy").joinpath(EXAMPLE_POLICY).read_bytes()
    return parse_policy(raw, source=f"<packaged {EXAMPLE_POLICY}>", runtime=runtime)


def parse_policy(
    raw: bytes, source: str = "<policy>", runtime: Sequence[tuple[str, OverrideSpec]] = ()
) -> Policy:
    """The policy in `raw`, with the runtime overrides (id, override) that fit it."""
    too_large = size_problem(raw)
    if too_large:
        raise PolicyError(source, [PolicyIssue((), too_large)])
    lines: dict[Path_, int] = {}
    issues: list[PolicyIssue] = []
    try:
        data = _read_yaml(raw.decode("utf-8", errors="replace"), lines, issues)
    except yaml.YAMLError as exc:
        raise PolicyError(source, [_yaml_issue(exc)]) from None
    if not isinstance(data, dict):
        issues.append(PolicyIssue((), "expected a mapping with version: 1 and rules", 1))
        raise PolicyError(source, issues)
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as exc:
        issues += [_issue_from_pydantic(error) for error in exc.errors()]
    issues += reference_issues(data)
    if issues:
        raise PolicyError(source, _named(_with_lines(issues, lines), data))
    policy, problems = compile_policy(spec, source, raw, runtime)
    if policy is None:
        raise PolicyError(source, _named(_with_lines(problems, lines), data))
    line_of = lambda path: _line_of(path, lines)  # noqa: E731
    policy.warnings = (*name_warnings(spec, line_of), *notification_warnings(spec, line_of))
    return policy


def _read_yaml(text: str, lines: dict[Path_, int], issues: list[PolicyIssue]) -> Any:
    """The document's data; its lines and duplicate keys go to `lines` and `issues`."""
    loader = BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        # Index first: constructing applies merge keys (<<) to the nodes in place.
        _index_lines(root, (), lines, issues)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _index_lines(
    node: yaml.Node, path: Path_, lines: dict[Path_, int], issues: list[PolicyIssue]
) -> None:
    """Record the line of every field path, and report duplicate keys (YAML keeps the last)."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue  # a list or mapping as a key: construction refuses it
            name = key.value
            if name in seen:
                issues.append(PolicyIssue((*path, name), "duplicate key", key.start_mark.line + 1))
            seen.add(name)
            _index_lines(value, (*path, name), lines, issues)
            lines[(*path, name)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*path, i), lines, issues)


def _issue_from_pydantic(error: Any) -> PolicyIssue:
    # Pydantic adds union branches and validator names to the location; keep the field path.
    path = tuple(p for p in error["loc"] if isinstance(p, int) or not _is_type_tag(p))
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    elif error["type"] == "missing":
        message = "required field is missing"
    if "input" in error and error["type"] not in ("missing", "extra_forbidden", "value_error"):
        message += f", got {error['input']!r}"
    return PolicyIssue(path, message)


def _is_type_tag(part: str) -> bool:
    return (
        part in ("str", "list[str]", "int", "float", "bool")
        or "[" in part
        or part.startswith("function-")
    )


def _with_lines(issues: list[PolicyIssue], lines: dict[Path_, int]) -> list[PolicyIssue]:
    """Attach the nearest known line: the field itself, else its closest parent."""
    located = [
        PolicyIssue(issue.path, issue.message, issue.line or _line_of(issue.path, lines))
        for issue in issues
    ]
    return sorted(located, key=lambda issue: issue.line or 0)  # in file order


def _line_of(path: Path_, lines: dict[Path_, int]) -> int | None:
    """The line of the field at `path`, else of its closest parent that has one."""
    while path and path not in lines:
        path = path[:-1]
    return lines.get(path)


def _named(issues: list[PolicyIssue], data: dict[str, Any]) -> list[PolicyIssue]:
    """Each issue inside a rule also names the rule (`rules[3]` alone sends a reader
    counting), when the rule has a name that is text."""
    rules = data.get("rules")
    named = []
    for issue in issues:
        name = _rule_name(rules, issue.path)
        if name is None or f"{name!r}" in issue.message:
            named.append(issue)
        else:
            named.append(PolicyIssue(issue.path, f"{issue.message} (rule {name!r})", issue.line))
    return named


def _rule_name(rules: Any, path: tuple[str | int, ...]) -> str | None:
    """The name of the rule `path` is inside, if it has one that is text."""
    if len(path) < 2 or path[0] != "rules" or not isinstance(rules, list):
        return None
    index = path[1]
    if not isinstance(index, int) or not 0 <= index < len(rules):
        return None
    rule = rules[index]
    name = rule.get("name") if isinstance(rule, dict) else None
    return name if isinstance(name, str) and name else None


def _yaml_issue(exc: yaml.YAMLError) -> PolicyIssue:
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = _yaml_problem(exc)
    return PolicyIssue(
        (), problem if isinstance(exc, LimitError) else f"invalid YAML: {problem}", line
    )


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    return str(problem) if problem else str(exc).splitlines()[0]
