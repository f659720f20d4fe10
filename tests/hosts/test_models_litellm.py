"""The LiteLLM proxy shares one budget with the agents' tools (issue 31, items 5 and 6).

The real proxy (`litellm --config config.yaml`, litellm[proxy] in its host venv) routes
`gpt-4o` to a scripted OpenAI-compatible provider on 127.0.0.1
(tests/hosts/drivers/openai_chat.py) that reports tests/hosts/model_budget.py's `USAGE`
for every answer, with `ratewarden.integrations.litellm`'s callback in its
`litellm_settings.callbacks`. The real OpenAI client (tests/hosts/drivers/
litellm_client.py) calls the proxy with a key per user; the keys are authenticated by a
`custom_auth` (tests/hosts/drivers/litellm_hook.py) since LiteLLM's virtual keys need a
database (the proxy refuses to start without a master key: it has one nobody uses). One
`ratewarden serve` holds model_budget's policy: 1.00 USD a day per user, over tool calls
and model calls.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.redis_server import free_port
from tests.hosts import model_budget
from tests.hosts.drivers.openai_chat import FakeProvider, fake_openai_api
from tests.hosts.model_budget import BUDGET, SINGLE_CALL, USAGE, price_micros, spent_micros
from tests.hosts.scenario import (
    DRIVERS,
    Daemon,
    clean_environment,
    host_python,
    read_usage,
    run_driver,
    running_daemon,
    started,
)
from tests.hosts.test_one_budget_across_surfaces import midday_timezone

# The first run builds the host venv (litellm[proxy], about 740 MB, two minutes); the
# proxy takes 10 to 20 seconds to start.
pytestmark = pytest.mark.timeout(900)

CONFIG = """\
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o
      api_base: {api_base}
      api_key: fake-provider-key
  - model_name: house-model  # the application's name for the same deployment
    litellm_params:
      model: openai/gpt-4o
      api_base: {api_base}
      api_key: fake-provider-key
litellm_settings:
  callbacks: ratewarden_hook.handler
general_settings:
  master_key: {master_key}
  custom_auth: ratewarden_hook.user_api_key_auth
"""
SMALL = 100  # max_tokens of the calls that drain the day: a reservation of a cent or less
LARGE = 8000  # max_tokens of the call whose maximum cost is more than what is left


@dataclass
class Proxy:
    url: str  # the proxy's OpenAI base URL (.../v1)
    provider: FakeProvider
    daemon: Daemon
    python: Path

    def call(self, *calls: dict[str, Any]) -> list[dict[str, Any]]:
        """What the OpenAI client got for each of `calls`, made one after the other."""
        report = run_driver(
            self.python, DRIVERS / "litellm_client.py", {"url": self.url, "calls": list(calls)}
        )
        answers: list[dict[str, Any]] = report["answers"]
        return answers


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    python = host_python("litellm")
    work = tmp_path_factory.mktemp("litellm")
    policy = model_budget.POLICY.format(timezone=midday_timezone(datetime.now(UTC)))
    with (
        running_daemon(policy, work / "daemon") as daemon,
        fake_openai_api(USAGE) as (api_base, provider),
    ):
        master_key = f"sk-{secrets.token_hex(24)}"
        (work / "config.yaml").write_text(CONFIG.format(api_base=api_base, master_key=master_key))
        shutil.copy(DRIVERS / "litellm_hook.py", work / "ratewarden_hook.py")
        port = free_port()
        env = clean_environment(
            RATEWARDEN_URL=daemon.url,
            LITELLM_LOCAL_MODEL_COST_MAP="True",  # no fetch of LiteLLM's price list
            LITELLM_LOG="ERROR",
        )
        command = [
            str(python.parent / "litellm"),
            "--config", str(work / "config.yaml"),
            "--host", "127.0.0.1",
            "--port", str(port),
        ]  # fmt: skip
        ready = f"http://127.0.0.1:{port}/health/liveliness"
        with started(command, env, ready, work / "proxy.log"):
            yield Proxy(f"http://127.0.0.1:{port}/v1", provider, daemon, python)


def check_tool(daemon: Daemon, user: str) -> dict[str, Any]:
    """A tool call of `user` checked against the daemon, as an agent's hook asks."""
    answer = httpx.post(
        f"{daemon.url}/v1/check", json={"user": user, "tool": "terminal"}, trust_env=False
    )
    body: dict[str, Any] = answer.raise_for_status().json()
    if body["allowed"]:  # settle it: the tool "ran" and cost its price
        httpx.post(
            f"{daemon.url}/v1/calls/{body['call_id']}/settle",
            json={"status": "ok"},
            trust_env=False,
        ).raise_for_status()
    return body


def reserved_micros(daemon: Daemon, user: str) -> int:
    held = read_usage(daemon.url, user).get(model_budget.RULE, {}).get("reserved", 0)
    return round(float(held) * 1_000_000)


def settled(daemon: Daemon, user: str, micros: int, timeout: float = 20) -> int:
    """`user`'s spend once it reached `micros` with nothing held: LiteLLM sends its
    success events after answering the client, so the settle may come a moment later."""
    deadline = time.monotonic() + timeout
    while True:
        spent, held = spent_micros(daemon, user), reserved_micros(daemon, user)
        if (spent >= micros and held == 0) or time.monotonic() > deadline:
            return spent
        time.sleep(0.1)


def small(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "max_tokens": SMALL, **extra}


def test_model_calls_drain_the_day_then_refuse_with_our_sentences(proxy: Proxy) -> None:
    price = price_micros()
    assert price == 95_822  # 0.09582125 USD, rounded up
    calls = 1_000_000 // price  # 10 calls spend 0.958 of the 1.00
    answers = proxy.call(*[small("sk-alice") for _ in range(calls)])
    assert all(answer["ok"] for answer in answers), answers
    # The client saw the provider's usage, and the daemon charged exactly its price.
    assert answers[0]["usage"]["prompt_tokens"] == USAGE["input_tokens"]
    assert settled(proxy.daemon, "alice", calls * price) == calls * price
    assert reserved_micros(proxy.daemon, "alice") == 0
    reached = len(proxy.provider.requests)

    # 0.042 is left: a call that could cost 0.08 (8000 output tokens) is refused, with the
    # single-call sentence as the error the OpenAI client raises, and never reaches the
    # provider.
    [refused] = proxy.call({"key": "sk-alice", "max_tokens": LARGE})
    assert not refused["ok"]
    assert refused["status"] == 429, refused
    assert refused["class"] == "RateLimitError", refused
    assert SINGLE_CALL.match(refused["message"]), refused["message"]
    assert len(proxy.provider.requests) == reached
    assert spent_micros(proxy.daemon, "alice") == calls * price

    # alice's agent asks for its terminal tool: the same budget refuses it.
    tool = check_tool(proxy.daemon, "alice")
    assert not tool["allowed"]
    assert BUDGET.match(tool["message"]), tool["message"]

    # bob is untouched: nothing spent, his tool call and his model call allowed.
    assert spent_micros(proxy.daemon, "bob") == 0
    assert check_tool(proxy.daemon, "bob")["allowed"]
    [answer] = proxy.call(small("sk-bob"))
    assert answer["ok"], answer
    assert settled(proxy.daemon, "bob", 50_000 + price) == 50_000 + price  # tool + model


def test_a_provider_failure_is_settled_with_no_charge(proxy: Proxy) -> None:
    proxy.provider.fail = True
    try:
        [failed] = proxy.call(small("sk-erin"))
    finally:
        proxy.provider.fail = False
    assert not failed["ok"]
    assert failed["status"] == 500, failed
    # The reservation was released and nothing charged (the router retried twice first).
    deadline = time.monotonic() + 20
    while reserved_micros(proxy.daemon, "erin") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reserved_micros(proxy.daemon, "erin") == 0
    assert spent_micros(proxy.daemon, "erin") == 0
    # erin's next call goes through and is charged its usage alone.
    [answer] = proxy.call(small("sk-erin"))
    assert answer["ok"], answer
    assert settled(proxy.daemon, "erin", price_micros()) == price_micros()


def test_a_failure_the_router_retried_is_charged_once(proxy: Proxy) -> None:
    proxy.provider.fail_next = 1  # the first attempt fails, the router's retry answers
    [answer] = proxy.call(small("sk-frank"))
    assert answer["ok"], answer
    assert proxy.provider.fail_next == 0
    assert settled(proxy.daemon, "frank", price_micros()) == price_micros()


def test_a_streamed_answer_is_charged_its_usage(proxy: Proxy) -> None:
    [answer] = proxy.call(small("sk-gwen", stream=True))
    assert answer["ok"], answer
    assert answer["usage"]["completion_tokens"] == USAGE["output_tokens"]
    assert settled(proxy.daemon, "gwen", price_micros()) == price_micros()
    # A client that does not ask for the stream's usage is charged it all the same:
    # LiteLLM asks the provider for it (the fake sends it only when asked).
    [answer] = proxy.call(small("sk-gwen", stream=True, include_usage=False))
    assert answer["ok"], answer
    assert proxy.provider.requests[-1]["stream_options"] == {"include_usage": True}
    assert settled(proxy.daemon, "gwen", 2 * price_micros()) == 2 * price_micros()


def test_the_user_is_the_key_not_the_body_claim(proxy: Proxy) -> None:
    price = price_micros()
    # judy's key claims to be henry: ignored, judy's key is no service of end users.
    assert proxy.call(small("sk-judy", user="henry"))[0]["ok"]
    assert settled(proxy.daemon, "judy", price) == price
    assert spent_micros(proxy.daemon, "henry") == 0
    # The support service's key names its end user, which it authenticated: charged to ivy.
    assert proxy.call(small("sk-support", user="ivy"))[0]["ok"]
    assert settled(proxy.daemon, "ivy", price) == price
    assert spent_micros(proxy.daemon, "support-bot") == 0
    # A key with no user is known by its alias.
    assert proxy.call(small("sk-ops"))[0]["ok"]
    assert settled(proxy.daemon, "ops-dashboard", price) == price
    # A key the proxy does not know never reaches the hook, nor the provider.
    [unknown] = proxy.call(small("sk-nobody"))
    assert not unknown["ok"]
    assert unknown["status"] == 401, unknown


def test_a_model_alias_is_priced_as_the_model_it_routes_to(proxy: Proxy) -> None:
    # "house-model" is the proxy's name for openai/gpt-4o: checked and priced as gpt-4o
    # (the policy prices no "house-model": the daemon would refuse the call unpriced).
    [answer] = proxy.call(small("sk-kim", model="house-model"))
    assert answer["ok"], answer
    assert settled(proxy.daemon, "kim", price_micros()) == price_micros()
