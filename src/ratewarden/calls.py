"""A tool call as the engine sees it: who calls which tool, and what is known about it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ratewarden.arguments import MISSING, ArgPath, digest
from ratewarden.vocabulary import ARGS_DIMENSION, CallKind, Dimension


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
    """One tool invocation (or model request) an agent wants to make."""

    user: str
    tool: str
    call_id: str
    session: str | None = None
    team: str | None = None
    cost: float | None = None
    facts: ToolFacts = field(default=UNCLASSIFIED)
    approved: bool = False
    named: bool = True  # the caller chose call_id (an idempotency key); False if generated
    # The tool's arguments, when the policy reads them: matched and hashed into counter
    # keys, never stored or logged (the audit gets them separately, if the operator asks).
    args: Mapping[str, Any] | None = None
    # The paths of `args` whose values the client had to cut to send them (each as its
    # steps; `()` is the whole args): a condition on them cannot be decided from `args`.
    args_cut: tuple[tuple[str, ...], ...] = ()
    # The host's own name for the tool when `tool` is its canonical one (`Bash` for
    # `terminal` from Claude Code: wire/tools.py); a rule naming either matches the call.
    host_tool: str | None = None
    # A model call (docs/budgets.md): `tool` is its model, its cost the price of these
    # tokens (its most output: None, the policy's `defaults.max_output_tokens`).
    kind: str = CallKind.TOOL
    input_tokens: int = 0
    max_output_tokens: int | None = None
    _args_digest: str | None = field(default=None, repr=False, compare=False)

    def args_digest(self) -> str | None:
        """The digest of the whole `args` (None without them), worked out once per call:
        a counter per identical call and the call's identity both use it."""
        if self._args_digest is None and self.args is not None:
            self._args_digest = digest(self.args)
        return self._args_digest

    def dimension(self, name: str) -> str | None:
        """The value of a `per` dimension: user, tool, session or team as it is; `args`
        and `args.PATH` as a fixed-length digest of the arguments (None when absent)."""
        if name == Dimension.ARGS:
            return self.args_digest()
        if name.startswith(ARGS_DIMENSION):
            value = _arg_path(name).resolve(self.args)
            return None if value is MISSING else digest(value)
        found: str | None = getattr(self, name)
        return found


@lru_cache(maxsize=1024)
def _arg_path(dimension: str) -> ArgPath:
    """`args.PATH`'s path, parsed once (the policy checked it at load)."""
    return ArgPath.parse(dimension.removeprefix(ARGS_DIMENSION))
