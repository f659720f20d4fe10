"""Cursor's hook runner, reproduced from its agent runtime (`@cursor/sdk` 1.0.32,
dist/esm/34.js: executeHookForStep, executeCommandScript, executeCommandHook and the
generic tool executor), for a command hook to be tested the way Cursor runs it.

Cursor's agent cannot be driven offline: neither the IDE nor the `cursor-agent` CLI is
on the npm registry (the CLI installs by a script from cursor.com), and the one npm
package that holds its agent runtime, `@cursor/sdk`, gets its model turns from Cursor's
backend over Connect RPC, authenticated with a Cursor API key. So this module does what
that runtime does around one tool call, with its exact payloads:

- the payload: the tool's fields, the base request (`conversation_id`, `generation_id`,
  `model`), then `session_id`, `hook_event_name`, `cursor_version`, `workspace_roots`,
  `user_email` and `transcript_path`;
- the spawn: `<command> <<'CURSOR_HOOK_EOF'` with the JSON payload as a here-document,
  through bash, in the workspace, with CURSOR_PROJECT_DIR, CURSOR_VERSION,
  CURSOR_USER_EMAIL and CLAUDE_PROJECT_DIR set;
- the reading: exit 2 refuses (stdout, else stderr, as the message); any other
  non-zero exit or an empty stdout is a failed hook: no answer (the call runs), unless
  the hook is `failClosed`; otherwise stdout is JSON `{"permission", "user_message",
  "agent_message"}`, and what is not valid JSON refuses a permission step;
- the loop: a refused preToolUse fires postToolUseFailure (`failure_type:
  permission_denied`, duration 0) and the model reads `user_message`; an allowed call
  runs, then fires postToolUse with its `duration` in ms.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CURSOR_VERSION = "3.21.16"
EXIT_BLOCK = 2


@dataclass
class Answer:
    """What Cursor made of one hook run."""

    permission: str | None  # None: no answer (a failed hook, or one that allowed)
    user_message: str | None = None
    agent_message: str | None = None
    failed: str | None = None  # why the hook counts as failed


@dataclass
class Session:
    """One Cursor conversation in `workspace`, signed in as `email`, with `command` as
    its preToolUse, postToolUse and postToolUseFailure hook."""

    command: str
    workspace: Path
    email: str | None
    env: dict[str, str]
    fail_closed: bool = False
    conversation: str = field(default_factory=lambda: str(uuid.uuid4()))
    results: dict[str, str] = field(default_factory=dict)  # tool_use_id -> what the model read
    answers: list[Answer] = field(default_factory=list)  # every hook run, in order

    def payload(self, event: str, fields: dict[str, Any]) -> dict[str, Any]:
        base = {"conversation_id": self.conversation, "generation_id": str(uuid.uuid4())}
        return {
            **base,
            "model": "claude-4.5-sonnet",
            **fields,
            "session_id": self.conversation,
            "hook_event_name": event,
            "cursor_version": CURSOR_VERSION,
            "workspace_roots": [str(self.workspace)],
            "user_email": self.email,
            "transcript_path": None,
        }

    def run_hook(self, event: str, fields: dict[str, Any]) -> Answer:
        request = json.dumps(self.payload(event, fields))
        script = f"{self.command} <<'CURSOR_HOOK_EOF'\n{request}\nCURSOR_HOOK_EOF"
        env = {
            **self.env,
            "CURSOR_PROJECT_DIR": str(self.workspace),
            "CURSOR_VERSION": CURSOR_VERSION,
            "CLAUDE_PROJECT_DIR": str(self.workspace),
        }
        if self.email:
            env["CURSOR_USER_EMAIL"] = self.email
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=self.workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        answer = self.read(event, done.returncode, done.stdout, done.stderr)
        self.answers.append(answer)
        return answer

    def read(self, event: str, code: int, stdout: str, stderr: str) -> Answer:
        if code == EXIT_BLOCK:
            message = stdout.strip() or f"Hook blocked with message: {stderr.strip()}"
            return Answer("deny", message)
        if code != 0:
            return self._failed(f"exit {code}: {stderr.strip()}")
        if not stdout.strip():
            return self._failed("no output")
        try:
            data = json.loads(stdout)
        except ValueError:
            return Answer("deny", "Hook returned invalid JSON. The command was blocked for safety.")
        if not isinstance(data, dict) or data.get("permission") not in (
            None,
            "allow",
            "deny",
            "ask",
        ):
            return Answer("deny", "Hook returned an invalid response for this hook step.")
        return Answer(data.get("permission"), data.get("user_message"), data.get("agent_message"))

    def _failed(self, why: str) -> Answer:
        if self.fail_closed:
            return Answer("deny", f"Hook failed: {why}", failed=why)
        return Answer(None, failed=why)

    def shell(self, command: str) -> Answer:
        """The agent's Shell tool asked to run `command`: preToolUse, then the command and
        postToolUse, or postToolUseFailure when refused."""
        call = f"toolu_{uuid.uuid4().hex[:24]}"
        tool = {
            "tool_name": "Shell",
            "tool_input": {"command": command, "cwd": str(self.workspace)},
        }
        answer = self.run_hook(
            "preToolUse", {**tool, "tool_use_id": call, "cwd": str(self.workspace)}
        )
        if answer.permission in ("deny", "ask"):  # ask: no one to approve in this loop
            reason = answer.user_message or "Shell blocked by preToolUse hook"
            self.results[call] = reason
            failure = {"error_message": reason, "failure_type": "permission_denied", "duration": 0}
            self.run_hook(
                "postToolUseFailure",
                {**tool, **failure, "tool_use_id": call, "is_interrupt": False},
            )
            return answer
        started = time.perf_counter()
        done = subprocess.run(
            ["bash", "-c", command], cwd=self.workspace, capture_output=True, text=True, check=False
        )
        duration = round((time.perf_counter() - started) * 1000, 3)
        self.results[call] = done.stdout
        output = json.dumps({"exitCode": done.returncode, "stdout": done.stdout})
        self.run_hook(
            "postToolUse",
            {**tool, "tool_output": output, "duration": duration, "tool_use_id": call},
        )
        return answer
