"""The daemon's messages: templates checked at load, rendered for each refusal.

The sentences themselves are `ratewarden.vocabulary`'s (with every other sentence a
model can read). Templates are checked when the policy loads, so a typo in a rule's
`message:` is a policy error, never a failure while deciding a call.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass

from ratewarden import vocabulary
from ratewarden.policy.durations import humanize_seconds

# The texts are the vocabulary's; this module checks and renders them.
DEFAULT_TEMPLATES = vocabulary.TEMPLATES
TEMPLATE_FIELDS = vocabulary.TEMPLATE_FIELDS


@dataclass(frozen=True, slots=True)
class Template:
    """A validated message template; `custom` ones (a rule's own `message:`, an access
    rule's text, and defaults that advise against waiting) get no automatic retry suffix."""

    text: str
    custom: bool

    def render(self, fields: Mapping[str, object], retry_after: float | None) -> str:
        message = self.text.format_map(fields)
        if not self.custom and retry_after is not None and retry_after > 0:
            message += vocabulary.RETRY_SUFFIX.format(wait=humanize_seconds(retry_after))
        return message


def compile_template(text: str, kind: str = vocabulary.RuleKind.RATE) -> Template:
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
    # A sentence whose advice is not to wait (a repeated call) is rendered as written.
    return Template(DEFAULT_TEMPLATES[kind], custom=kind in vocabulary.NO_RETRY_SUFFIX)


def retry_text(retry_after: float | None) -> str:
    """What `{retry_after}` renders as in a custom template."""
    return vocabulary.RETRY_LATER if retry_after is None else humanize_seconds(retry_after)
