"""Issue 29 over HTTP: a check answer says `send_result` when a loop rule keyed on results
counts the call, the settle carries the `result_digest`, and a poll whose answer keeps
changing is never refused while the same answer is, with the loop's own sentence."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.arguments import result_digest
from ratewarden.clock import FakeClock
from tests.helpers.app import build_app, serving

POLICY = """\
version: 1
rules:
  - name: ci-loop
    match: {tool: ci_status}
    per: [user, tool, args]
    rate: 3/10 minutes
    same_result: true
  - {name: calls, rate: 100/minute}
"""
LOOP = (
    "Repeated call: ci_status returned the same result 3 times in a row; change the "
    "arguments or the approach"
)
_ids = itertools.count()


async def poll(client: httpx.AsyncClient, answer: str | None) -> dict[str, Any]:
    call_id = f"p{next(_ids)}"
    body = {"user": "u", "tool": "ci_status", "call_id": call_id, "args": {"run": 7}}
    response = await client.post("/v1/check", json=body)
    assert response.status_code == 200, response.text
    decided: dict[str, Any] = response.json()
    assert decided["send_result"] is (decided["decision"] == "allow")
    if decided["decision"] == "allow":
        settle = {} if answer is None else {"result_digest": result_digest({"state": answer})}
        settled = await client.post(f"/v1/calls/{call_id}/settle", json=settle)
        assert settled.status_code == 200, settled.text
        assert settled.json() == {"call_id": call_id, "outcome": "settled", "charged": {}}
    return decided


@pytest.mark.parametrize("hot", [True, False], ids=["hot-path", "fastapi"])
async def test_a_changing_answer_is_polled_freely_and_a_repeated_one_refused(hot: bool) -> None:
    async with serving(build_app(POLICY, clock=FakeClock(), hot=hot)) as client:
        for answer in ["queued", "queued", "running", "running"] * 3:
            assert (await poll(client, answer))["decision"] == "allow"
        for _ in range(3):
            assert (await poll(client, "passed"))["decision"] == "allow"
        refused = await poll(client, "passed")
        assert (refused["decision"], refused["message"]) == ("deny", LOOP)
        assert refused["retry_after"] is not None
        # Another tool under the plain rule only: nothing to send.
        other = await client.post("/v1/check", json={"user": "u", "tool": "terminal"})
        assert other.json()["send_result"] is False


async def test_a_settle_refuses_a_malformed_result_digest() -> None:
    async with serving(build_app(POLICY, clock=FakeClock())) as client:
        response = await client.post("/v1/calls/any/settle", json={"result_digest": "xyz"})
        assert response.status_code == 422


SHARED = """\
version: 1
rules:
  - name: ci-loop
    match: {tool: ci_status}
    per: [tool, args]
    rate: 3/10 minutes
    same_result: true
"""


async def test_only_a_calls_own_user_restarts_a_count_and_a_shared_one_restarts_for_all(
    tmp_path: Path,
) -> None:
    """Who may settle a call is who may restart a count with its result: bob's token
    settling alice's call (or a hook event naming it) is a 404 and restarts nothing. A
    counter several users share (no `user` in `per`) is restarted by the settle of any
    of their own calls, as docs/policy.md says."""
    tokens = tmp_path / "users.yaml"
    tokens.write_text("alice: alice-token-0123456789\nbob: bob-token-0123456789\n")
    alice = {"authorization": "Bearer alice-token-0123456789"}
    bob = {"authorization": "Bearer bob-token-0123456789"}
    same, new = result_digest({"state": "running"}), result_digest({"state": "passed"})
    app = build_app(SHARED, clock=FakeClock(), user_tokens=tokens, reload_interval_s=0)
    async with serving(app) as client:

        async def check(call_id: str, token: dict[str, str]) -> str:
            body = {"tool": "ci_status", "call_id": call_id, "args": {"run": 7}}
            answer = await client.post("/v1/check", json=body, headers=token)
            decision: str = answer.json()["decision"]
            return decision

        assert [await check(f"a{i}", alice) for i in range(3)] == ["allow"] * 3
        for i in range(2):
            await client.post(f"/v1/calls/a{i}/settle", json={"result_digest": same}, headers=alice)
        foreign = await client.post("/v1/calls/a2/settle", json={"result_digest": new}, headers=bob)
        assert foreign.status_code == 404
        hook = {"finished": True, "call_id": "a2", "result_digest": new}
        await client.post("/v1/hooks/claude-code/decision", json=hook, headers=bob)
        assert await check("a3", alice) == "deny"  # nothing restarted
        assert await check("b0", bob) == "deny"  # the count is shared
        # alice's own settle with a new result restarts the shared count, bob's too
        mine = await client.post("/v1/calls/a2/settle", json={"result_digest": new}, headers=alice)
        assert mine.json()["outcome"] == "settled"
        assert await check("b1", bob) == "allow"
