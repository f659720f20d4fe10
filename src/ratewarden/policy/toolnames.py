"""The policy's side of canonical tool names (docs/policy.md, "Canonical tool names"):
its own `same_as` lines, checked across entries and compiled before the built-in table
(wire/tools.py), and the warnings `policy check` gives of a rule that names a host's own
tool where the canonical name would cover every host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ratewarden.policy.errors import PolicyIssue
from ratewarden.policy.model import ToolNames, is_glob
from ratewarden.policy.schema import PolicySpec
from ratewarden.wire.tools import HostTool, hosts_naming

# How a warning names each host (the names of `ratewarden hook HOST` otherwise).
HOST_TITLES = {
    "claude-code": "Claude Code",
    "codex": "Codex",
    "agent-code": "agent-code",
    "gemini": "Gemini CLI",
    "cursor": "Cursor",
    "hermes": "hermes",
}

Path_ = tuple[str | int, ...]


def compile_names(spec: PolicySpec) -> tuple[ToolNames | None, list[PolicyIssue]]:
    """The file's `same_as` lines by (host or None, tool), or what is wrong with them.

    A line maps in one step, so that what a name stands for is read off one line: one
    whose `same_as` is another line's name (a chain, or a cycle) is refused, as is one
    naming itself, or a glob on either side (a line names one tool exactly)."""
    aliases = {name: e.same_as for name, e in spec.tools.items() if e.same_as is not None}
    lines: dict[tuple[str | None, str], HostTool] = {}
    issues = []
    for name, target in aliases.items():
        problem = _line_problem(name, target, aliases)
        if problem is not None:
            issues.append(PolicyIssue(("tools", name, "same_as"), problem))
            continue
        entry = spec.tools[name]
        line = HostTool(target, dict(entry.args or {}))
        hosts: list[str | None] = [*entry.host] if entry.host else [None]  # None: any
        for host in hosts:
            lines[(host, name)] = line
    return (ToolNames(lines) if lines else None), issues


def _line_problem(name: str, target: str, aliases: Mapping[str, str]) -> str | None:
    if name == "default" or is_glob(name):
        return f"a same_as line names one tool exactly, not {name!r}"
    if is_glob(target):
        return f"same_as names one tool exactly, not the glob {target!r}"
    if target == name:
        return f"{name!r} is the same as itself: name the tool its calls are checked as"
    if target in aliases:
        further = aliases[target]
        return (
            f"{target!r} is itself the same as {further!r} (tools.{target}): a line maps "
            f"in one step; write same_as: {further}"
        )
    return None


def name_warnings(spec: PolicySpec, line_of: Callable[[Path_], int | None]) -> list[PolicyIssue]:
    """A warning for each rule that names a host's own tool (`Bash`) without its
    canonical name (`terminal`): it matches only that host's calls. And for a `same_as`
    that names a host's own tool: its calls are counted apart from the canonical one's."""
    found = []
    for i, rule in enumerate(spec.rules):
        for part, match in (("match", rule.match), ("unless", rule.unless)):
            tools = match.tool if match is not None else None
            for name in dict.fromkeys(tools or ()):
                hosts = hosts_naming(name)
                if not hosts or set(hosts.values()) <= set(tools or ()):
                    continue  # no host's own name, or the canonical one is named too
                path: Path_ = ("rules", i, part, "tool")
                line = line_of(path)
                where = f"rule {rule.name!r}" + (f" (line {line})" if line else "")
                message = (
                    f"{where} names {name!r}, {_whose(hosts)}: it matches only those hosts' "
                    f"calls; name {_either(hosts.values())} to cover every host"
                )
                found.append(PolicyIssue(path, message, line))
    for name, entry in spec.tools.items():
        hosts = hosts_naming(entry.same_as) if entry.same_as else {}
        if hosts:
            path = ("tools", name, "same_as")
            message = (
                f"tools entry {name!r} is the same as {entry.same_as!r}, {_whose(hosts)}: "
                f"its calls are counted as {entry.same_as!r}, apart from every other "
                f"host's; write same_as: {' or '.join(dict.fromkeys(hosts.values()))}"
            )
            found.append(PolicyIssue(path, message, line_of(path)))
    return found


def _whose(hosts: Mapping[str, str]) -> str:
    """`Claude Code's, Codex's and agent-code's name for 'terminal'` (by canonical name)."""
    by_canonical: dict[str, list[str]] = {}
    for host, canonical in hosts.items():
        by_canonical.setdefault(canonical, []).append(f"{HOST_TITLES.get(host, host)}'s")
    return " and ".join(
        f"{_listed(owners)} name for {canonical!r}" for canonical, owners in by_canonical.items()
    )


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _either(canonicals: Iterable[str]) -> str:
    """`'terminal'`, or `'terminal' or 'shell'`."""
    return " or ".join(repr(name) for name in dict.fromkeys(canonicals))
