"""What the engine asks a store to do for one call, and what the store answers.

A call becomes a list of `CounterOp`s, one per matching rule. A store evaluates all of
them and then commits all or none, in one atomic step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ratewarden.policy.model import Algorithm

# Short algorithm codes as the Lua script knows them.
ALGORITHM_CODES = {
    Algorithm.SLIDING_WINDOW: "sw",
    Algorithm.TOKEN_BUCKET: "tb",
    Algorithm.FIXED_WINDOW: "fw",
}


class Role(IntEnum):
    """How one op's verdict weighs on the call."""

    SHADOW = 0  # never blocks; consumes only when it would have admitted the call
    ENFORCE = 1  # blocks the whole call when it does not admit it
    FORCED = 2  # an approved `ask` rule: never blocks, always consumes


@dataclass(frozen=True, slots=True)
class CounterOp:
    key: str
    algorithm: Algorithm
    limit: int
    window_ms: int
    burst: int  # token bucket capacity; equals `limit` for the other algorithms
    role: Role

    def consumes(self, admitted: bool) -> bool:
        """Whether this op takes a unit once the call as a whole is allowed."""
        return admitted or self.role is Role.FORCED


@dataclass(frozen=True, slots=True)
class OpResult:
    """One counter's answer; `used`/`remaining` are after this call was counted (or not)."""

    admitted: bool
    used: int
    remaining: int
    retry_after_ms: int | None  # until this counter would admit; None = never (limit 0)
    reset_after_ms: int  # until the counter is back to empty


def blocks(ops: list[CounterOp], admitted: list[bool]) -> bool:
    """All or nothing: the call is blocked when any enforcing op does not admit it."""
    return any(op.role is Role.ENFORCE and not ok for op, ok in zip(ops, admitted, strict=True))
