"""The Envoy services are an optional extra (docs/envoy.md): a daemon without the gRPC
port loads none of grpcio or the stubs, and one asked for the port without them is
refused at start, saying what to install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import clean_environment

pytestmark = pytest.mark.slow  # a process started per check

# Runs `ratewarden` with the stubs, grpcio and hpack unimportable, as without the extra.
WITHOUT_EXTRA = """
import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("grpc", "envoy", "hpack"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
from ratewarden.__main__ import main
sys.exit(main())
"""


def ratewarden(directory: Path, *args: str, without_extra: bool = False) -> Any:
    """`ratewarden ARGS` in `directory`, as a shell runs it (the extra hidden if asked)."""
    start = ["-c", WITHOUT_EXTRA] if without_extra else ["-m", "ratewarden"]
    return subprocess.run(
        [sys.executable, *start, *args], capture_output=True, text=True, timeout=60,
        cwd=directory, env=clean_environment(), check=False,
    )  # fmt: skip


def test_a_daemon_without_the_port_loads_no_grpc() -> None:
    probe = (
        "import sys, json; from ratewarden.service.app import create_app; create_app(); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60,
        env=clean_environment(RATEWARDEN_STATE_FILE="off"),
    )  # fmt: skip
    loaded = {name.split(".")[0] for name in json.loads(found.stdout.splitlines()[-1])}
    assert {"grpc", "envoy", "hpack"} & loaded == set()


def test_the_port_without_the_extra_is_refused_at_start(tmp_path: Path) -> None:
    done = ratewarden(tmp_path, "serve", "--grpc-port", "18999", without_extra=True)
    assert done.returncode == 2, done.stderr
    assert "pip install 'ratewarden[envoy]'" in done.stderr
    # Without the port, the same install runs its commands as before.
    plain = ratewarden(tmp_path, "policy", "check", "--help", without_extra=True)
    assert plain.returncode == 0, plain.stderr


def test_a_bad_port_or_header_is_refused_naming_it(tmp_path: Path) -> None:
    for flags, named in [
        (["--grpc-port", "0"], "--grpc-port"),
        (["--grpc-port", "70000"], "--grpc-port"),
        (["--grpc-port", "x"], "--grpc-port"),
        (["--envoy-user-header", "X User"], "--envoy-user-header"),
    ]:
        done = ratewarden(tmp_path, "serve", *flags)
        assert done.returncode == 2, (flags, done.stderr)
        assert named in done.stderr, (flags, done.stderr)
