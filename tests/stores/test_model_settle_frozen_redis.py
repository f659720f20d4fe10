"""A model call's settle while Redis is frozen (SIGSTOP, not a closed socket): the settle
is answered 503 within the store's deadline and changes nothing, and the same settle
after Redis thaws charges the usage once. Nothing is lost and nothing is charged twice."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from tests.helpers.daemon import running_daemon
from tests.helpers.redis_server import running_redis
from tests.unit.test_model_price_reload import PRICED

POLICY = PRICED.decode()  # house-model at 1.0 / 4.0 per million tokens, 10.00 a day
USAGE = {"usage": {"input_tokens": 1000, "output_tokens": 500}}  # 0.001 + 0.002


def test_a_settle_on_a_frozen_redis_is_refused_then_charged_once(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    with (
        running_redis(tmp_path / "redis") as redis,
        running_daemon(tmp_path, "--policy", "policy.yaml", "--store-url", redis.url) as daemon,
        httpx.Client(base_url=daemon.url, trust_env=False, timeout=10) as http,
    ):
        check = {"user": "u", "kind": "model", "model": "house-model", "input_tokens": 1000}
        call_id = http.post("/v1/check", json=check).json()["call_id"]
        redis.process.send_signal(signal.SIGSTOP)
        try:
            frozen = http.post(f"/v1/calls/{call_id}/settle", json=USAGE)
        finally:
            redis.process.send_signal(signal.SIGCONT)
        assert frozen.status_code == 503, frozen.text
        for _ in range(50):  # the breaker, if it opened, closes after its cooldown
            settled = http.post(f"/v1/calls/{call_id}/settle", json=USAGE)
            if settled.status_code != 503:
                break
            time.sleep(0.1)
        assert settled.json()["charged"] == {"model-spend": 0.003}
        again = http.post(f"/v1/calls/{call_id}/settle", json=USAGE).json()
        assert again["outcome"] == "already_settled"
        usage = http.get("/v1/usage", params={"user": "u"}).json()["limits"][0]
        assert (usage["used"], usage["reserved"]) == (0.003, 0)
