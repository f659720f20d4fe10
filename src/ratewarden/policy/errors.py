"""Policy errors that name the file, the line and the field path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ratewarden.errors import RatewardenError


@dataclass(frozen=True, slots=True)
class PolicyIssue:
    """One problem in a policy file, at a field path such as ("rules", 2, "rate")."""

    path: tuple[str | int, ...]
    message: str
    line: int | None = None

    @property
    def field(self) -> str:
        """`rules[2].rate` for ("rules", 2, "rate")."""
        text = ""
        for part in self.path:
            text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
        return text or "(top level)"


class PolicyError(RatewardenError):
    """A policy file that cannot be used; `issues` holds every problem found."""

    def __init__(self, source: str, issues: Sequence[PolicyIssue]) -> None:
        self.source = source
        self.issues = list(issues)
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        return [
            f"{self.source}:{issue.line}: {issue.field}: {issue.message}"
            if issue.line
            else f"{self.source}: {issue.field}: {issue.message}"
            for issue in self.issues
        ]
