"""How the counters script is assembled (limiter/script.py): what each call of it runs.

Redis runs the whole body of a script at every EVALSHA, so every `local function` above
the point where a mode returns is made again (a closure each) on every call of that mode.
A decision, the hot mode, returns as soon as its own functions exist: the settle's, the
sweep's and the cluster modes' are made only by the calls that run them
(bench/instructions.py: 11 % of a one-rule decision's Redis instructions). The modes'
answers are held by the conformance tests on real Redis.
"""

from __future__ import annotations

import re

from ratewarden.limiter.script import SOURCE, ScriptMode

DECIDE_RETURNS = "if mode == 'decide' then return decide() end"


def _defined_at(name: str) -> int:
    found = re.search(rf"^local function {name}\(", SOURCE, re.MULTILINE)
    assert found, name
    return found.start()


def test_a_decision_returns_before_any_other_mode_is_made() -> None:
    returns = SOURCE.index(DECIDE_RETURNS)
    assert _defined_at("decide") < returns
    others = [mode.value for mode in ScriptMode if mode is not ScriptMode.DECIDE]
    assert others
    for mode in others:
        assert _defined_at(mode) > returns, mode


def test_the_decision_returns_at_the_top_level_of_the_script() -> None:
    """Not inside a function or block: the line is the chunk's own."""
    line = next(line for line in SOURCE.splitlines() if DECIDE_RETURNS in line)
    assert line == DECIDE_RETURNS
