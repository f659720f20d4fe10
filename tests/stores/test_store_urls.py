"""Every store URL scheme reaches a real server: redis://, rediss:// (TLS), unix://."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, StoreURLError, redact, store_from_url
from ratewarden.store.keys import all_keys_pattern, record_key
from tests.helpers.redis_server import RedisServer, free_port, running_redis

pytestmark = pytest.mark.redis

POLICY = parse_policy(b"version: 1\nrules:\n  - {name: two, rate: 2/minute}\n")


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, int, Path]]:
    """A redis-server with a TLS port (self-signed certificate) and a unix socket."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    tls_port = free_port()
    extra = (
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
        "--unixsocket", str(directory / "redis.sock"),
    )  # fmt: skip
    with running_redis(directory / "data", *extra) as server:
        yield server, tls_port, directory


async def decide_three_times(url: str) -> list[str]:
    store = store_from_url(url, timeout_ms=2_000)
    await store.start()
    try:
        engine = Engine(POLICY, store)
        return [(await engine.check(Call("u", "t", str(i)))).decision for i in range(3)]
    finally:
        await store.close()


async def test_rediss_uses_tls(tls_redis: tuple[RedisServer, int, Path]) -> None:
    server, port, directory = tls_redis
    server.client().flushall()
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={directory / 'cert.pem'}"
    assert await decide_three_times(url) == ["allow", "allow", "deny"]
    # The TLS port really is TLS: a client that does not speak it is refused.
    plain = store_from_url(f"redis://127.0.0.1:{port}/0", timeout_ms=500)
    with pytest.raises(Exception, match=r"(?i)connection|timeout|closed|reset"):
        await plain.start()
    await plain.close()


async def test_unix_socket(tls_redis: tuple[RedisServer, int, Path]) -> None:
    server, _, directory = tls_redis
    server.client().flushall()
    assert await decide_three_times(f"unix://{directory / 'redis.sock'}") == [
        "allow",
        "allow",
        "deny",
    ]
    client = server.client()
    assert client.keys(all_keys_pattern()) == [b"rw:{two|user=u}:sw"]
    # The two allowed calls are recorded; the refused third one is not.
    assert sorted(client.keys("rw:call:*")) == [record_key("0").encode(), record_key("1").encode()]
    assert len(client.keys("*")) == 3
    client.close()


def test_memory_url_builds_the_embedded_store() -> None:
    assert isinstance(store_from_url("memory://"), MemoryStore)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://localhost:6379", "unsupported store URL"),
        ("localhost:6379", "unsupported store URL"),
        # Sentinel and Cluster URLs that cannot work (tests/stores/test_store_sentinel.py and
        # tests/stores/test_store_cluster.py run the ones that do).
        ("redis+sentinel://a:1", "name the master's service"),
        ("redis+sentinel://a:1/mymaster/x", "bad database number"),
        ("redis+sentinel://a:1/mymaster?nope=1", "unknown options nope"),
        ("redis+cluster://a:x", "bad port 'x'"),
        ("redis+cluster://a:1/2", "only database 0"),
        ("redis+cluster://::1:7000", r"IPv6 hosts need brackets"),
        ("redis+cluster://", "empty host"),
    ],
)
def test_unusable_urls_are_refused_with_what_would_work(url: str, problem: str) -> None:
    with pytest.raises(StoreURLError, match=problem) as caught:
        store_from_url(url)
    if "unsupported" in problem:
        assert "memory://" in str(caught.value)
        assert "redis://" in str(caught.value)
        assert "redis+sentinel://" in str(caught.value)
    elif url.startswith("redis+sentinel"):
        assert "expected redis+sentinel://[:PASSWORD@]HOST:PORT" in str(caught.value)
    else:
        assert "expected redis+cluster://[:PASSWORD@]HOST:PORT" in str(caught.value)


def test_passwords_never_reach_the_description() -> None:
    assert redact("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redact("rediss://me:s3cret@host/1") == "rediss://me:***@host/1"
    assert redact("redis://host:6379/0") == "redis://host:6379/0"
    assert "s3cret" not in store_from_url("redis://:s3cret@host:6379/0").description
