"""One tool, one name: each host's own names for the tools every coding agent has, and
the one canonical name (and argument shape) a policy speaks of them in.

The shell is `terminal` to hermes, `Bash` to Claude Code, `run_shell_command` to Gemini
CLI and `Shell` to Cursor; a policy that names `terminal` covers them all, and a user's
shell calls from every host land on one counter. The daemon maps a call whose host it
knows (a hook's `/v1/hooks/HOST` routes, or a check's `host`): the check then names the
canonical tool, and `host_tool` keeps the host's own name, which a rule may still match.
An MCP tool is `server.tool`, the gateway's name for it, on every host that names its
server. A tool no table knows keeps its name.

Arguments are reshaped the same way: the shell's command is one string in `command`, a
file tool's path in `path`, a fetch's address in `url`, a search's pattern in `query`.
A renamed argument moves to its canonical key (replacing a value sent under that key,
which the host does not read); every other argument the host sent stays as it was
(docs/integrations.md lists each host's renames). A shell
command sent as an argv array becomes the one line the shell reads.

Standard library only, and data more than code: the table is read once at import, and a
call's mapping is a dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "CANONICAL_TOOLS", "HOST_TOOLS", "Canonical", "HostTool", "as_known", "canonical",
    "hosts_naming",
    "mcp_tool", "renamed_args", "shell_command",
]  # fmt: skip

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


_PATH = {"file_path": "path"}
_SEARCH = {"pattern": "query"}
_NONE: Mapping[str, str] = {}


def _row(canonical: str, args: Mapping[str, str] = _NONE) -> HostTool:
    return HostTool(canonical, args)


# host (as `ratewarden hook HOST` names it) -> its tool name -> what it is. Each row is
# read from the host's installed package (docs/integrations.md, "One name per tool",
# names the version and the file); tests/hosts/test_tool_table_sources.py greps them out.
HOST_TOOLS: Mapping[str, Mapping[str, HostTool]] = {
    # claude-agent-sdk 0.2.188's bundled CLI, Claude Code 2.1.331 (_bundled/claude).
    "claude-code": {
        "Bash": _row("terminal"),  # {command, description, timeout, run_in_background}
        "PowerShell": _row("terminal"),  # {command, ...}
        "Read": _row("read_file", _PATH),  # {file_path, offset, limit, pages}
        "Write": _row("write_file", _PATH),  # {file_path, content}
        "Edit": _row("edit_file", _PATH),  # {file_path, old_string, new_string, replace_all}
        "NotebookEdit": _row("edit_file", {"notebook_path": "path"}),
        "Glob": _row("search_files", _SEARCH),  # {pattern, path}
        "Grep": _row("search_files", _SEARCH),  # {pattern, path, glob, output_mode, ...}
        "WebFetch": _row("web_fetch"),  # {url, prompt}
        "WebSearch": _row("web_search"),  # {query, allowed_domains, blocked_domains}
        "Agent": _row("delegate_task"),  # {description, prompt, subagent_type, ...}
        "Task": _row("delegate_task"),  # Agent's former name, still its alias
    },
    # @google/gemini-cli 0.61.0 (bundle/chunk-*.js: *_TOOL_NAME, *_PARAM_*).
    "gemini": {
        "run_shell_command": _row("terminal"),  # {command, description, is_background}
        "read_file": _row("read_file", _PATH),  # {file_path, start_line, end_line}
        "read_many_files": _row("read_file"),  # {include, exclude, recursive, ...}
        "write_file": _row("write_file", _PATH),  # {file_path, content}
        "replace": _row("edit_file", _PATH),  # {file_path, old_string, new_string, ...}
        "glob": _row("search_files", {"pattern": "query", "dir_path": "path"}),
        "grep_search": _row("search_files", {"pattern": "query", "dir_path": "path"}),
        "web_fetch": _row("web_fetch"),  # {prompt}: the URLs are in the prompt
        "google_web_search": _row("web_search"),  # {query}
        "invoke_agent": _row("delegate_task"),
    },
    # Cursor's agent runtime as @cursor/sdk 1.0.32 ships it (dist/esm/34.js: each tool's
    # preToolUse `toolName` and `createToolInput`, and its Claude Code matcher map).
    "cursor": {
        "Shell": _row("terminal"),  # {command, cwd}
        "Read": _row("read_file", _PATH),  # {file_path}
        "Write": _row("write_file", _PATH),  # {file_path, content}: edits too
        "Delete": _row("delete_file", _PATH),  # {file_path}
        "Grep": _row("search_files", {"pattern": "query", "file_path": "path"}),
        "Fetch": _row("web_fetch"),  # {url}
        "WebFetch": _row("web_fetch"),
        "WebSearch": _row("web_search"),
        "Task": _row("delegate_task"),
    },
    # @openai/codex 0.169.0 (the hook-facing names of vendor/<target>/bin/codex): every
    # shell tool (exec_command, shell, local_shell, shell_command) is `Bash` to a hook.
    "codex": {
        "Bash": _row("terminal"),  # {command} (one string: Codex shlex-joins an argv)
        "apply_patch": _row("edit_file", {"command": "patch"}),  # {command: the patch}
        "spawn_agent": _row("delegate_task"),
    },
    # avala-ai/agent-code 0.30.0 (crates/lib/src/tools/*.rs: each tool's name() and
    # input_schema()).
    "agent-code": {
        "Bash": _row("terminal"),  # {command, timeout, run_in_background}
        "PowerShell": _row("terminal"),  # {command, timeout}
        "FileRead": _row("read_file", _PATH),  # {file_path, offset, limit, pages}
        "FileWrite": _row("write_file", _PATH),  # {file_path, content}
        "FileEdit": _row("edit_file", _PATH),  # {file_path, old_string, new_string, ...}
        "MultiEdit": _row("edit_file", _PATH),  # {file_path, edits}
        "NotebookEdit": _row("edit_file", _PATH),  # {file_path, edit}
        "ApplyPatch": _row("edit_file"),  # {patch}
        "Glob": _row("search_files", _SEARCH),  # {pattern, path}
        "Grep": _row("search_files", _SEARCH),  # {pattern, path, glob, ...}
        "WebFetch": _row("web_fetch"),  # {url}
        "WebSearch": _row("web_search"),  # {query}
        "Agent": _row("delegate_task"),  # {description, prompt, subagent_type, ...}
    },
    # hermes-agent 0.19.0 (tools/*.py: registry.register(name=...) and each schema): its
    # names are the canonical ones, but for three.
    "hermes": {
        "terminal": _row("terminal"),  # {command, background, timeout, workdir, ...}
        "read_file": _row("read_file"),  # {path, offset, limit}
        "write_file": _row("write_file"),  # {path, content}
        "patch": _row("edit_file"),  # {mode, path, old_string, new_string, patch}
        "search_files": _row("search_files", _SEARCH),  # {pattern, target, path, ...}
        "web_extract": _row("web_fetch"),  # {urls}: a list, kept as it is
        "web_search": _row("web_search"),  # {query}
        "delegate_task": _row("delegate_task"),  # {goal, context, tasks, ...}
    },
}

# The shells a host may wrap a command in (`bash -lc 'X'`), and their one-letter flags.
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "fish"})
# MCP tools: `mcp__server__tool` (Claude Code, Codex, agent-code, hermes); Gemini CLI's
# `mcp_server_tool`, its server name ending at the first `_` (its own parseMcpToolName).
_MCP_DOUBLE = frozenset({"claude-code", "codex", "agent-code", "hermes"})
_MCP_SINGLE = frozenset({"gemini"})


class Canonical(NamedTuple):
    """A call as a policy sees it: the canonical tool, its reshaped arguments, and the
    host's own tool name when that differs (else None). `moved` says where each sent
    argument the reshaping touched now stands: its new key, or None where its value no
    longer stands as sent (a decoy replaced, a command joined); a client's cut paths
    follow it (service/convert.py)."""

    tool: str
    args: Any
    host_tool: str | None = None
    moved: Mapping[str, str | None] = {}  # a default never mutated


def canonical(host: str | None, tool: str, args: Any = None) -> Canonical:
    """`tool` (and its `args`, when a JSON object) as `host` calls it, in canonical terms;
    unchanged when the host or the tool is not in the table."""
    known = HOST_TOOLS.get(host or "", {}).get(tool)
    if known is None:
        mcp = mcp_tool(host, tool)
        return Canonical(tool, args) if mcp is None else Canonical(mcp, args, tool)
    return as_known(known, tool, args)


def as_known(known: HostTool, tool: str, args: Any) -> Canonical:
    """The call of `tool` that a table row (the built-in one or a policy's `same_as`
    line) says is `known`: its canonical name, and its args renamed and shaped."""
    moved: dict[str, str | None] = {}
    if isinstance(args, Mapping):
        if known.args:
            for theirs, ours in known.args.items():
                if theirs in args:
                    moved[theirs] = ours
                    if ours in args:
                        moved[ours] = None  # a decoy the host's own value replaces
            args = renamed_args(args, known.args)
        if known.canonical == "terminal":
            shaped = _one_command(args)
            if shaped is not args:  # the command now one line: not the value sent
                moved.update({k: None for k, to in moved.items() if to == "command"})
                moved.setdefault("command", None)
            args = shaped
    host_tool = tool if tool != known.canonical else None
    return Canonical(known.canonical, args, host_tool, moved)


def mcp_tool(host: str | None, tool: str) -> str | None:
    """An MCP tool's gateway name, `server.tool`, from the name `host` gives it (None for
    a tool that is not one). Cursor's `MCP:tool` names no server: it keeps its name."""
    if host in _MCP_DOUBLE and tool.startswith("mcp__"):
        server, _, name = tool[5:].partition("__")
    elif host in _MCP_SINGLE and tool.startswith("mcp_"):
        server, _, name = tool[4:].partition("_")
    else:
        return None
    return f"{server}.{name}" if server and name else None


def hosts_naming(tool: str) -> dict[str, str]:
    """The hosts whose own name `tool` is, each with the canonical name it stands for
    (`policy check` warns of a rule that names a host's tool)."""
    found = {
        host: known.canonical
        for host, tools in HOST_TOOLS.items()
        if (known := tools.get(tool)) is not None and known.canonical != tool
    }
    for host in (*_MCP_DOUBLE, *_MCP_SINGLE):
        if (mcp := mcp_tool(host, tool)) is not None:
            found[host] = mcp
    return found


def renamed_args(args: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """`args` with each renamed key (theirs -> ours) moved to its canonical key.

    The host's own key is what the host reads: its value takes the canonical key even
    when the call also sent that key (Claude Code's Read reads `file_path`, not a `path`
    beside it). Kept instead, such a decoy would be all a rule on `path` read, while the
    host opened the other file."""
    out = dict(args)
    for theirs, ours in renames.items():
        if theirs in out:
            out[ours] = out.pop(theirs)
    return out


def _one_command(args: Mapping[str, Any]) -> Mapping[str, Any]:
    """The shell's `command` as one string, as the shell reads it: an argv array (all
    strings) becomes `X` when it is `bash -lc X` (any shell, its flags ending in `c`), else
    its shlex.join; anything else is left as it is (no argv a host would run)."""
    argv = args.get("command")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return args
    return {**args, "command": shell_command(argv)}


def shell_command(argv: list[str]) -> str:
    """`argv` as one command line: the script of `sh -c SCRIPT` (`bash -lc`, `zsh -c`, a
    shell by its path too), else the words quoted as a POSIX shell reads them."""
    if len(argv) == 3 and _is_shell(argv[0]) and _is_script_flag(argv[1]):
        return argv[2]
    import shlex  # only for an argv array, which few hosts send

    return shlex.join(argv)


def _is_shell(word: str) -> bool:
    return word.rpartition("/")[2] in _SHELLS


def _is_script_flag(word: str) -> bool:
    """`-c`, `-lc`, `-ic`, `-lic`...: one-letter options, the last `c` (its script next)."""
    return len(word) >= 2 and word[0] == "-" and word.endswith("c") and word[1:].isalpha()
