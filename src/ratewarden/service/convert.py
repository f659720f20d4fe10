"""Between the wire (request/response bodies) and the engine's own types.

The engine's dataclasses carry the wire's field names, so pydantic reads them by
attribute: a field added to both sides needs no copying code here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import CoreSchema, SchemaSerializer, core_schema

from ratewarden.arguments import WHOLE_ARGS
from ratewarden.calls import UNCLASSIFIED, Call, ToolFacts
from ratewarden.engine import Decision, Usage, Verdict
from ratewarden.policy.model import BUILT_IN_NAMES, ToolNames
from ratewarden.vocabulary import METADATA_FLAGS, daemon_call_id
from ratewarden.wire.bodies import CheckRequest, CheckResponse, LimitState, UsageItem, Violation


def to_call(
    request: CheckRequest,
    names: ToolNames | None = None,
    classified: Callable[[str, ToolFacts], ToolFacts] | None = None,
) -> Call:
    """The engine's view of a request; its `args` are matched and hashed, never stored.

    A request that names its `host` (a hook's), or any under a policy with `same_as`
    lines (`names`), is put in canonical terms here, the one place every check passes
    (the hot path's too): the host's tool name becomes the canonical one, kept in
    `host_tool`, its arguments reshaped (wire/tools.py). Any other costs one read.
    """
    meta = request.metadata
    facts = (
        UNCLASSIFIED
        if meta is None
        else ToolFacts(
            **{name: getattr(meta, name) for name in METADATA_FLAGS}, tags=frozenset(meta.tags)
        )
    )
    user, args, paths = request.user, request.args, request.args_cut  # each read once
    assert user is not None, "vouched for before it is decided (service/vouch.py)"
    if args is None and paths:
        args = {}
    cut = _cut_steps(paths) if paths else ()
    tool, host_tool = request.tool, request.host_tool
    if request.host is not None or names is not None:
        tool, host_tool, args, cut = _canonical(request, names or BUILT_IN_NAMES, args, cut)
    if classified is not None:  # the policy's catalogue says what some tools are
        facts = classified(tool, facts)
    return Call(
        user=user,
        tool=tool,
        call_id=request.call_id or daemon_call_id(),
        session=request.session,
        team=request.team,
        cost=request.cost,
        facts=facts,
        approved=request.approved,
        named=request.call_id is not None,
        args=args,
        args_cut=cut,
        host_tool=host_tool,
        kind=request.kind,
        input_tokens=request.input_tokens or 0,
        max_output_tokens=request.max_output_tokens,
    )


Cut = tuple[tuple[str, ...], ...]


def _canonical(
    request: CheckRequest, names: ToolNames, args: Any, cut: Cut
) -> tuple[str, str | None, Any, Cut]:
    """The request's tool, the host's own name for it, its args and their cut paths, in
    canonical terms. A tool no table knows keeps its name (and the `host_tool` sent)."""
    found = names.canonical(request.host, request.tool, args)
    if cut and found.moved:
        cut = _cut_followed(cut, found.moved)
    host_tool = found.host_tool if found.host_tool is not None else request.host_tool
    return found.tool, host_tool, found.args, cut


def _cut_followed(cut: Cut, moved: Mapping[str, str | None]) -> Cut:
    """The cut paths as paths of the reshaped args: a renamed argument's path follows it
    to its new key. One whose value no longer stands as sent (a decoy replaced, a command
    joined) makes the whole args cut, so that no condition is decided on a value the
    client had to cut (a rule in `match` then holds; docs/policy.md)."""
    followed: list[tuple[str, ...]] = []
    for steps in cut:
        if not steps or steps[0] not in moved:
            followed.append(steps)
            continue
        to = moved[steps[0]]
        if to is None:
            return ((),)
        followed.append((to, *steps[1:]))
    return tuple(followed)


def _cut_steps(paths: list[str]) -> tuple[tuple[str, ...], ...]:
    """The cut paths' steps; called only when some were cut (most calls have none, and a
    generator made for each of them was a cost on every decision)."""
    return tuple(_steps(path) for path in paths)


def _steps(path: str) -> tuple[str, ...]:
    """A cut path's steps (the wire checked it): `*`, the whole args, has none."""
    return () if path == WHOLE_ARGS else tuple(path.split("."))


def to_response(decision: Decision) -> CheckResponse:
    return CheckResponse.model_validate(decision, from_attributes=True)


def check_json(decision: Decision) -> bytes:
    """What `to_response(decision)` serialises to, written straight from the decision.

    The hot path's answer: validating a `CheckResponse` only to serialise it again cost
    more than the engine's own work for five rules. A serializer compiled once from the
    wire models reads the engine's dataclasses by attribute, as `to_response` does, with
    no dict per verdict. The engine's types already hold the wire's types
    (tests/service/test_hotpath.py holds both paths to the same answers, ints and floats told
    apart).
    """
    return _CHECK.to_json(decision)


def batch_json(decisions: Sequence[Decision]) -> bytes:
    """`check_json` for a batch: `{"results": [...]}`."""
    return _BATCH.to_json({"results": decisions})


def _by_attribute(
    cls: type[Any], model: type[BaseModel], nested: dict[str, CoreSchema] | None = None
) -> CoreSchema:
    """Serialise a `cls` as the wire `model`: its fields, read by attribute."""
    names = list(model.model_fields)
    fields = [
        core_schema.dataclass_field(name, (nested or {}).get(name, _plain(model, name)))
        for name in names
    ]
    return core_schema.dataclass_schema(
        cls, core_schema.dataclass_args_schema(cls.__name__, fields), names
    )


def _plain(model: type[BaseModel], name: str) -> CoreSchema:
    """A field's serializer: as text when the wire says `str` (a verdict's kind is a
    `RuleKind`, which the inferring serializer writes by a Python call per verdict: 0.8 us
    of a decision's 100), else inferred from the value."""
    is_text = model.model_fields[name].annotation is str
    return core_schema.str_schema() if is_text else core_schema.any_schema()


def _verdicts(model: type[BaseModel]) -> CoreSchema:
    """A decision's tuple of verdicts, each shown as the wire `model` shows it."""
    return core_schema.tuple_schema([_by_attribute(Verdict, model)], variadic_item_index=0)


_DECISION = _by_attribute(
    Decision,
    CheckResponse,
    {
        "violations": _verdicts(Violation),
        "shadow": _verdicts(Violation),
        "limits": _verdicts(LimitState),
    },
)
_CHECK = SchemaSerializer(_DECISION)
_BATCH = SchemaSerializer(
    core_schema.typed_dict_schema(
        {"results": core_schema.typed_dict_field(core_schema.list_schema(_DECISION))}
    )
)


def to_usage_item(usage: Usage) -> UsageItem:
    return UsageItem.model_validate(usage, from_attributes=True)
