"""Checks across fields (rule names, groups, overrides) on the raw YAML data.

They run on the raw mapping rather than on the validated schema so that a file with a
schema error still gets its reference errors reported: `policy check` lists them all.
"""

from __future__ import annotations

from typing import Any

from ratewarden.policy.errors import PolicyIssue


def reference_issues(data: dict[str, Any]) -> list[PolicyIssue]:
    rules = _items(data.get("rules"))
    raw_groups = data.get("groups")
    groups: dict[str, Any] = raw_groups if isinstance(raw_groups, dict) else {}
    names = [rule.get("name") for rule in rules]
    issues = [
        PolicyIssue(("rules", i, "name"), f"duplicate rule name {name!r}")
        for i, name in enumerate(names)
        if isinstance(name, str) and name in names[:i]
    ]
    for i, rule in enumerate(rules):
        match = rule.get("match")
        for group in _names(match.get("group") if isinstance(match, dict) else None):
            if group not in groups:
                issues.append(
                    PolicyIssue(("rules", i, "match", "group"), f"unknown group {group!r}")
                )
    for i, override in enumerate(_items(data.get("overrides"))):
        target = override.get("rule")
        if isinstance(target, str) and target not in names:
            issues.append(PolicyIssue(("overrides", i, "rule"), f"unknown rule {target!r}"))
        for j, group in enumerate(_names(override.get("groups"))):
            if group not in groups:
                issues.append(
                    PolicyIssue(("overrides", i, "groups", j), f"unknown group {group!r}")
                )
    return issues


def _items(value: object) -> list[dict[str, Any]]:
    """The mappings in a list, as positions matter; anything else counts as empty."""
    if not isinstance(value, list):
        return []
    return [item if isinstance(item, dict) else {} for item in value]


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
