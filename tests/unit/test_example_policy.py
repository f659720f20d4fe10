"""The packaged example policy (policy/example.yaml) through the engine, as `ratewarden
serve` with no policy file decides: its `no-root-delete` rule against the shell spellings
of a root delete (issue 25, item 10), and against the deletes it must leave alone.

A regular expression is a text denylist (docs/policy.md says what it cannot see); these
tables are the spellings it is expected to see. `BYPASSES` were allowed by the pattern
the example shipped before (cfe3e0b); `ALREADY_REFUSED` were refused then too, and stay
refused.
"""

from __future__ import annotations

import itertools

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.policy import load_example_policy
from ratewarden.store import MemoryStore

MESSAGE = "Refusing to delete the root directory"
_call_ids = itertools.count()

BYPASSES = [
    'rm -rf "/"*',
    "rm -rf /{bin,etc}",
    "rm -rf '/'",
    'rm -rf "/"',
    'rm -rf -- "/"',
    'rm -rf "/*"',
    "rm -rf //",
    "rm -rf ///",
    "rm -rf \\/",
    "rm -rf ~/../../",
    "rm -rf ~/..",
    "rm -rf $HOME/../..",
    'rm -rf "${HOME}/../.."',
    "rm -rf /.",
    "rm -rf /..",
    "rm -rf /./",
    "rm -rf /usr/..",
    "rm -rf /.*",
    "rm -rf /[a-z]*",
    "rm -rf /?",
    "rm -rf /$BUILD_DIR",  # an unset variable: the root
    "rm -rf ./dist /",  # the root after another operand
    "rm -rf /tmp/build /",
    "$(rm -rf /)",
    '"rm" -rf /',
]
ALREADY_REFUSED = [
    "rm -rf /",
    "rm -fr /",
    "rm -r -f /",
    "rm --recursive --force /",
    "rm -rf /*",
    "sudo rm -rf /",
    "sudo rm -rf /*",
    "rm  -rf   /",
    "rm\t-rf\t/",
    "/bin/rm -rf /",
    "\\rm -rf /",
    "rm -Rf /",
    "busybox rm -rf /",
    "rm -r -f --no-preserve-root / ",
    "cd /tmp && rm -rf /",
    "x&&rm -rf /",
    "rm -rf -- /",
    "rm -rf /*/",
    "rm -rf / tmp",  # a stray space
    "rm -rf / --no-preserve-root",
]
ALLOWED = [
    "rm -rf /tmp/build",
    "rm -rf ./dist",
    "rm -rf -- ./dist",
    "rm -rf dist/*",
    "rm -rf /tmp/build/*",
    "rm -rf /tmp/*.log",
    "rm -rf /opt/app/{a,b}",
    "rm -rf /var/tmp/cache",
    "rm -rf /home/me/proj/../dist",
    "rm -rf ~/tmp",
    "rm -rf ~/.cache/pip",
    "rm -rf ../dist",
    "rm -rf node_modules .git",
    'rm -rf "$BUILD_DIR"/*',
    "rm -rf $PREFIX/build",
    "rm -f /tmp/x.lock",
    "rm -rf ./dist; ls /",
    "rm -rf build && cd /",
    "git rm -r --cached src",
    "docker run --rm alpine ls /",
    "podman run --rm -v /:/host img",
    "ls /",
    "echo rm -rf",
    "perform -rf /",
]


async def decide(command: str) -> tuple[str, str]:
    """The packaged example's decision on a terminal call running `command`."""
    clock = FakeClock(1_700_000_000_000)
    engine = Engine(load_example_policy(), MemoryStore(clock), clock=clock)
    call = Call("bob", "terminal", f"c-{next(_call_ids)}", args={"command": command})
    decision = await engine.check(call)
    return decision.decision, decision.message


@pytest.mark.parametrize("command", BYPASSES)
async def test_the_example_refuses_a_root_delete_however_it_is_spelled(command: str) -> None:
    assert await decide(command) == ("deny", MESSAGE)


@pytest.mark.parametrize("command", ALREADY_REFUSED)
async def test_the_example_still_refuses_the_plain_spellings(command: str) -> None:
    assert await decide(command) == ("deny", MESSAGE)


@pytest.mark.parametrize("command", ALLOWED)
async def test_the_example_allows_deletes_that_are_not_the_root(command: str) -> None:
    assert await decide(command) == ("allow", "")
