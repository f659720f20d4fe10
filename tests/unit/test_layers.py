"""The layers import downwards only: the store and the limiter know nothing of the policy.

Checked in a fresh interpreter, so that what another test imported cannot hide it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def modules_loaded_by(statement: str) -> set[str]:
    probe = f"import sys; {statement}; import json; print(json.dumps(sorted(sys.modules)))"
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(found.stdout))


@pytest.mark.parametrize(
    "package", ["ratewarden.store", "ratewarden.limiter.reference", "ratewarden.store.cluster"]
)
def test_the_store_and_the_limiter_do_not_import_the_policy(package: str) -> None:
    loaded = modules_loaded_by(f"import {package}")
    assert package in loaded  # the probe did import it
    assert {m for m in loaded if m.startswith("ratewarden.policy")} == set()
    assert "yaml" not in loaded
