"""Issue 29 over HTTP: a check answer says `send_result` when a loop rule keyed on results
counts the call, the settle carries the `result_digest`, and a poll whose answer keeps
changing is never refused while the same answer is, with the loop's own sentence."""

from __future__ import annotations

import itertools
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
