"""The decision: a call, the policy and a store in; allow, deny or ask out.

The engine turns the rules that apply to a call into counter ops, hands all of them to
the store in one atomic step, and words the outcome. It never talks to Redis itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import unquote

from ratewarden.calls import UNCLASSIFIED, Call
from ratewarden.clock import Clock
from ratewarden.engine.access import AccessGate
from ratewarden.engine.decision import (
    Decision,
    Settlement,
    Shape,
    Usage,
    Verdict,
    binding,
    scope_of,
    soft_limit_warning,
    verdict,
)
from ratewarden.engine.fallback import LOCAL_KEYS, LocalCounts
from ratewarden.engine.refusals import MAX_ENTRIES, RefusalCache
from ratewarden.errors import RatewardenError
from ratewarden.limiter.ops import (
    HOLDING,
    SETTLED_KINDS,
    CallRecord,
    CounterOp,
    Evaluation,
    Hold,
    Kind,
    OpResult,
    Recorded,
    Role,
)
from ratewarden.limiter.script import SettleStatus
from ratewarden.policy.durations import MICROS, to_micros
from ratewarden.policy.messages import default_template
from ratewarden.policy.model import (
    AccessLimit,
    Algorithm,
    Applied,
    BudgetLimit,
    ConcurrencyLimit,
    Mode,
    OnExceed,
    Policy,
    RateLimit,
    Unlimited,
)
from ratewarden.store.base import Counters, Store, StoreError
from ratewarden.store.breaker import CircuitOpenError
from ratewarden.store.keys import CounterKeys, encode, record_key, reset_patterns
from ratewarden.vocabulary import APPROVED_PAST, NO_PRICE, UNAVAILABLE, CallKind
from ratewarden.wire.bodies import ModelUsage

log = logging.getLogger("ratewarden.engine")

KIND_OF = {  # a rate rule's algorithm -> the counter kind the store knows it by
    Algorithm.SLIDING_WINDOW: Kind.SLIDING_WINDOW,
    Algorithm.TOKEN_BUCKET: Kind.TOKEN_BUCKET,
    Algorithm.FIXED_WINDOW: Kind.FIXED_WINDOW,
}


class CallIdConflict(RatewardenError):
    """A call_id already recorded for another call, or for a call already settled."""


class NotAModelCall(RatewardenError):
    """A settle with a model call's usage, of a call checked as a tool call."""


def owner_of(fingerprint: str) -> str:
    """The user whose call a record is, from its fingerprint (which begins with it)."""
    return unquote(fingerprint.partition("|")[0])


_MODEL_MARK = "model"  # a model call's fingerprint: user|model|model[|digest]


def model_of(fingerprint: str) -> str | None:
    """The model a recorded model call named, from its fingerprint; None: a tool call."""
    parts = fingerprint.split("|", 3)
    return unquote(parts[1]) if len(parts) > 2 and parts[2] == _MODEL_MARK else None


def fingerprint(call: Call) -> str:
    """What shapes the call's decision, so a call_id replays only the very same call.

    User and tool in the clear (the common case stops there); the rest, when any of it
    is set, as a digest: tags sorted and `args` canonical, so every daemon computes the
    same string (and no argument's text is kept).
    """
    head = f"{encode(call.user)}|{encode(call.tool)}"
    if call.kind == CallKind.MODEL:  # its settle prices the model named here, no other
        head = f"{head}|{_MODEL_MARK}"
    if not call.named:
        return head  # an id the daemon made up is never sent again: nothing to tell apart
    facts = call.facts
    if (
        call.session is None
        and call.team is None
        and call.cost is None
        and (facts is UNCLASSIFIED or facts == UNCLASSIFIED)  # identity: the usual case
        and not call.approved
        and call.args is None
        and call.host_tool is None
        and call.kind == CallKind.TOOL
    ):
        return head
    rest = [
        call.session,
        call.team,
        call.cost,
        facts.read_only,
        facts.destructive,
        facts.idempotent,
        facts.open_world,
        facts.requires_confirmation,
        sorted(facts.tags),
        call.approved,
        call.args_digest(),
    ]
    if call.host_tool is not None:  # last, and only when set: older records keep their digest
        rest.append(call.host_tool)
    if call.kind == CallKind.MODEL:  # its tokens shape its price, as a tool's cost does
        rest += [call.input_tokens, call.max_output_tokens]
    digest = hashlib.blake2b(json.dumps(rest).encode(), digest_size=16).hexdigest()
    return f"{head}|{digest}"


@dataclass(frozen=True, slots=True)
class _Plan:
    """An applied rule's share of every call's decision, worked out once per policy:
    the parts of its counter key, its kind and numbers, the roles it can take, and what
    its verdicts share. Per call, only the scope's values, the role and a budget's cost
    and period are left to fill in."""

    applied: Applied
    keys: CounterKeys
    kind: Kind
    role: Role
    approved_role: Role  # for a call the user approved (an `ask` rule lets it past)
    limit: int  # calls per window, slots, or budget in micro-units
    window_ms: int  # rate window or lease timeout (a budget's comes from the policy)
    burst: int
    # The rule's name on ops a settle must reach: holds (budget, concurrency) and a loop
    # rule keyed on results (`same_result`), whose allowed calls are told to settle.
    holder: str
    shape: Shape  # its budget, if it is one, too
    # Its refusals may be remembered (refusals.py): past its limit it denies (an `ask`
    # rule's refusal an approval lifts) and only waiting lifts it (a loop rule keyed on
    # results restarts when any call's settle brings a new result).
    rememberable: bool
    same_result: bool  # a loop rule keyed on results: an allowed call sends its result

    @classmethod
    def of(cls, applied: Applied) -> _Plan:
        rule, limit = applied.rule, applied.limit
        if rule.mode is Mode.SHADOW:
            role = approved = Role.SHADOW
        else:
            role = Role.ENFORCE
            approved = Role.FORCED if rule.on_exceed is OnExceed.ASK else Role.ENFORCE
        window_ms = burst = 0
        same_result = False
        if isinstance(limit, RateLimit):
            kind = Kind.TOKENS if limit.rate.tokens else KIND_OF[limit.algorithm]
            window_ms, burst = limit.rate.window_ms, limit.burst or limit.limit
            same_result = limit.same_result
        elif isinstance(limit, ConcurrencyLimit):
            kind, window_ms = Kind.CONCURRENCY, limit.lease_ms
        else:
            assert isinstance(limit, BudgetLimit)
            kind = Kind.BUDGET
        # A token rate's settle adds the call's tokens: it must reach the counter too.
        holder = rule.name if kind in SETTLED_KINDS or same_result else ""
        keys = CounterKeys.of(rule.name, kind, rule.per)
        return cls(
            applied, keys, kind, role, approved, limit.limit, window_ms, burst, holder,
            Shape.of(applied), rule.on_exceed is OnExceed.DENY and not same_result, same_result,
        )  # fmt: skip


class Engine:
    def __init__(
        self,
        policy: Policy,
        store: Store,
        fail: str | None = None,
        clock: Clock | None = None,
        *,
        remember_refusals: bool = True,
        local_keys: int = LOCAL_KEYS,
    ) -> None:
        self.policy = policy
        self.store = store
        self.fail = fail  # the FAIL setting; a rule's own `fail:` still wins
        self.clock = clock or store.clock  # only to pick budget periods; Redis has the time
        self._plans_policy: Policy | None = None
        self._plan_of: dict[int, _Plan] = {}  # by id() of the policy's Applied
        self._keyed_on_results = False  # the policy has a loop rule keyed on results
        # Rate refusals, until their wait ends (room for none: every call asks the store).
        self.refusals = RefusalCache(self.clock, MAX_ENTRIES if remember_refusals else 0)
        # Fail-open rules' counts while the store is down (fallback.py): bounded, not free.
        self.local = LocalCounts(self.clock, local_keys)

    async def check(self, call: Call) -> Decision:
        """Decide `call` against every rule that applies, consuming all or nothing."""
        policy = self.policy  # one policy for the whole decision, even across a reload
        applied = policy.applicable(call)
        if not applied:
            return Decision("allow", call.call_id, approved=call.approved)
        refused, gate = _answered_first(policy, call, applied)
        if refused is not None:
            return refused
        if gate is not None:
            if gate.asking:  # what would the counters say? (read, nothing taken)
                return await self._asked(policy, call, gate)
            applied = gate.counted
        # The counters, in one step of the store (one coroutine: each await costs).
        plans = self._plans(policy, applied)
        ops = [self._op(policy, plan, call) for plan in plans]
        refusals = self.refusals
        if refusals.entries and (known := self._known_refusal(policy, call, plans, ops)):
            return known if gate is None else gate.joined(known)
        asked_at = refusals.clock()
        record = self._record(policy, call, ops)
        try:
            found = await self.store.evaluate(ops, record)
        except StoreError as exc:
            return self._unavailable(policy, call, plans, ops, record, exc)
        decided = self._counted(policy, call, plans, ops, found)
        if decided.violations:  # a refusal (a replay is an allow)
            refusals.remember(ops, found.results, [p.rememberable for p in plans], asked_at)
        return decided if gate is None else gate.joined(decided)

    @staticmethod
    def _record(policy: Policy, call: Call, ops: Sequence[CounterOp]) -> CallRecord:
        """Where the call is recorded if allowed. The record must outlive every lease and
        reservation it lists, or a late settle could not release them (a rule's own
        lease_timeout may exceed call_ttl)."""
        held = [op.window_ms for op in ops if op.kind in HOLDING]
        return CallRecord(
            record_key(call.call_id),
            call.call_id,
            fingerprint(call),
            max([policy.call_ttl_ms, *held]),
            named=call.named,
        )

    def _counted(
        self,
        policy: Policy,
        call: Call,
        plans: Sequence[_Plan],
        ops: Sequence[CounterOp],
        found: Evaluation,
    ) -> Decision:
        """The counters' decision from the store's answer (a conflict is raised)."""
        if found.conflict:
            raise CallIdConflict(
                f"call_id {call.call_id!r} was already used for another call (a different "
                "user, tool, session, team, cost, metadata, approval or args)"
            )
        if found.settled:
            raise CallIdConflict(
                f"call_id {call.call_id!r} was already settled: a finished call is not "
                "checked again; send a new call_id"
            )
        if found.replayed and not found.results:  # the policy changed since: allowed, once
            return Decision("allow", call.call_id, approved=call.approved, replayed=True)
        return self._decide(policy, call, plans, ops, found.results, found.replayed)

    def _known_refusal(
        self, policy: Policy, call: Call, plans: Sequence[_Plan], ops: list[CounterOp]
    ) -> Decision | None:
        """A refusal this daemon still remembers (refusals.py): answered without the store."""
        found = self.refusals.refusals(ops, [plan.rememberable for plan in plans])
        if not found:
            return None
        self.refusals.hits += 1
        return self._decide(
            policy,
            call,
            [plans[i] for i, _ in found],
            [ops[i] for i, _ in found],
            [result for _, result in found],
            replayed=False,
        )

    async def _asked(self, policy: Policy, call: Call, gate: AccessGate) -> Decision:
        """An access rule asks: the counters are read, not consumed, so that a call they
        would refuse anyway is denied now rather than approved and then refused."""
        plans = self._plans(policy, gate.counted)
        ops = [self._op(policy, plan, call) for plan in plans]
        try:
            found = await self.store.evaluate(ops, dry_run=True)
        except StoreError:
            return gate.decision(call)  # the question stands; the counters decide later
        counted = self._decide(policy, call, plans, ops, found.results, replayed=False)
        return gate.joined(counted)

    async def settle(
        self,
        call_id: str,
        cost: float | None = None,
        may_settle: Callable[[str], bool] | None = None,
        result_digest: str | None = None,
        usage: ModelUsage | None = None,
    ) -> Settlement:
        """Charge the call's actual cost (default: its estimate) and release its slots, once.

        A model call's `usage` is priced with the model its check named (docs/budgets.md)
        and its tokens added to its token rates; with no price known (a reload took it
        away), its reservation is charged. `usage` on a tool call raises NotAModelCall.

        `result_digest` (arguments.result_digest of what the tool returned) is what loop
        rules keyed on results compare (docs/policy.md, loops): a result other than the
        last one restarts their count; None counts the call as an identical one.

        `may_settle(user)` says whether the caller may settle a call of that user (None:
        any); a call it may not settle is "unknown", as if it did not exist, and the store
        settles only the record read here (its fingerprint), in one atomic step.
        """
        key = record_key(call_id)
        local = self.local
        try:
            found = await self.store.read_holds(key)
        except StoreError:
            if not local.knows(key):
                raise
            found = None
        if found is not None:
            return await self._settled_in(
                self.store, key, call_id, cost, may_settle, found, result_digest, usage
            )
        if local.used:  # a call decided while the store was down is settled where counted
            found = await local.read_holds(key)
            if found is not None:
                return await self._settled_in(
                    local, key, call_id, cost, may_settle, found, result_digest, usage
                )
        return Settlement(call_id, "unknown")

    async def _settled_in(
        self,
        store: Counters,
        key: str,
        call_id: str,
        cost: float | None,
        may_settle: Callable[[str], bool] | None,
        found: Recorded,
        result_digest: str | None,
        usage: ModelUsage | None = None,
    ) -> Settlement:
        """Settle the call recorded as `found` in `store` (the real one, or the local count)."""
        if may_settle is not None and not may_settle(owner_of(found.fingerprint)):
            return Settlement(call_id, "unknown")
        owner = owner_of(found.fingerprint)
        model = model_of(found.fingerprint)
        actual = None if cost is None else to_micros(cost)
        tokens = None
        if usage is not None:
            if model is None:
                raise NotAModelCall(
                    f"call {call_id!r} is a tool call: a settle's usage is a model call's"
                )
            actual, tokens = self.policy.usage_cost(model, usage), usage.tokens
        holds = [self._with_rule(h, owner, tokens or 0) for h in found.holds]
        status, charged = await store.settle(
            key, call_id, actual, holds, found.fingerprint, result_digest, model is not None
        )
        if status is SettleStatus.UNKNOWN:
            return Settlement(call_id, "unknown")
        if status is SettleStatus.ALREADY_SETTLED:
            return Settlement(call_id, "already_settled")
        return Settlement(
            call_id,
            "settled",
            {
                h.rule: c / MICROS
                for h, c in zip(holds, charged, strict=True)
                if h.kind is Kind.BUDGET
            },
            model=model,
            tokens=tokens,
            usage=usage,
        )

    async def reset(self, user: str | None = None, rule: str | None = None) -> int:
        """Delete the counters of `user` (every rule) and/or `rule` (every scope)."""
        if user is None and rule is None:
            raise ValueError("name a user, a rule, or both")
        self.refusals.clear()
        patterns = reset_patterns(user, rule)
        deleted = sum([await self.store.reset(pattern) for pattern in patterns])
        for pattern in patterns:  # and what this process counted while the store was down
            await self.local.reset(pattern)
        return deleted

    async def usage(
        self,
        user: str,
        tool: str | None = None,
        session: str | None = None,
        team: str | None = None,
    ) -> list[Usage]:
        """Every counter of `user` that the given parts identify, read without consuming."""
        policy = self.policy
        applied = policy.for_usage(user, tool, session, team)
        probe = Call(user=user, tool=tool or "", call_id="", session=session, team=team)
        # Counted rules are read from the store; access rules are listed as they stand.
        bounded = [a for a in applied if not isinstance(a.limit, Unlimited | AccessLimit)]
        plans = [_Plan.of(a) for a in bounded]  # for_usage's Applied are new each time
        found = await self.store.evaluate(
            [self._op(policy, plan, probe) for plan in plans], dry_run=True
        )
        by_rule = dict(zip((a.rule.name for a in bounded), found.results, strict=True))
        return [_usage(a, probe, by_rule.get(a.rule.name)) for a in applied]

    def _plans(self, policy: Policy, applied: Sequence[Applied]) -> list[_Plan]:
        """Each applied rule's plan, made on its first call under this policy."""
        if self._plans_policy is not policy:  # a reload: the old plans go with the old policy
            self._plans_policy, self._plan_of = policy, {}
            self.refusals.clear()  # and what the old limits refused
            self._keyed_on_results = any(
                isinstance(rule.limit, RateLimit) and rule.limit.same_result
                for rule in policy.rules
            )
        plan_of = self._plan_of
        # By identity: a policy shares one Applied per distinct rule and limit, for its life.
        return [plan_of.get(id(a)) or self._new_plan(a) for a in applied]

    def _new_plan(self, applied: Applied) -> _Plan:
        plan = self._plan_of[id(applied)] = _Plan.of(applied)
        return plan

    def _op(self, policy: Policy, plan: _Plan, call: Call) -> CounterOp:
        role = plan.approved_role if call.approved else plan.role
        key = plan.keys.for_call(call)
        budget = plan.shape.budget
        if budget is None:
            return CounterOp(
                key, plan.kind, role, plan.limit, plan.window_ms, plan.burst, rule=plan.holder
            )
        bounds = policy.period(budget.budget.period, self.clock.now_ms())
        if call.kind == CallKind.MODEL:  # its most: a call without a price was refused
            cost = policy.most_cost(call) or 0
        else:
            cost = to_micros(call.cost if call.cost is not None else policy.cost_for(call.tool))
        return CounterOp(
            key,
            Kind.BUDGET,
            role,
            plan.limit,
            policy.reservation_ttl_ms,
            cost=cost,
            period=(bounds.start, bounds.end, bounds.next_end),
            rule=plan.holder,
        )

    def budget_period(self, rule_name: str) -> tuple[int, int, int]:
        """The current period of the budget rule `rule_name` in force (start, end, next
        end), as a settle of its hold would pass it; zeros when no such budget rule is in
        force (the counter keeps its own period). For the budget sweep."""
        rule = self.policy.rule_named(rule_name)
        if rule is None or not isinstance(rule.limit, BudgetLimit):
            return (0, 0, 0)
        bounds = self.policy.period(rule.limit.budget.period, self.clock.now_ms())
        return (bounds.start, bounds.end, bounds.next_end)

    def _with_rule(self, hold: Hold, user: str, tokens: int = 0) -> Hold:
        """A hold with what its rule in force says: a budget's current period (so a settle
        rolls periods over too); a loop hold's limit, window and burst for `user` (whose
        call it is: an override's limit counts); a token rate's limit and window, and the
        `tokens` its settle adds. A rule gone or changed leaves zeros: a budget keeps the
        counter's period, a loop and a token rate are left alone."""
        rule = self.policy.rule_named(hold.rule)
        if hold.kind is Kind.TOKENS:
            mine = None if rule is None else self.policy.limit_for(rule, user)
            if not isinstance(mine, RateLimit) or not mine.rate.tokens:
                return replace(hold, estimate=0)
            return replace(hold, estimate=tokens, period=(mine.limit, mine.rate.window_ms, 0))
        if rule is None:
            return hold
        if hold.loop:
            mine = self.policy.limit_for(rule, user)
            if not isinstance(mine, RateLimit) or not mine.same_result:
                return hold
            if KIND_OF[mine.algorithm] is not hold.kind:
                return hold  # a reload changed its algorithm: another counter now
            numbers = (mine.limit, mine.rate.window_ms, mine.burst or mine.limit)
            return replace(hold, period=numbers)
        limit = rule.limit
        if hold.kind is not Kind.BUDGET or not isinstance(limit, BudgetLimit):
            return hold  # period (0, 0, 0): keep whatever period the counter is in
        bounds = self.policy.period(limit.budget.period, self.clock.now_ms())
        return Hold(
            hold.kind,
            hold.key,
            hold.estimate,
            hold.rule,
            (bounds.start, bounds.end, bounds.next_end),
        )

    def _decide(
        self,
        policy: Policy,
        call: Call,
        plans: Sequence[_Plan],
        ops: Sequence[CounterOp],
        results: Sequence[OpResult],
        replayed: bool,
    ) -> Decision:
        violations: list[Verdict] = []
        shadow: list[Verdict] = []
        approvals: list[Verdict] = []  # `ask` rules an approved call goes past
        soft: list[str] = []  # budgets past their soft limit: flagged on allowed calls
        limits = []
        for plan, op, result in zip(plans, ops, results, strict=True):
            found = verdict(policy, plan.applied, plan.shape, call, result)
            limits.append(found)
            if found.soft_limited:
                label = plan.applied.rule.label or policy.label_for(call.tool)
                soft.append(soft_limit_warning(found, label))
            if result.admitted:
                continue
            if op.role is Role.SHADOW:
                shadow.append(found)
            elif op.role is Role.FORCED:
                approvals.append(found)
            else:
                violations.append(found)
        notes = [APPROVED_PAST.format(rule=v.rule, message=v.message) for v in approvals]
        decided = Decision(
            "allow",
            call.call_id,
            shadow=tuple(shadow),
            approvals=tuple(approvals),
            limits=tuple(limits),
            warnings=(*soft, *notes),
            approved=call.approved,
            replayed=replayed,
            send_result=self._keyed_on_results and _sends_result(plans, ops, results),
        )
        if not violations or replayed:  # only allowed calls are recorded, so a replay allows
            return decided
        denials = [v for v in violations if v.on_exceed == OnExceed.DENY]
        first = binding(denials or violations)
        return replace(
            decided,
            decision="deny" if denials else "ask",
            message=first.message,
            retry_after=first.retry_after,
            violations=tuple(violations),
            warnings=tuple(notes),  # what the approval would have let past; nothing was
            approved=False,  # consumed, so metrics and the audit look at the refusal only
            send_result=False,  # refused: nothing was counted, nothing to settle
        )

    def _unavailable(
        self,
        policy: Policy,
        call: Call,
        plans: Sequence[_Plan],
        ops: Sequence[CounterOp],
        record: CallRecord,
        error: StoreError,
    ) -> Decision:
        """The store did not answer: each enforcing rule's `fail` mode decides. A rule
        that fails closed refuses; those that fail open are counted in this process
        (fallback.py), so they admit at most their limits, not every call."""
        # An open circuit refuses every call at once and was logged when it opened.
        quiet = isinstance(error, CircuitOpenError)
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "store unavailable, deciding by fail mode: %s",
            error,
        )
        default = self.fail or policy.defaults["fail"]
        enforcing = [
            (plan, op)
            for plan, op in zip(plans, ops, strict=True)
            if plan.applied.rule.mode is Mode.ENFORCE
        ]
        closed = [plan for plan, _ in enforcing if (plan.applied.rule.fail or default) == "closed"]
        if closed:  # refused before anything is counted: nothing to give back
            return self._paused(policy, call, closed[0])
        if not enforcing:  # shadow rules only: they never refuse
            return Decision("allow", call.call_id, degraded=True, approved=call.approved)
        counted = [plan for plan, _ in enforcing]
        local_ops = [op for _, op in enforcing]
        # A record only for calls whose settle reaches a counter (a slot, money, a loop
        # rule keyed on results).
        holding = any(op.rule for op in local_ops)
        found = self.local.decide(local_ops, record if holding else None)
        if found is None:  # no room left for another counter: refuse rather than guess
            return self._paused(policy, call, counted[0])
        decided = self._counted(policy, call, counted, local_ops, found)
        return replace(decided, degraded=True)

    @staticmethod
    def _paused(policy: Policy, call: Call, plan: _Plan) -> Decision:
        """A refusal because the store cannot be asked (the rule's UNAVAILABLE message)."""
        rule = plan.applied.rule
        label = rule.label or policy.label_for(call.tool)
        message = default_template(UNAVAILABLE).render({"label": label}, None)
        refusal = Verdict(rule.name, UNAVAILABLE, False, 0, 0, None, 0.0, message)
        return Decision("deny", call.call_id, message, None, (refusal,), degraded=True)


def _answered_first(
    policy: Policy, call: Call, applied: Sequence[Applied]
) -> tuple[Decision | None, AccessGate | None]:
    """A refusal before any counter is asked (a model call nothing prices, an access
    rule's answer, or an access gate leaving nothing to count), and the call's access
    gate (None: the policy has no access rules)."""
    if call.kind == CallKind.MODEL and (unpriced := _unpriced(policy, call, applied)):
        return unpriced, None
    gate = AccessGate.of(policy, applied, call) if policy.has_access_rules else None
    if gate is not None and (gate.refused or not gate.counted):  # nothing to ask or take
        return gate.decision(call), gate
    return None, gate


def _unpriced(policy: Policy, call: Call, applied: Sequence[Applied]) -> Decision | None:
    """A refusal of a model call that a budget would price, when nothing knows its price
    (docs/budgets.md, "Prices"); None when it has one, or no budget needs it."""
    budgets = [a for a in applied if isinstance(a.limit, BudgetLimit)]
    if not budgets or policy.prices.of(call.tool) is not None:
        return None
    rule, limit = budgets[0].rule, budgets[0].limit
    assert isinstance(limit, BudgetLimit)
    message = default_template(NO_PRICE).render({"tool": call.tool}, None)
    refusal = Verdict(
        rule.name, rule.kind, False, limit.budget.amount, 0, None, 0.0, message,
        currency=limit.currency, period=limit.budget.period, scope=scope_of(rule, call),
    )  # fmt: skip
    return Decision("deny", call.call_id, message, None, (refusal,))


def _sends_result(
    plans: Sequence[_Plan], ops: Sequence[CounterOp], results: Sequence[OpResult]
) -> bool:
    """Whether a loop rule keyed on results counted the call (if it is allowed): its
    settle must then bring the result's digest."""
    return any(
        plan.same_result and op.consumes(result.admitted)
        for plan, op, result in zip(plans, ops, results, strict=True)
    )


def _usage(applied: Applied, call: Call, result: OpResult | None) -> Usage:
    rule, limit = applied.rule, applied.limit
    found = Usage(
        rule=rule.name,
        kind=rule.kind,
        algorithm=rule.algorithm,
        mode=rule.mode.value,
        limit=None,
        used=0,
        remaining=None,
        reset_after=0.0,
        scope={dim: call.dimension(dim) for dim in rule.per},
    )
    if isinstance(limit, AccessLimit):
        return replace(found, limit=0, remaining=0)  # every call it covers is refused
    if isinstance(limit, Unlimited) or result is None:
        return found
    found = replace(
        found,
        used=result.used,
        remaining=result.remaining,
        reset_after=result.reset_after_ms / 1000,
    )
    if isinstance(limit, BudgetLimit):
        return replace(
            found,
            limit=limit.budget.amount,
            used=result.used / MICROS,
            remaining=result.remaining / MICROS,
            reserved=result.reserved / MICROS,
            currency=limit.currency,
            period=limit.budget.period,
        )
    if isinstance(limit, RateLimit):
        return replace(found, limit=limit.limit, window=limit.rate.window)
    return replace(found, limit=limit.slots)
