"""Every host with a hook contract, by the name `ratewarden hook NAME` and the daemon's
`/v1/hooks/NAME` routes use."""

from __future__ import annotations

from ratewarden.hooks import agent_code, claude_code, codex, cursor, gemini, hermes
from ratewarden.hooks.contract import Host

HOSTS: dict[str, Host] = {
    host.name: host
    for host in (
        claude_code.HOST,
        agent_code.HOST,
        hermes.HOST,
        codex.HOST,
        gemini.HOST,
        cursor.HOST,
    )
}
# What `ratewarden hook --help` says of each.
SUMMARIES = {
    "claude-code": "Claude Code PreToolUse / PostToolUse command hook (JSON on stdin and stdout)",
    "agent-code": "agent-code pre_tool_use shell hook (veto: non-zero exit, reason on stderr)",
    "hermes": "hermes-agent shell hook (pre_tool_call / post_tool_call, JSON on stdin and stdout)",
    "codex": "Codex CLI PreToolUse / PostToolUse command hook (JSON on stdin and stdout)",
    "gemini": "Gemini CLI BeforeTool command hook (JSON on stdin and stdout)",
    "cursor": "Cursor preToolUse / postToolUse hook (JSON in and out; user from user_email)",
}
