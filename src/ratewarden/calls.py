"""A tool call as the engine sees it: who calls which tool, and what is known about it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """Tool metadata as sent by the caller; `None` means the caller did not say.

    Unclassified tools follow the MCP defaults (not read-only, destructive,
    open-world), so a policy never treats an unknown tool as safe. The fields are
    `vocabulary.METADATA_FIELDS`, typed (tests/unit/test_vocabulary.py holds them equal).
    """

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None
    requires_confirmation: bool | None = None
    tags: frozenset[str] = frozenset()

    def effective(self, name: str) -> bool:
        """The value a rule matches against, with the MCP defaults filled in."""
        value: bool | None = getattr(self, name)
        if value is not None:
            return value
        if name == "destructive":
            # MCP: destructiveHint only means something for tools that are not read-only.
            return not self.effective("read_only")
        return name == "open_world"


UNCLASSIFIED = ToolFacts()


@dataclass(slots=True)  # built per call: not frozen, whose __init__ costs 5x; never mutated
class Call:
    """One tool invocation an agent wants to make."""

    user: str
    tool: str
    call_id: str
    session: str | None = None
    team: str | None = None
    cost: float | None = None
    facts: ToolFacts = field(default=UNCLASSIFIED)
    approved: bool = False
    named: bool = True  # the caller chose call_id (an idempotency key); False if generated

    def dimension(self, name: str) -> str | None:
        """The value of a `per` dimension (user, tool, session, team)."""
        value: str | None = getattr(self, name)
        return value
