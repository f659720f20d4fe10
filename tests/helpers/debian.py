"""Debian packages the suite drives (redis-server, chromium, valgrind): found on the PATH,
or installed with apt-get, so the suite runs on a fresh Debian machine."""

from __future__ import annotations

import os
import shutil
import subprocess


def ensure_command(command: str, package: str | None = None) -> str:
    """Path of `command`, installing Debian's `package` (default: the command's name) if it
    is not there."""
    found = shutil.which(command)
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", package or command],
        check=True,
        capture_output=True,
        env=env,
    )
    found = shutil.which(command)
    if not found:
        raise RuntimeError(f"{command} is not installed and apt-get could not install it")
    return found
