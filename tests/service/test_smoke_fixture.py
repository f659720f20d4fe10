from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import Store


async def test_fixture_store_decides(store: Store, clock: FakeClock) -> None:
    policy = parse_policy(b"version: 1\nrules:\n  - {name: r, rate: 1/minute}\n")
    engine = Engine(policy, store)
    first = await engine.check(Call(user="u", tool="t", call_id="1"))
    second = await engine.check(Call(user="u", tool="t", call_id="2"))
    assert (first.decision, second.decision) == ("allow", "deny")
