"""Runtime overrides: one user's (or group's) limit changed now, without editing the file.

`POST /v1/admin/overrides` stores an override in the store (every daemon on it applies
it), `GET` lists them with who set them and when, `DELETE /v1/admin/overrides/{id}`
removes one. The vocabulary is the file's `overrides` (`rate`, `budget`, `concurrency`,
`burst`, `unlimited: true`), plus an expiry (`ttl` or `until`) and a `reason`.

How a change reaches every daemon without a store read per call: each process polls the
store's overrides version once a second (service/fleet.py, with the rest of its poll,
then `RuntimeOverrides.refresh`); when it moved, or
an override expired, the daemon reads them all and compiles its policy again with them
(`PolicyReloader.use_overrides`), swapped in whole as a reload is. The daemon that took
the change applies it before it answers.

Precedence: runtime overrides go before the file's at each level (exact user, group,
glob), so a runtime override for a user beats the file's for that user, and a file's
override for a user still beats a runtime one for their group. One that no longer fits
the file (its rule was removed) is kept, listed as idle, and left out of the policy.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from ratewarden.clock import Clock, SystemClock
from ratewarden.policy.durations import parse_duration
from ratewarden.policy.schema import OverrideSpec
from ratewarden.service.audit import admin_change
from ratewarden.service.auth import admin_name
from ratewarden.service.errors import error_response
from ratewarden.service.metrics import Metrics
from ratewarden.service.reload import PolicyReloader
from ratewarden.service.routes import BODY_ERRORS, ERRORS
from ratewarden.store.base import Store, StoreError
from ratewarden.wire.bodies import (
    ErrorResponse,
    FieldError,
    Override,
    OverrideLimit,
    OverrideRemoved,
    OverrideRequest,
    OverridesResponse,
)

__all__ = ["POLL_S", "RuntimeOverrides", "router"]
log = logging.getLogger("ratewarden.overrides")
T = TypeVar("T")

POLL_S = 1.0  # how often each process polls the store (service/fleet.py)
MAX_OVERRIDES = 1000  # stored at once: each is compiled into every daemon's policy
MAX_TTL = timedelta(days=366)


class RuntimeOverrides:
    """This process's view of the store's overrides, kept applied to its policy.

    It talks to the bare store, each operation within `timeout_s`: the once-a-second poll
    (service/fleet.py) is housekeeping, kept out of the decisions' store metrics and
    circuit breaker (a poll failing during an outage must not change how soon decisions
    go back to the store)."""

    def __init__(
        self,
        store: Store,
        reloader: PolicyReloader,
        metrics: Metrics,
        clock: Clock | None = None,
        timeout_s: float = 1.0,
    ) -> None:
        self.store = _Deadlined(store, timeout_s)
        self.reloader, self.metrics = reloader, metrics
        self.clock = clock or SystemClock()
        self.version = -1  # of the overrides applied (-1: none read yet)
        self.overrides: dict[str, Override] = {}
        self._unusable: dict[str, str] = {}  # stored ones the file's checks refuse: id -> why
        self._read: dict[str, _Stored] = {}  # what the store held at the last read, parsed
        self._expired: list[str] = []  # stored but expired: dropped by the next write
        self._next_expiry: datetime | None = None
        self._lock = asyncio.Lock()

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now_ms() / 1000, UTC)

    # -- keeping the policy up to date ------------------------------------------------------

    async def refresh(self, version: int | None = None) -> bool:
        """Apply the store's overrides if they changed (or one expired); True if applied.
        `version`: the store's, read by the caller (the fleet's poll reads it)."""
        async with self._lock:
            if version is None:
                version = await self.store.overrides_version()
            expired = self._next_expiry is not None and self._next_expiry <= self.now()
            if version == self.version and not expired:
                return False
            version, documents = await self.store.read_overrides(self._read.keys())
            await self._apply(version, documents)
            return True

    async def _apply(self, version: int, documents: dict[str, str | None]) -> None:
        """Apply what the store holds. Each document is parsed once (an id is never given
        to another override), and the reloader compiles only the overrides it has not
        compiled: a change costs what it changes, whatever else is in force."""
        now = self.now()
        read = {i: self._read_one(i, document) for i, document in documents.items()}
        live = {i: r.override for i, r in read.items() if r.override and r.live(now)}
        # Newest first: of two runtime overrides for one user and rule, the later one wins.
        newest_first = sorted(live, key=lambda i: live[i].set_at, reverse=True)
        specs = [(i, spec) for i in newest_first if (spec := read[i].spec) is not None]
        await self.reloader.use_overrides(specs)
        self._read, self.version, self.overrides = read, version, live
        self._unusable = {i: why for i in live if (why := read[i].why) is not None}
        self._expired = [i for i, r in read.items() if r.override and i not in live]
        self._next_expiry = min(filter(None, (o.expires_at for o in live.values())), default=None)
        log.info("runtime overrides: version %d, %d in force", version, len(live))

    def _read_one(self, override_id: str, document: str | None) -> _Stored:
        if document is None:  # one this daemon read before (store.read_overrides)
            return self._read[override_id]
        return _Stored.parse(override_id, document)

    def listed(self) -> list[Override]:
        """The overrides in force, newest first, each saying whether the policy in force
        applies it (a reload of the file may have removed its rule since)."""
        newest_first = sorted(self.overrides.values(), key=lambda o: o.set_at, reverse=True)
        return [self._shown(o) for o in newest_first]

    def _shown(self, override: Override) -> Override:
        why = self.reloader.engine.policy.idle_overrides.get(override.id)
        why = why or self._unusable.get(override.id)
        return override.model_copy(update={"active": why is None, "idle": why})

    # -- changes ----------------------------------------------------------------------------

    async def add(self, request: OverrideRequest, set_by: str) -> Override:
        """Store a new override and apply it here; OverrideRefused (field, message) if it
        cannot apply to the policy in force or `MAX_OVERRIDES` are stored already (the
        store counts and writes in one step, so racing daemons cannot pass the cap)."""
        now = self.now()
        override = Override(
            id=f"ovr_{secrets.token_hex(6)}",
            **request.model_dump(include=set(OverrideLimit.model_fields)),
            expires_at=_expiry(request, now),
            reason=request.reason,
            set_by=set_by,
            set_at=now,
        )
        spec = _spec(override)  # the file's own checks of rate and budget texts
        await self.refresh()
        try:
            await self._store_new(override, spec)
            await self.refresh()  # applies it from its trial: not compiled a second time
        finally:
            self.reloader.forget_tried(override.id)
        self.metrics.override_changes.labels("set").inc()
        admin_change("override_set", **_audited(override))
        return self._shown(override)  # this one only: a set costs no copy of them all

    async def _store_new(self, override: Override, spec: OverrideSpec) -> None:
        tried = await self.reloader.try_override(override.id, spec)  # its one compile
        if (why := tried.idle) is not None:
            raise OverrideRefused(_field_of(why), why.partition(": ")[2] or why)
        document = override.model_dump_json(exclude={"active", "idle"})
        stored = await self.store.put_override(override.id, document, MAX_OVERRIDES, self._expired)
        if stored is None:
            raise OverrideRefused("overrides", f"at most {MAX_OVERRIDES} runtime overrides")
        self._read[override.id] = _Stored(document, override, spec)  # not parsed again

    async def remove(self, override_id: str, removed_by: str) -> bool:
        if await self.store.remove_override(override_id) is None:
            return False
        await self.refresh()
        self.metrics.override_changes.labels("remove").inc()
        admin_change("override_removed", id=override_id, by=removed_by, at=self.now().isoformat())
        return True


@dataclass(frozen=True, slots=True)
class _Stored:
    """One document of the store, parsed: the override, its spec for the policy (None if
    the file's checks refuse it: `why`), or neither when it does not parse at all."""

    document: str
    override: Override | None
    spec: OverrideSpec | None = None
    why: str | None = None

    @classmethod
    def parse(cls, override_id: str, document: str) -> _Stored:
        try:
            override = Override.model_validate_json(document)
        except ValidationError:  # written by something else: never let it stop the rest
            log.error("runtime override %s in the store is unreadable; ignored", override_id)
            return cls(document, None)
        try:
            return cls(document, override, _spec(override))
        except OverrideRefused as exc:  # stored by an older or newer daemon: listed idle
            log.error("runtime override %s in the store is refused: %s", override_id, exc)
            return cls(document, override, why=f"{exc.field}: {exc}")

    def live(self, now: datetime) -> bool:
        expires_at = self.override.expires_at if self.override is not None else None
        return expires_at is None or expires_at > now


class _Deadlined:
    """The store's override operations, each answered within `timeout_s` or StoreError."""

    def __init__(self, store: Store, timeout_s: float) -> None:
        self._store, self.timeout_s = store, timeout_s

    async def overrides_version(self) -> int:
        return await self._within(self._store.overrides_version())

    async def read_overrides(self, known: Collection[str]) -> tuple[int, dict[str, str | None]]:
        return await self._within(self._store.read_overrides(known))

    async def put_override(
        self, override_id: str, document: str, cap: int, drop: Sequence[str] = ()
    ) -> int | None:
        return await self._within(self._store.put_override(override_id, document, cap, drop))

    async def remove_override(self, override_id: str) -> int | None:
        return await self._within(self._store.remove_override(override_id))

    async def _within(self, operation: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await operation
        except TimeoutError:
            raise StoreError(f"no answer in {self.timeout_s:g} s") from None


class OverrideRefused(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _spec(override: Override) -> OverrideSpec:
    """The file's override for this one (its checks: rate and budget texts, one limit)."""
    fields = override.model_dump(include=set(OverrideLimit.model_fields))
    try:
        return OverrideSpec.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        message = error["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in error["loc"]) or _whole_field(message)
        raise OverrideRefused(field, message) from None


def _whole_field(message: str) -> str:
    """The field a check of the whole override is about (OverrideSpec's own words)."""
    if "users or groups" in message:
        return "users"
    return "unlimited" if message.startswith("unlimited") else "rate"


def _expiry(request: OverrideRequest, now: datetime) -> datetime | None:
    if request.ttl is not None and request.until is not None:
        raise OverrideRefused("ttl", "give ttl or until, not both")
    if request.until is not None:
        if request.until <= now:
            raise OverrideRefused("until", "must be in the future")
        if request.until - now > MAX_TTL:
            raise OverrideRefused("until", "at most 366 days ahead")
        return request.until.astimezone(UTC)
    if request.ttl is None:
        return None
    try:
        ttl = timedelta(milliseconds=parse_duration(request.ttl))
    except ValueError as exc:
        raise OverrideRefused("ttl", str(exc)) from None
    if ttl > MAX_TTL:
        raise OverrideRefused("ttl", "at most 366 days")
    return now + ttl


def _field_of(why: str) -> str:
    """Which request field an idle reason is about: compile leads it with the field."""
    field, _, _ = why.partition(":")
    return field if field in OverrideLimit.model_fields else "rule"


def _audited(override: Override) -> dict[str, Any]:
    """The audit line's fields: what changed, for whom, by whom, until when, and why."""
    shown = override.model_dump(mode="json", exclude={"active", "idle"}, exclude_none=True)
    shown["by"] = shown.pop("set_by")
    shown["at"] = shown.pop("set_at")
    return shown


# -- routes -----------------------------------------------------------------------------------

router = APIRouter(tags=["admin"])


def overrides_of(app: Any) -> RuntimeOverrides:
    found: RuntimeOverrides = app.state.overrides
    return found


def _who(request: Request) -> str:
    return admin_name(request)  # auth.py: one answer for every admin change


@router.post("/v1/admin/overrides", status_code=201, response_model=Override, responses=BODY_ERRORS)
async def set_override(request: Request, body: OverrideRequest) -> Override | JSONResponse:
    """Change one rule's limit for users or groups now, on every daemon of the store."""
    try:
        return await overrides_of(request.app).add(body, _who(request))
    except OverrideRefused as exc:
        return _refused(exc)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")


@router.get("/v1/admin/overrides", response_model=OverridesResponse, responses=ERRORS)
async def list_overrides(request: Request) -> OverridesResponse | JSONResponse:
    """The runtime overrides in force (expired ones are gone), newest first."""
    overrides = overrides_of(request.app)
    try:
        await overrides.refresh()
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
    return OverridesResponse(overrides=overrides.listed(), version=overrides.version)


OverrideId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


@router.delete(
    "/v1/admin/overrides/{override_id}",
    response_model=OverrideRemoved,
    responses={**ERRORS, 404: {"model": ErrorResponse}},
)
async def remove_override(
    request: Request, override_id: OverrideId
) -> OverrideRemoved | JSONResponse:
    """Remove one runtime override; the rule's limit for its users is the file's again."""
    try:
        removed = await overrides_of(request.app).remove(override_id, _who(request))
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
    if not removed:
        message = f"no runtime override {override_id!r}"
        return error_response(
            404, "unknown_override", message, [FieldError(field="override_id", message=message)]
        )
    return OverrideRemoved(id=override_id, removed=True)


def _refused(exc: OverrideRefused) -> JSONResponse:
    message = f"{exc.field}: {exc}"
    return error_response(
        422, "invalid_override", message, [FieldError(field=exc.field, message=str(exc))]
    )
