"""Notifications: a webhook is told before the money runs out, and of a user refused
again and again (docs/observability.md, "Notifications").

Three events:

- `budget.soft_limit`: an allowed call left a budget past its soft limit;
- `budget.exhausted`: a budget rule refused a call for lack of money (what is left cannot
  pay for it), enforcing or asking;
- `refusals.repeated`: one user was refused (denied) by one rule more than N times within
  a window (the policy's `notifications.repeated_refusals`).

Nothing of it is on a decision's path. `Observer.checked` hands over only a decision
with a refusal or a warning (an allowed call past a soft limit warns), and `decided`
puts a note in a bounded dict, a dict operation or two: no store, no clock read for a
refusal, no I/O. A note already waiting for the same event, rule and caller is not
added again; a refusal adds one to its (rule, user) count. When the dicts hold
`queue_size` entries a new one is dropped and counted
(`ratewarden_notifications_total{outcome="dropped"}`).

A worker does the rest, off the path. Idle, it waits on a future that the first note
ends (no timer: a daemon with nothing to tell runs nothing); then it lets TICK_S of
notes gather, and takes them all:

- a budget event is sent once per event, rule, scope (the rule's `per` values) and
  budget period, by whichever daemon takes the claim (store `claim`, `SET NX PX` until the
  period ends); the others count a `duplicate`;
- refusals are counted across the fleet in fixed windows (store `tally`, one pipelined
  round trip per tick for every (rule, user) refused in it); the tick whose count goes
  from N or less to more than N takes the claim and sends, once per rule, user and window.

Each won claim becomes one body per webhook that wants the event, put on a bounded
outbox (full: dropped and counted); SENDERS tasks post them (service/webhooks.py:
signed, retried with backoff). A receiver that hangs holds a sender for its timeout and
retries; the outbox stays bounded and decisions never wait for it. A daemon that stops
loses what it has not sent yet: notifications are a best effort, the metrics are not.

The webhooks are the policy's (`notifications.webhooks`, the variables they name read
when the section changes: a reload applies at once) and one more from the settings
(RATEWARDEN_WEBHOOK_URL, RATEWARDEN_WEBHOOK_SECRET). A body holds names, figures and
times; never a call's arguments (an `args` dimension's digest is written as hidden).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ratewarden.calls import Call
from ratewarden.clock import Clock
from ratewarden.engine import Decision, Verdict
from ratewarden.engine.decision import scope_of
from ratewarden.policy import Policy
from ratewarden.service.audit import new_entry_id
from ratewarden.service.metrics import Metrics
from ratewarden.service.stopping import Stopping
from ratewarden.service.webhooks import Sender, Target
from ratewarden.store import Store, StoreError
from ratewarden.store.keys import NOTICE_SLACK_MS, notice_key, refusal_count_key
from ratewarden.vocabulary import UNAVAILABLE, Dimension, NotifyEvent, RuleKind, shown

log = logging.getLogger("ratewarden.notify")

TICK_S = 0.25  # how often the worker takes the notes (and batches refusal counts)
SENDERS = 4  # posts in flight at once, per process
OUTCOMES = ("sent", "failed", "dropped", "duplicate")
HIDDEN = "(args)"  # what a body says of an `args` dimension's value
_SEEN_CAP = 10_000  # claims this process remembers taking or losing, to ask the store less
_STOP_WAIT_S = 2.0

SOFT, EXHAUSTED, REPEATED = (
    NotifyEvent.SOFT_LIMIT.value,
    NotifyEvent.EXHAUSTED.value,
    NotifyEvent.REPEATED_REFUSALS.value,
)


@dataclass(frozen=True, slots=True)
class _Note:
    """A budget event waiting for the worker: the verdict, the call, the policy, when."""

    event: str
    verdict: Verdict
    call: Call
    policy: Policy
    at_ms: int


class _Refused:
    """One (rule, user)'s refusals since the last tick, and the last call's tool and team."""

    __slots__ = ("count", "team", "tool")

    def __init__(self, tool: str, team: str | None) -> None:
        self.count, self.tool, self.team = 1, tool, team


class Notifier:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        clock: Clock,
        *,
        queue_size: int = 1000,
        sender: Sender,
        extra: Target | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.queue_size = queue_size
        self.sender = sender
        self.extra = extra  # the settings' webhook, of every event
        self.environ = environ
        self._spec: object = None  # the policy file whose section is in force
        self.targets: tuple[Target, ...] = ()
        self._wants: frozenset[str] = frozenset()
        self._notes: dict[tuple[str, str, str, str | None, str | None, str], _Note] = {}
        self._refused: dict[tuple[str, str], _Refused] = {}
        self._refusal_policy: Policy | None = None
        self._seen: OrderedDict[str, int] = OrderedDict()  # claim key -> until (ms)
        self._outbox: asyncio.Queue[tuple[Target, str, str, bytes]] = asyncio.Queue(queue_size)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = Stopping()
        # The idle worker's wait: set by the first note after a flush (or by `stop`), so
        # a daemon with nothing to tell runs nothing, not even a timer.
        self._idle: asyncio.Future[None] | None = None
        for event in NotifyEvent:  # every series exists from the start
            for outcome in OUTCOMES:
                metrics.notifications.labels(event.value, outcome)

    # -- on a decision's path: dict operations only ------------------------------------

    def decided(self, decision: Decision, call: Call, policy: Policy) -> None:
        """Note what `decision` (one with a refusal or a warning) has to tell."""
        if policy.spec is not self._spec:  # another file (a reload): read its section
            self.configure(policy)
        wants = self._wants
        if not wants or decision.replayed:
            return
        if decision.allowed:
            if SOFT in wants:
                for verdict in decision.limits:
                    if verdict.soft_limited:
                        self._note(SOFT, verdict, call, policy)
            return
        denied = decision.decision == "deny"
        for verdict in decision.violations:
            if verdict.kind == RuleKind.BUDGET and EXHAUSTED in wants:
                self._note(EXHAUSTED, verdict, call, policy)
            if denied and REPEATED in wants and verdict.kind != UNAVAILABLE:
                self._count_refusal(verdict.rule, call, policy)

    def _note(self, event: str, verdict: Verdict, call: Call, policy: Policy) -> None:
        key = (event, verdict.rule, call.user, call.team, call.session, call.tool)
        if key in self._notes:
            return  # one is waiting already: the worker sends at most one anyway
        if self._full():
            self._count(event, "dropped")
            return
        self._notes[key] = _Note(event, verdict, call, policy, self.clock.now_ms())
        self._wake()

    def _count_refusal(self, rule: str, call: Call, policy: Policy) -> None:
        found = self._refused.get((rule, call.user))
        if found is not None:
            found.count += 1
            found.tool, found.team = call.tool, call.team
            return
        if self._full():
            self._count(REPEATED, "dropped")
            return
        self._refused[(rule, call.user)] = _Refused(call.tool, call.team)
        self._refusal_policy = policy
        self._wake()

    def _wake(self) -> None:
        """End the idle worker's wait (the first note since its last flush)."""
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    def _full(self) -> bool:
        return len(self._notes) + len(self._refused) >= self.queue_size

    def configure(self, policy: Policy) -> None:
        """Read the webhooks of `policy`'s section (and their variables) and the settings'."""
        section = policy.notifications
        self._spec = policy.spec
        targets = [self.extra] if self.extra is not None else []
        for n, hook in enumerate(section.webhooks):
            url = hook.url or self.environ.get(hook.url_env or "", "")
            if not url:
                log.warning(
                    "notifications.webhooks[%d]: $%s is not set: that webhook is skipped",
                    n,
                    hook.url_env,
                )
                continue
            secret = self.environ.get(hook.secret_env) if hook.secret_env else None
            if hook.secret_env and not secret:
                log.warning(
                    "notifications.webhooks[%d]: $%s is not set: its posts go unsigned",
                    n,
                    hook.secret_env,
                )
            targets.append(Target(url, secret.encode() if secret else None, hook.events))
        self.targets = tuple(targets)
        self._wants = frozenset().union(*(t.events for t in self.targets))

    # -- the worker ------------------------------------------------------------------

    def start(self) -> None:
        self._stopping = Stopping()
        # Made on the loop that runs it (a queue is bound to the first loop it waits on).
        self._outbox = asyncio.Queue(self.queue_size)
        self._tasks = [asyncio.create_task(self._tick_forever(), name="ratewarden-notify")]
        self._tasks += [
            asyncio.create_task(self._send_forever(), name=f"ratewarden-notify-send-{n}")
            for n in range(SENDERS)
        ]

    async def stop(self) -> None:
        """Let the tick under way finish (its store calls have their deadline), then
        stop the senders: a post in flight is abandoned."""
        self._stopping.set()
        self._wake()
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(self._tasks[:1], timeout=_STOP_WAIT_S)
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks = []
        await self.sender.close()

    async def _tick_forever(self) -> None:
        while not self._stopping.is_set():
            if not self._notes and not self._refused:
                self._idle = asyncio.get_running_loop().create_future()
                await self._idle  # until something is noted: no timer while idle
            # then a tick's worth of notes and refusals, sent or counted together
            await self._stopping.nap(TICK_S)  # a timer, not wait_for's task (stopping.py)
            try:
                await self.flush()
            except Exception:  # the worker must outlive any surprise
                log.exception("notifications: unexpected error; still running")

    async def flush(self) -> None:
        """Take every note and refusal count, and send what is due (tests call it)."""
        if not self._notes and not self._refused:
            return  # most ticks: nothing noted, nothing to read, not even the clock
        notes, self._notes = self._notes, {}
        refused, self._refused = self._refused, {}
        now = self.clock.now_ms()
        for note in notes.values():
            await self._budget_event(note, now)
        if refused and self._refusal_policy is not None:
            await self._repeated(refused, self._refusal_policy, now)

    async def _budget_event(self, note: _Note, now: int) -> None:
        verdict, policy = note.verdict, note.policy
        rule = policy.rule_named(verdict.rule)
        if rule is None or verdict.period is None:
            return  # the rule is gone (a reload): nothing to say of it
        scope = verdict.scope if verdict.scope is not None else scope_of(rule, note.call)
        bounds = policy.period(verdict.period, note.at_ms)
        key = notice_key(note.event, rule.name, scope.items(), bounds.start)
        if not await self._claimed(key, note.event, bounds.end + NOTICE_SLACK_MS, now):
            return
        body = {
            **_head(note.event, now, note.call.user, note.call.team, note.call.tool),
            "text": _budget_text(note.event, verdict, scope, note.call, bounds.end),
            "rule": rule.name,
            "scope": _shown_scope(scope),
            "limit": verdict.limit,
            "spent": verdict.spent,
            "reserved": verdict.reserved,
            "currency": verdict.currency,
            "period": verdict.period,
            "period_start": _iso(bounds.start),
            "period_end": _iso(bounds.end),
        }
        self._post(note.event, body)

    async def _repeated(
        self, refused: dict[tuple[str, str], _Refused], policy: Policy, now: int
    ) -> None:
        section = policy.notifications
        window = section.refusals_window_ms
        start = now - now % window
        until = start + window + NOTICE_SLACK_MS
        items = list(refused.items())
        counts = [
            (refusal_count_key(r, u, start), found.count, until - now) for (r, u), found in items
        ]
        try:
            totals = await self.store.tally(counts)
        except StoreError as exc:
            self._store_failed(REPEATED, exc)
            return
        for ((rule, user), found), total in zip(items, totals, strict=True):
            before = total - found.count
            if not before <= section.refusals_over < total:
                continue  # not the tick that crossed N (here or on another daemon)
            key = notice_key(REPEATED, rule, [(Dimension.USER.value, user)], start)
            if not await self._claimed(key, REPEATED, until, now):
                continue
            body = {
                **_head(REPEATED, now, user, found.team, found.tool),
                "text": _refusals_text(rule, user, total, section.refusals_over, window),
                "rule": rule,
                "scope": {"user": user},
                "count": total,
                "more_than": section.refusals_over,
                "window": _duration(window),
                "window_start": _iso(start),
                "window_end": _iso(start + window),
            }
            self._post(REPEATED, body)

    async def _claimed(self, key: str, event: str, until: int, now: int) -> bool:
        """Whether this process takes the claim `key` (held until `until`): the one that
        does sends. A claim this process took or lost before is not asked again."""
        seen = self._seen
        if seen.get(key, 0) > now:
            return False
        try:
            won = await self.store.claim(key, until - now)
        except StoreError as exc:
            self._store_failed(event, exc)
            return False
        seen[key] = until
        seen.move_to_end(key)
        while len(seen) > _SEEN_CAP:
            seen.popitem(last=False)
        if not won:
            self._count(event, "duplicate")
        return won

    def _post(self, event: str, body: dict[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        for target in self.targets:
            if event not in target.events:
                continue
            try:
                self._outbox.put_nowait((target, event, body["id"], data.encode()))
            except asyncio.QueueFull:
                self._count(event, "dropped")

    async def _send_forever(self) -> None:
        while True:
            target, event, delivery, body = await self._outbox.get()
            try:
                sent = await self.sender.deliver(target, event, delivery, body)
            except Exception:
                log.exception("notification %s: unexpected error", delivery)
                sent = False
            self._count(event, "sent" if sent else "failed")

    def _store_failed(self, event: str, exc: StoreError) -> None:
        log.warning("notification (%s) not sent: the store did not answer: %s", event, exc)
        self._count(event, "failed")

    def _count(self, event: str, outcome: str) -> None:
        self.metrics.series(self.metrics.notifications, event, outcome).inc()


# -- the bodies ---------------------------------------------------------------------


def _head(event: str, now: int, user: str, team: str | None, tool: str) -> dict[str, Any]:
    return {
        "id": new_entry_id(),  # as an audit line's: 32 random hex digits
        "event": event,
        "time": _iso(now),
        "user": user,
        "team": team,
        "tool": tool,
    }


def _iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms // 1000}s"


def _shown_scope(scope: Mapping[str, str | None]) -> dict[str, str | None]:
    """The scope, an `args` dimension's digest hidden (never the arguments, nor a hash a
    short value could be guessed from)."""
    return {
        dim: HIDDEN if dim.startswith(Dimension.ARGS) and value is not None else value
        for dim, value in scope.items()
    }


def _said(value: object) -> str:
    """A name as a chat message may show it: invisible characters escaped, and Slack's
    markup characters as its entities, so a user called `<!channel>` pings nobody."""
    text = shown(value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _scope_text(scope: Mapping[str, str | None]) -> str:
    shown_scope = _shown_scope(scope)
    if not shown_scope:
        return "everyone"
    return ", ".join(f"{dim} {_said(value or '-')}" for dim, value in shown_scope.items())


def _money(amount: float | None) -> str:
    return f"{amount or 0:.2f}"


def _budget_text(
    event: str, verdict: Verdict, scope: Mapping[str, str | None], call: Call, end: int
) -> str:
    rule, currency, period = _said(verdict.rule), verdict.currency or "", verdict.period
    held = (verdict.spent or 0) + (verdict.reserved or 0)
    if event == SOFT:
        share = 100 * held / float(verdict.limit) if verdict.limit else 100.0
        return (
            f"Budget {rule} for {_scope_text(scope)} has passed its soft limit: "
            f"{_money(held)} of {_money(verdict.limit)} {currency} used this {period} "
            f"({share:.0f}%). It resets at {_iso(end)}."
        )
    return (
        f"Budget {rule} for {_scope_text(scope)} is exhausted: {_money(held)} of "
        f"{_money(verdict.limit)} {currency} used this {period}; a call of "
        f"{_said(call.user)} to {_said(call.tool)} was refused. It resets at {_iso(end)}."
    )


def _refusals_text(rule: str, user: str, count: int, over: int, window_ms: int) -> str:
    return (
        f"User {_said(user)} was refused by rule {_said(rule)} {count} times within "
        f"{_duration(window_ms)} (more than {over})."
    )
