"""Shared fixtures: a fake clock, a real redis-server, and one store of each kind; and
the markers, applied by what a test uses, so `-m "not host"` and the like select by need.

The folders follow the architecture: unit (pure logic), conformance (the stores held to
the same answers), stores (Redis, Sentinel, Cluster, durability, outages), service (the
HTTP daemon, its CLI and client), hosts (the real host frameworks and CLIs, each in its
own environment under .hosts/), deploy (deployment and observability files, the
benchmark's smoke run). Shared helpers live in tests/helpers/.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import fakeredis
import pytest
import redis.asyncio as aioredis

from ratewarden.clock import FakeClock
from ratewarden.store import MemoryStore, Store
from ratewarden.store.redis_store import RedisStore
from tests.helpers.fakeredis_time import follow
from tests.helpers.redis_server import RedisServer, running_redis

STORE_KINDS = ["memory", "fakeredis", "redis"]
TESTS = Path(__file__).parent

# A marker for every test that needs one of these, by the fixtures it uses.
_BY_FIXTURE = {
    "redis_server": "redis",
    "redis_url": "redis",
    "cluster": "cluster",
    "sentinel": "sentinel",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        needed = {marker for name, marker in _BY_FIXTURE.items() if name in fixtures}
        if "redis" in params.values() and fixtures & {"make_store", "store"}:
            needed.add("redis")  # the real-Redis instance of a store-parametrised test
        folders = Path(str(item.path)).parents
        if TESTS / "hosts" in folders:
            needed.add("host")
        if TESTS / "browser" in folders:
            needed.add("browser")  # also for a module that forgets its pytestmark
        if "cluster" in needed or "sentinel" in needed:
            needed.add("redis")
        for marker in needed:
            item.add_marker(marker)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Host environments build side by side, from the start, when host tests will run."""
    if session.config.option.collectonly:
        return
    modules = {Path(str(item.path)) for item in session.items if item.get_closest_marker("host")}
    if modules:
        from tests.helpers.hostenv import environments_named_in, prebuild

        prebuild(environments_named_in(modules))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the whole run, on a free port; tests flush it, not reuse it."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture
def clock() -> FakeClock:
    # Mid-minute, so clock-aligned windows do not start exactly at the first call.
    return FakeClock(1_700_000_000_000 + 17_345)


StoreFactory = Callable[[FakeClock], Store]


@pytest.fixture(params=STORE_KINDS)
async def make_store(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[StoreFactory]:
    """Build stores of one kind on a given clock; every test using it runs on all three."""
    kind: str = request.param
    made: list[Store] = []
    server = fakeredis.FakeServer() if kind == "fakeredis" else None
    url = request.getfixturevalue("redis_url") if kind == "redis" else ""

    def factory(clock: FakeClock) -> Store:
        store: Store
        if kind == "memory":
            store = MemoryStore(clock)
        elif kind == "fakeredis":
            follow(monkeypatch, clock)  # its keys expire by the scripts' clock
            store = RedisStore(fakeredis.FakeAsyncRedis(server=server), "fakeredis", clock)
        else:
            store = RedisStore(aioredis.Redis.from_url(url), url, clock)
        made.append(store)
        return store

    yield factory
    for store in made:
        await store.close()


@pytest.fixture
async def store(make_store: StoreFactory, clock: FakeClock) -> Store:
    made = make_store(clock)
    await made.start()
    return made


@pytest.fixture
def tmp_policy(tmp_path: Path) -> Callable[[str], Path]:
    def write(text: str) -> Path:
        path = tmp_path / "policy.yaml"
        path.write_text(text)
        return path

    return write
