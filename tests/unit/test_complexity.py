"""No function in the package is above cyclomatic complexity 15, as radon counts it.

ruff's C90 counts fewer branches (boolean operators, comprehensions' conditions), so
radon is the measure here: what it counts is what a reader has to hold in mind.
"""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit  # type: ignore[import-untyped]

import ratewarden

MAX_COMPLEXITY = 15
PACKAGE = Path(ratewarden.__file__).parent


def test_no_function_is_above_the_complexity_limit() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for block in cc_visit(path.read_text()):
            if block.complexity > MAX_COMPLEXITY:
                found[f"{path.relative_to(PACKAGE)}:{block.lineno} {block.name}"] = block.complexity
    assert found == {}


def test_the_check_sees_a_complex_function() -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(MAX_COMPLEXITY))
    [block] = cc_visit(f"def f(x):\n{branches}    return -1\n")
    assert block.complexity == MAX_COMPLEXITY + 1
