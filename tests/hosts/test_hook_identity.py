"""`ratewarden hook HOST` with a user token: no `--user` needed, and no other user possible.

Real processes, as hosts spawn them, against a real `ratewarden serve` given a user tokens
file (RATEWARDEN_USER_TOKENS) and a service token. The hook holds alice's token and no
user: the daemon counts her calls, whatever RATEWARDEN_USER says, and a hook configured
with `--user bob` is refused in the host's own deny form (even failing open: it is a
decision, not an outage). With the service token, the old defaults still apply.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.hosts.scenario import Daemon, clean_environment, serving
from tests.hosts.test_hooks import claude_post, claude_pre, hook

ALICE = "alice-hook-token-0123456789"
SERVICE = "svc-hook-token-0123456789"
ADMIN = "adm-hook-token-0123456789"
POLICY = """\
version: 1
rules:
  - name: bash-per-minute
    match: {tool: Bash}
    per: [user]
    rate: 50/minute
  - name: bash-one-at-a-time
    match: {tool: Bash}
    per: [user]
    concurrency: 1
  - name: model-per-minute
    match: {model: gemini-2.5-pro}
    per: [user]
    rate: 50/minute
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    directory = tmp_path_factory.mktemp("hook-identity")
    (directory / "policy.yaml").write_text(POLICY)
    (directory / "users.yaml").write_text(f"alice: {ALICE}\n")
    env = clean_environment(
        RATEWARDEN_USER_TOKENS=str(directory / "users.yaml"),
        RATEWARDEN_API_TOKENS=SERVICE,
        RATEWARDEN_ADMIN_TOKENS=ADMIN,
        RATEWARDEN_POLICY=str(directory / "policy.yaml"),
        RATEWARDEN_STATE_FILE="off",
    )
    with serving(directory, env=env) as served:
        yield served


def used(daemon: Daemon, user: str) -> float:
    answer = httpx.get(
        f"{daemon.url}/v1/usage",
        params={"user": user},
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=5,
    )
    [rate] = [item for item in answer.json()["limits"] if item["rule"] == "bash-per-minute"]
    return float(rate["used"])


def as_alice(daemon: Daemon, **env: str) -> dict[str, str]:
    return {"RATEWARDEN_URL": daemon.url, "RATEWARDEN_TOKEN": ALICE, **env}


def decision(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    if not done.stdout.strip():
        return "allow"
    found: str = json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"]
    return found


def test_a_hook_with_a_user_token_and_no_user_acts_as_the_tokens_user(daemon: Daemon) -> None:
    before = used(daemon, "alice")
    call = f"toolu_{uuid.uuid4().hex[:12]}"
    # No --user, and a stray RATEWARDEN_USER that the token overrides.
    pre = hook("claude-code", claude_pre("Bash", call), env=as_alice(daemon, RATEWARDEN_USER="bob"))
    assert decision(pre) == "allow"
    assert "ratewarden" not in pre.stderr  # no failing open: the daemon answered
    assert used(daemon, "alice") == before + 1
    assert used(daemon, "bob") == 0
    # The call holds alice's one slot until her hook reports it finished.
    second = hook("claude-code", claude_pre("Bash", f"{call}-2"), env=as_alice(daemon))
    assert decision(second) == "deny"
    hook("claude-code", claude_post("Bash", call), env=as_alice(daemon))
    third = hook("claude-code", claude_pre("Bash", f"{call}-3"), env=as_alice(daemon))
    assert decision(third) == "allow"
    hook("claude-code", claude_post("Bash", f"{call}-3"), env=as_alice(daemon))


def test_a_hook_naming_another_user_is_refused_even_failing_open(daemon: Daemon) -> None:
    call = f"toolu_{uuid.uuid4().hex[:12]}"
    done = hook(
        "claude-code", claude_pre("Bash", call), "--user", "bob", "--fail", "open",
        env=as_alice(daemon),
    )  # fmt: skip
    assert decision(done) == "deny"
    reason = json.loads(done.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    assert "user" in reason
    assert ALICE not in done.stdout + done.stderr
    assert used(daemon, "bob") == 0


def test_a_hook_with_a_service_token_still_falls_back_to_the_configured_user(
    daemon: Daemon,
) -> None:
    user = f"svc-user-{uuid.uuid4().hex[:8]}"
    env = {"RATEWARDEN_URL": daemon.url, "RATEWARDEN_TOKEN": SERVICE, "RATEWARDEN_USER": user}
    call = f"toolu_{uuid.uuid4().hex[:12]}"
    assert decision(hook("claude-code", claude_pre("Bash", call), env=env)) == "allow"
    assert used(daemon, user) == 1
    hook("claude-code", claude_post("Bash", call), env=env)


def model_calls(daemon: Daemon, user: str) -> float:
    answer = httpx.get(
        f"{daemon.url}/v1/usage",
        params={"user": user},
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=5,
    )
    found = [item for item in answer.json()["limits"] if item["rule"] == "model-per-minute"]
    return float(found[0]["used"]) if found else 0.0


def test_a_model_call_hook_names_its_user_as_a_tool_call_hook_does(daemon: Daemon) -> None:
    """Gemini CLI's BeforeModel posts /v1/check itself: alice's token is alice whatever
    RATEWARDEN_USER says, `--user bob` is refused, a service token takes RATEWARDEN_USER."""
    request = {"model": "gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}
    payload = {"hook_event_name": "BeforeModel", "session_id": "s", "llm_request": request}
    before = model_calls(daemon, "alice")
    done = hook("gemini", payload, env=as_alice(daemon, RATEWARDEN_USER="bob"))
    assert (done.returncode, done.stdout) == (0, "")  # allowed
    assert model_calls(daemon, "alice") == before + 1
    assert model_calls(daemon, "bob") == 0
    refused = hook("gemini", payload, "--user", "bob", env=as_alice(daemon))
    assert json.loads(refused.stdout)["decision"] == "deny"
    assert model_calls(daemon, "bob") == 0
    user = f"svc-user-{uuid.uuid4().hex[:8]}"
    env = {"RATEWARDEN_URL": daemon.url, "RATEWARDEN_TOKEN": SERVICE, "RATEWARDEN_USER": user}
    assert hook("gemini", payload, env=env).stdout == ""
    assert model_calls(daemon, user) == 1
