"""Every message a model can receive, in one place.

Templates are checked when the policy loads, so a typo in a rule's `message:` is a
policy error, never a failure while deciding a call.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass

from ratewarden.policy.durations import humanize_seconds

DEFAULT_TEMPLATES = {
    "rate": "Rate limit: max {limit} {label} calls per {window}",
    "concurrency": "Concurrency limit: max {limit} {label} calls at once",
    "budget": (
        "Budget exceeded for {label} tools: spent {spent} of {budget} {currency} this {period}"
    ),
    "unavailable": "Tool guard unavailable; {label} calls are paused",
}

# Fields a `message:` template may use, by the kind of rule it belongs to.
_COMMON = frozenset({"limit", "label", "retry_after", "remaining", "user", "tool", "rule"})
TEMPLATE_FIELDS = {
    "rate": _COMMON | {"window"},
    "concurrency": _COMMON,
    "budget": _COMMON | {"spent", "reserved", "budget", "currency", "period"},
}


@dataclass(frozen=True, slots=True)
class Template:
    """A validated message template; `custom` ones get no automatic retry suffix."""

    text: str
    custom: bool

    def render(self, fields: Mapping[str, object], retry_after: float | None) -> str:
        message = self.text.format_map(fields)
        if not self.custom and retry_after is not None and retry_after > 0:
            message += f" (retry in {humanize_seconds(retry_after)})"
        return message


def compile_template(text: str, kind: str = "rate") -> Template:
    """Check that `text` only uses the `{fields}` a `kind` rule has; raise ValueError otherwise."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"invalid template {text!r}: {exc}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in TEMPLATE_FIELDS[kind] or spec or conversion:
            known = ", ".join(sorted(TEMPLATE_FIELDS[kind]))
            raise ValueError(f"unknown placeholder {{{name}}} in {text!r}; known: {known}")
    return Template(text, custom=True)


def default_template(kind: str) -> Template:
    return Template(DEFAULT_TEMPLATES[kind], custom=False)


def retry_text(retry_after: float | None) -> str:
    """What `{retry_after}` renders as in a custom template."""
    return "later" if retry_after is None else humanize_seconds(retry_after)
