"""Turn a field-checked `PolicySpec` into the runtime `Policy`.

This is where fields are checked against each other: unique rule names, groups that
exist, overrides that fit their rule. Every problem is collected, so `policy check`
reports them all at once.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ratewarden.policy.errors import PolicyIssue
from ratewarden.policy.messages import compile_template, default_template
from ratewarden.policy.model import (
    METADATA_FIELDS,
    Algorithm,
    Limit,
    Match,
    Mode,
    NameSet,
    OnExceed,
    Overrides,
    Policy,
    RateLimit,
    Rule,
    ToolEntry,
    Unlimited,
    is_glob,
)
from ratewarden.policy.schema import MatchSpec, OverrideSpec, PolicySpec, RuleSpec


def compile_policy(
    spec: PolicySpec, source: str, raw: bytes
) -> tuple[Policy | None, list[PolicyIssue]]:
    """Build the runtime policy, or return every issue found (and no policy)."""
    issues: list[PolicyIssue] = []  # names and groups were checked by references.py
    overrides = _compile_overrides(spec, issues)
    if issues:
        return None, issues
    rules = tuple(
        _compile_rule(spec, i, r, overrides.get(r.name)) for i, r in enumerate(spec.rules)
    )
    document = spec.model_dump(mode="json", exclude_none=True)
    policy = Policy(
        version=hashlib.sha256(raw).hexdigest()[:16],
        source=source,
        defaults=spec.defaults.model_dump(),
        groups={name: NameSet.of(members) for name, members in spec.groups.items()},
        tools=tuple(
            (NameSet.of(pattern), ToolEntry(entry.label, entry.cost))
            for pattern, entry in spec.tools.items()
            if pattern != "default"
        ),
        default_tool=_default_tool(spec),
        rules=rules,
        document=document,
    )
    return policy, []


def _compile_rule(
    spec: PolicySpec, index: int, rule: RuleSpec, overrides: Overrides | None
) -> Rule:
    assert rule.rate is not None  # the schema refuses the other kinds for now
    algorithm = Algorithm(rule.algorithm or spec.defaults.algorithm)
    return Rule(
        name=rule.name,
        index=index,
        match=_compile_match(rule.match),
        per=tuple(rule.per),
        limit=RateLimit(rule.rate, algorithm, rule.burst),
        mode=Mode(rule.mode or spec.defaults.mode),
        on_exceed=OnExceed(rule.on_exceed),
        fail=rule.fail,
        label=rule.label,
        template=compile_template(rule.message) if rule.message else default_template("rate"),
        overrides=overrides or Overrides(),
    )


def _compile_match(spec: MatchSpec) -> Match:
    def names(value: list[str] | None) -> NameSet | None:
        return None if value is None else NameSet.of(value)

    return Match(
        tools=names(spec.tool),
        users=names(spec.user),
        groups=None if spec.group is None else frozenset(spec.group),
        sessions=names(spec.session),
        teams=names(spec.team),
        metadata=tuple(
            (name, value) for name in METADATA_FIELDS if (value := getattr(spec, name)) is not None
        ),
        tags=None if spec.tags is None else frozenset(spec.tags),
    )


def _compile_overrides(spec: PolicySpec, issues: list[PolicyIssue]) -> dict[str, Overrides]:
    """Index overrides per rule by precedence; report the ones that do not fit."""
    rules = {rule.name: rule for rule in spec.rules}
    exact: dict[str, dict[str, tuple[Limit, str]]] = {}
    groups: dict[str, list[tuple[str, Limit, str]]] = {}
    globs: dict[str, list[Any]] = {}
    for i, override in enumerate(spec.overrides):
        rule = rules[override.rule]
        origin = f"overrides[{i}]"
        limit = _override_limit(spec, rule, override, i, issues)
        for group in override.groups or []:
            groups.setdefault(rule.name, []).append((group, limit, origin))
        for user in override.users or []:
            if is_glob(user):
                pattern = NameSet.of(user).globs[0]
                globs.setdefault(rule.name, []).append((pattern, limit, origin))
            else:
                exact.setdefault(rule.name, {}).setdefault(user, (limit, origin))
    return {
        name: Overrides(
            exact.get(name, {}), tuple(groups.get(name, ())), tuple(globs.get(name, ()))
        )
        for name in rules
    }


def _override_limit(
    spec: PolicySpec, rule: RuleSpec, override: OverrideSpec, index: int, issues: list[PolicyIssue]
) -> Limit:
    if override.unlimited:
        return Unlimited()
    for kind in ("concurrency", "budget"):
        if getattr(override, kind) is not None:
            issues.append(
                PolicyIssue(
                    ("overrides", index, kind), f"rule {rule.name!r} is a rate rule, not {kind}"
                )
            )
    algorithm = Algorithm(rule.algorithm or spec.defaults.algorithm)
    if override.burst is not None and algorithm is not Algorithm.TOKEN_BUCKET:
        issues.append(
            PolicyIssue(("overrides", index, "burst"), "burst only applies to token_bucket rules")
        )
    rate = override.rate or rule.rate
    assert rate is not None
    return RateLimit(rate, algorithm, override.burst or rule.burst)


def _default_tool(spec: PolicySpec) -> ToolEntry:
    entry = spec.tools.get("default")
    return ToolEntry(entry.label, entry.cost) if entry else ToolEntry(None, 0.0)
