"""One tool, one name: each host's own names for the tools every coding agent has, and
the one canonical name (and argument shape) a policy speaks of them in.

The shell is `terminal` to hermes, `Bash` to Claude Code, `run_shell_command` to Gemini
CLI and `Shell` to Cursor; a policy that names `terminal` covers them all, and a user's
shell calls from every host land on one counter. The daemon maps a call whose host it
knows (a hook's `/v1/hooks/HOST` routes, or a check's `metadata.host`): the check then
names the canonical tool, and `metadata.host_tool` keeps the host's own name, which a
rule may still match. A tool no table knows keeps its name.

Arguments are reshaped the same way: the shell's command is one string in `command`, a
file tool's path in `path`, a fetch's address in `url`, a search's pattern in `query`.
A renamed argument moves to its canonical key; every other argument the host sent stays
as it was, so nothing is lost (docs/integrations.md lists each host's renames).

Standard library only, and data more than code: the table is read once at import, and a
call's mapping is a dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["CANONICAL_TOOLS", "HOST_TOOLS", "Canonical", "canonical", "hosts_naming"]

# The tools every host has, by their canonical names (docs/policy.md, "Canonical tools").
CANONICAL_TOOLS = frozenset(
    {
        "terminal",  # a shell command
        "read_file",
        "write_file",
        "edit_file",  # a patch or a replace
        "delete_file",
        "search_files",  # glob, grep
        "web_fetch",
        "web_search",
        "delegate_task",  # a sub-agent
    }
)


class HostTool(NamedTuple):
    """A host's own tool: its canonical name and its arguments' renames (host -> ours)."""

    canonical: str
    args: Mapping[str, str] = {}  # a default never mutated


# host (as `ratewarden hook HOST` names it) -> its tool name -> what it is.
# PROVISIONAL: each row is to be read from the host's installed package.
HOST_TOOLS: Mapping[str, Mapping[str, HostTool]] = {
    "claude-code": {
        "Bash": HostTool("terminal"),
        "Read": HostTool("read_file", {"file_path": "path"}),
        "Write": HostTool("write_file", {"file_path": "path"}),
        "Edit": HostTool("edit_file", {"file_path": "path"}),
    },
    "gemini": {
        "run_shell_command": HostTool("terminal"),
    },
    "cursor": {
        "Shell": HostTool("terminal"),
    },
    "codex": {
        "Bash": HostTool("terminal"),
    },
    "agent-code": {
        "Bash": HostTool("terminal"),
    },
    "hermes": {
        "terminal": HostTool("terminal"),
    },
}


class Canonical(NamedTuple):
    """A call as a policy sees it: the canonical tool, its reshaped arguments, and the
    host's own tool name when that differs (else None)."""

    tool: str
    args: Any
    host_tool: str | None = None


def canonical(host: str | None, tool: str, args: Any = None) -> Canonical:
    """`tool` (and its `args`, when a JSON object) as `host` calls it, in canonical terms;
    unchanged when the host or the tool is not in the table."""
    known = HOST_TOOLS.get(host or "", {}).get(tool)
    if known is None:
        return Canonical(tool, args)
    if known.args and isinstance(args, Mapping):
        args = _renamed(args, known.args)
    return Canonical(known.canonical, args, tool if tool != known.canonical else None)


def hosts_naming(tool: str) -> dict[str, str]:
    """The hosts whose own name `tool` is, each with the canonical name it stands for
    (`policy check` warns of a rule that names a host's tool)."""
    return {
        host: known.canonical
        for host, tools in HOST_TOOLS.items()
        if (known := tools.get(tool)) is not None and known.canonical != tool
    }


def _renamed(args: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """`args` with each renamed key moved to its canonical key; a canonical key the host
    also sent keeps the host's value for it (nothing is overwritten or dropped)."""
    out = dict(args)
    for theirs, ours in renames.items():
        if theirs in out and ours not in out:
            out[ours] = out.pop(theirs)
    return out
