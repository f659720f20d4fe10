"""Throwaway Redis Cluster and Sentinel deployments for tests, on loopback and free ports.

- `running_cluster`: three masters (`--cluster-enabled yes`, no replicas) joined by
  `redis-cli --cluster create`, ready once every node says `cluster_state:ok`.
- `running_sentinel`: a master, one replica and two sentinels (`redis-server --sentinel`,
  the same binary Debian's redis-sentinel package links to) watching it as `mymaster`.

Every process is started through tests/helpers/redis_server.py (free port, own directory, no
persistence) and stopped in the context manager's `finally`, whatever happens.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import redis

from tests.helpers.redis_server import RedisServer, ensure_redis_server, free_port, start_redis

SERVICE = "mymaster"
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 20.0) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            found = probe()
        except (redis.RedisError, OSError) as exc:
            found, last = None, exc
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def redis_cli() -> str:
    binary = Path(ensure_redis_server()).with_name("redis-cli")
    return str(binary) if binary.exists() else "redis-cli"


# ------------------------------------------------------------------------------ cluster


@dataclass
class RedisClusterServers:
    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        """Two of the three nodes as startup nodes: the client discovers the third."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def clients(self) -> list[redis.Redis]:
        return [node.client() for node in self.nodes]

    def flush(self) -> None:
        for client in self.clients():
            client.flushall()
            client.close()

    def node_for_slot(self, slot: int) -> int:
        """The index (in `nodes`) of the master that owns `slot`."""
        client = self.nodes[0].client()
        try:
            for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):  # type: ignore[no-untyped-call]
                if start <= slot <= end:
                    port = int(primary[1])
                    return next(i for i, n in enumerate(self.nodes) if n.port == port)
        finally:
            client.close()
        raise AssertionError(f"no node owns slot {slot}")

    def keys(self, pattern: str = "*") -> dict[str, int]:
        """Every key matching `pattern` on any node -> the index of the node holding it."""
        found: dict[str, int] = {}
        for i, client in enumerate(self.clients()):
            for key in client.scan_iter(match=pattern):
                found[key.decode()] = i
            client.close()
        return found


def _cluster_ok(nodes: list[RedisServer]) -> bool:
    for node in nodes:
        client = node.client()
        try:
            info = client.cluster("INFO")
        finally:
            client.close()
        if info.get("cluster_state") != "ok" or int(info["cluster_known_nodes"]) != len(nodes):
            return False
    return True


@contextlib.contextmanager
def running_cluster(directory: Path, masters: int = 3) -> Iterator[RedisClusterServers]:
    nodes: list[RedisServer] = []
    try:
        for i in range(masters):
            home = directory / f"node{i}"
            extra = (
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(home / "nodes.conf"),
                # An explicit bus port: the default (port + 10000) may be taken or > 65535.
                "--cluster-port", str(free_port()),
                "--cluster-node-timeout", "2000",
            )  # fmt: skip
            nodes.append(start_redis(home, *extra))
        subprocess.run(
            [
                redis_cli(), "--cluster", "create",
                *(f"127.0.0.1:{n.port}" for n in nodes),
                "--cluster-replicas", "0", "--cluster-yes",
            ],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        wait_for("cluster_state:ok on every node", lambda: _cluster_ok(nodes))
        yield RedisClusterServers(nodes)
    finally:
        for node in nodes:
            node.stop()


# ----------------------------------------------------------------------------- sentinel


@dataclass
class SentinelDeployment:
    master: RedisServer
    replica: RedisServer
    sentinels: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def data_nodes(self) -> list[RedisServer]:
        return [self.master, self.replica]

    def master_port(self) -> int:
        """Where the first answering sentinel says the master is."""
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                address = client.sentinel_get_master_addr_by_name(SERVICE)
                assert isinstance(address, tuple)  # redis-py's type allows a bool or None
                return int(address[1])
            except (redis.RedisError, OSError):
                continue
            finally:
                client.close()
        raise AssertionError("no sentinel answers")

    def current_master(self) -> RedisServer:
        port = self.master_port()
        return next(n for n in self.data_nodes() if n.port == port)

    def flush(self) -> None:
        master = self.current_master()
        client = master.client()
        client.flushall()
        client.execute_command("WAIT", 1, 2000)  # type: ignore[no-untyped-call]  # the replica has it too
        client.close()

    def failover(self) -> RedisServer:
        """`SENTINEL FAILOVER`, then wait until the replica is master and the old master
        has been turned into its replica. Returns the new master."""
        old = self.current_master()
        new = self.replica if old is self.master else self.master
        client = self.sentinels[0].client()
        try:
            client.execute_command("SENTINEL", "FAILOVER", SERVICE)  # type: ignore[no-untyped-call]
        finally:
            client.close()
        wait_for("the sentinels to name the new master", lambda: self.master_port() == new.port)
        wait_for("the new master to take writes", lambda: role(new) == "master")
        wait_for("the old master to follow the new one", lambda: following(old, new))
        return new


def role(server: RedisServer) -> str:
    client = server.client()
    try:
        return str(client.info("replication")["role"])
    finally:
        client.close()


def following(replica: RedisServer, master: RedisServer) -> bool:
    client = replica.client()
    try:
        info = client.info("replication")
    finally:
        client.close()
    return (
        info.get("role") == "slave"
        and int(info.get("master_port", 0)) == master.port
        and info.get("master_link_status") == "up"
    )


def _knows_replica(sentinel: RedisServer, replica: RedisServer) -> bool:
    client = sentinel.client()
    try:
        replicas = client.sentinel_slaves(SERVICE)
    finally:
        client.close()
    return any(
        int(r["port"]) == replica.port
        and r["is_slave"]
        and not (r["is_disconnected"] or r["is_sdown"] or r["is_odown"])
        and r["master-link-status"] == "ok"
        for r in replicas
    )


def start_sentinel(directory: Path, master: RedisServer) -> RedisServer:
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = directory / "sentinel.conf"  # sentinel rewrites it: it must be its own
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        "sentinel resolve-hostnames no\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 5000\n"
        f"sentinel parallel-syncs {SERVICE} 1\n"
    )
    process = subprocess.Popen(
        [ensure_redis_server(), str(config), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(port, process, directory)
    try:
        wait_for(
            f"sentinel on port {port}", lambda: process.poll() is None and server.client().ping()
        )
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running_sentinel(directory: Path, sentinels: int = 2) -> Iterator[SentinelDeployment]:
    started: list[RedisServer] = []
    try:
        # No delay before a diskless full sync (the default waits 5 s for more replicas).
        master = start_redis(directory / "master", "--repl-diskless-sync-delay", "0")
        started.append(master)
        replica = start_redis(
            directory / "replica",
            *("--replicaof", "127.0.0.1", str(master.port), "--repl-diskless-sync-delay", "0"),
        )
        started.append(replica)
        wait_for("the replica to sync", lambda: following(replica, master))
        deployment = SentinelDeployment(master, replica)
        for i in range(sentinels):
            sentinel = start_sentinel(directory / f"sentinel{i}", master)
            started.append(sentinel)
            deployment.sentinels.append(sentinel)
        for sentinel in deployment.sentinels:  # a failover needs a replica to promote
            wait_for(
                "the sentinels to see the replica",
                functools.partial(_knows_replica, sentinel, replica),
            )
        yield deployment
    finally:
        for server in reversed(started):
            server.stop()


# -------------------------------------------------------------- the store-based suites

STORE_SUITES = (
    "tests.conformance.test_all_or_nothing",
    "tests.conformance.test_settle_and_idempotency",
    "tests.conformance.test_budgets",
    "tests.conformance.test_budget_periods",
    "tests.conformance.test_concurrency_caps",
    "tests.conformance.test_loop_results",
    "tests.conformance.test_spend_records",
    "tests.stores.test_activity_log",
    "tests.conformance.test_budget_sweep",
)


def store_tests(suffix: str) -> dict[str, object]:
    """The tests of STORE_SUITES that take the `store` fixture, renamed `<name>_<suffix>`.

    A test module that binds them (`globals().update(store_tests("cluster"))`) and defines
    its own `store` fixture runs them on its store: pytest resolves fixtures in the module
    that collects a test, and the parametrize marks travel with the functions.
    """
    import importlib
    import inspect

    found: dict[str, object] = {}
    for name in STORE_SUITES:
        module = importlib.import_module(name)
        short = name.rsplit(".", 1)[1].removeprefix("test_")
        for attr, test in vars(module).items():
            if (
                attr.startswith("test_")
                and inspect.isfunction(test)
                and "store" in inspect.signature(test).parameters
            ):
                found[f"{attr}__{short}_on_{suffix}"] = test
    return found
