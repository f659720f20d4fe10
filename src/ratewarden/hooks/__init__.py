"""Hooks: the hosts that ask ratewarden about a tool call in their own hook contract.

A host runs a program around each tool call (a command hook: stdin in, exit status and
stdout or stderr out) or posts the same payload to a URL (an HTTP hook). Both reach one
implementation of that host's contract:

- `contract.py`: what every host contract is made of (the events read from a payload,
  what a hook answers, a host's description) and the readers' shared helpers;
- one module per host (`claude_code`, `agent_code`, `hermes`, `codex`, `gemini`,
  `cursor`): how it writes its payload and how it reads an answer; `hosts.HOSTS` lists
  them;
- `command.py`: `ratewarden hook HOST`, a process per tool call. It reads the payload,
  posts it to the daemon's `/v1/hooks/HOST/decision` and prints the answer in the host's
  terms; when the daemon cannot answer, its fail mode answers. It imports the standard
  library and this package only, so it starts in a few milliseconds (no pydantic, httpx,
  FastAPI or redis; tests/unit/test_hook_imports.py holds it to that);
- the daemon's side, `ratewarden.service.hooks`: the routes `/v1/hooks/HOST` (a host's
  own HTTP hook, answered in its own terms) and `/v1/hooks/HOST/decision` (the command
  hook's), where names are made acceptable, the call is checked or settled, and a reused
  call id is checked as a new call.

Nothing here imports anything at package import.
"""
