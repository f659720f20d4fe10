"""What `ci_status` answers on its n-th call, for the loop-on-results proofs: the run's
state changes every second call for the first ten (a CI run going through its steps),
then stays `passed`. Shared by the LangChain driver, the MCP server and the shell script
Claude Code runs, so every host sees the same world."""

from __future__ import annotations

import sys
from pathlib import Path

CHANGING = 10  # calls during which the answer changes every second call


def answer(n: int) -> str:
    """The answer to the n-th call (1-based)."""
    return f"run 42: step {(n + 1) // 2} of 5 running" if n <= CHANGING else "run 42: passed"


def next_answer(counter: Path) -> str:
    """Count one more call in `counter` (a file) and answer it."""
    n = (int(counter.read_text()) if counter.exists() else 0) + 1
    counter.write_text(str(n))
    return answer(n)


if __name__ == "__main__":  # the shell command: python ci_status.py COUNTER
    print(next_answer(Path(sys.argv[1])))
