"""What was spent: `GET /v1/admin/spend`, per day, budget rule and scope (JSON or CSV).

Nothing here is on the decision path. The counters script keeps, beside each budget
counter, one record per UTC day of what it charged (store/keys.py, "Spend records"):
written by the settle that charges (one GET and one SET more in its script), and by the
load that charges an expired reservation at its estimate. This route only reads them:
SCAN on a pattern built from the filters (every primary of a cluster), the values in
batches, then every record compared with the filters again, exactly. The scan and the
rows are capped (`SCAN_CAP`, `MAX_ROWS`); past either, the answer says `truncated`.

CSV is for chargeback, opened in a spreadsheet: a text cell that a spreadsheet would
take for a formula (it begins with `=`, `+`, `-`, `@`, a tab or a carriage return) is
written with a leading `'` (OWASP's "CSV injection"); amounts are numbers we write.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import date, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from ratewarden.engine import Engine
from ratewarden.limiter.algorithms.budget import DAY_MS
from ratewarden.limiter.script import MAX_SPEND_RETENTION_DAYS
from ratewarden.policy.durations import MICROS
from ratewarden.service.errors import error_response
from ratewarden.store import StoreError
from ratewarden.store.keys import parse_spend_key, spend_patterns
from ratewarden.vocabulary import MAX_NAME
from ratewarden.wire.bodies import (
    ErrorResponse,
    FieldError,
    SpendResponse,
    SpendRow,
    SpendTotal,
)

router = APIRouter()

SCAN_CAP = 100_000  # records read at most per request (every day kept, before the dates)
MAX_ROWS = 10_000  # rows answered at most
DEFAULT_SINCE = "7d"
EPOCH = date(1970, 1, 1)
_DAYS = re.compile(r"([0-9]{1,5})d")  # ASCII digits: `\d` takes any script's
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")

# As a check names them (wire.bodies.Subject: control characters too), and as a reset
# names a rule.
Name = Annotated[str | None, Query(min_length=1, max_length=MAX_NAME)]
RuleName = Annotated[str | None, Query(min_length=1, max_length=64)]


@dataclass(frozen=True, slots=True)
class _Record:
    day: int
    rule: str
    scope: tuple[tuple[str, str], ...]
    micros: int
    model: int = 0  # the part of `micros` model calls' settles charged


class _Problem(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def day_of(value: str, field: str, today: int) -> int:
    """`Nd` (the last N days, today the Nth) or `YYYY-MM-DD`, as days since the epoch."""
    if found := _DAYS.fullmatch(value):
        count = int(found[1])
        if not 1 <= count <= MAX_SPEND_RETENTION_DAYS:
            raise _Problem(field, f"{value!r}: from 1d to {MAX_SPEND_RETENTION_DAYS}d")
        return today - count + 1
    if _DATE.fullmatch(value):
        try:
            return (date.fromisoformat(value) - EPOCH).days
        except ValueError:
            pass
    raise _Problem(field, f"{value!r} is not a number of days (7d) or a date (2026-11-29)")


def iso_day(day: int) -> str:
    return (EPOCH + timedelta(days=day)).isoformat()


def money(micros: int) -> float:
    return micros / MICROS


def money_text(micros: int) -> str:
    """An exact decimal: 1.5, -0.000001, 12 (what a spreadsheet reads as a number)."""
    sign = "-" if micros < 0 else ""
    whole, fraction = divmod(abs(micros), MICROS)
    return f"{sign}{whole}" + (f".{fraction:06d}".rstrip("0") if fraction else "")


def cell(text: str | None) -> str:
    """A text cell no spreadsheet runs as a formula."""
    if not text:
        return ""
    return "'" + text if text.startswith(_FORMULA_START) else text


async def read_records(
    engine: Engine, rule: str | None, user: str | None, team: str | None
) -> tuple[list[_Record], bool]:
    """Every record of the filters (compared exactly), and whether the scan was capped."""
    found: dict[tuple[int, str, tuple[tuple[str, str], ...]], _Record] = {}
    capped = False
    for pattern in spend_patterns(rule, user, team):
        records = await engine.store.spend_records(pattern, SCAN_CAP)
        capped = capped or len(records) >= SCAN_CAP
        for key, micros in records:
            parsed = parse_spend_key(key)
            if parsed is None:
                continue
            scope = dict(parsed.scope)
            if rule is not None and parsed.rule != rule:
                continue
            if user is not None and scope.get("user") != user:
                continue
            if team is not None and scope.get("team") != team:
                continue
            at = (parsed.day, parsed.rule, parsed.scope)
            record = found.get(at) or _Record(*at, 0)
            if parsed.model:
                found[at] = replace(record, model=record.model + micros)
            else:
                found[at] = replace(record, micros=record.micros + micros)
    return list(found.values()), capped


def report(
    engine: Engine, records: list[_Record], first: int, last: int, capped: bool, days: int
) -> tuple[SpendResponse, list[_Record]]:
    chosen = sorted(
        (r for r in records if first <= r.day <= last), key=lambda r: (r.day, r.rule, r.scope)
    )
    truncated = capped or len(chosen) > MAX_ROWS
    chosen = chosen[:MAX_ROWS]
    totals: dict[str | None, int] = defaultdict(int)
    rows = []
    for r in chosen:
        currency = engine.policy.currency_of(r.rule)
        totals[currency] += r.micros
        rows.append(SpendRow(
            day=iso_day(r.day), rule=r.rule, scope=dict(r.scope), amount=money(r.micros),
            currency=currency, model=money(r.model),
        ))  # fmt: skip
    answer = SpendResponse(
        since=iso_day(first),
        until=iso_day(last),
        rows=rows,
        totals=[
            SpendTotal(currency=c, amount=money(m)) for c, m in sorted(totals.items(), key=str)
        ],
        truncated=truncated,
        retention_days=days,
    )
    return answer, chosen


def as_csv(answer: SpendResponse, chosen: list[_Record]) -> str:
    """One line per row: day, rule, user, team, the other dimensions, amount, currency,
    and model (the part of amount model calls charged)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(["day", "rule", "user", "team", "scope", "amount", "currency", "model"])
    for row, record in zip(answer.rows, chosen, strict=True):
        others = ";".join(f"{k}={v}" for k, v in record.scope if k not in ("user", "team"))
        writer.writerow([
            row.day, cell(row.rule), cell(row.scope.get("user")), cell(row.scope.get("team")),
            cell(others), money_text(record.micros), cell(row.currency),
            money_text(record.model),
        ])  # fmt: skip
    return out.getvalue()


@router.get(
    "/v1/admin/spend",
    response_model=SpendResponse,
    responses={
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with format=csv"},
        422: {"model": ErrorResponse},
    },
    tags=["inspect"],
)
async def spend(
    request: Request,
    user: Name = None,
    team: Name = None,
    rule: RuleName = None,
    since: Annotated[str, Query(max_length=32)] = DEFAULT_SINCE,
    until: Annotated[str | None, Query(max_length=32)] = None,
    format: Literal["json", "csv"] = "json",
) -> SpendResponse | Response:
    """What each budget rule charged, per UTC day and scope (user, team, ...): settled
    calls, and reservations that expired unsettled, charged at their estimate. `model`:
    the part of `amount` that model calls' settles charged.

    `since`: `7d` (the last 7 days, today included; the default) or a date; `until`: a
    date (default today), inclusive. Kept RATEWARDEN_SPEND_RETENTION_DAYS (default 90).
    `format=csv` answers the same rows as CSV, for chargeback."""
    engine: Engine = request.app.state.engine
    today = engine.store.clock.now_ms() // DAY_MS
    try:
        first = day_of(since, "since", today)
        last = today if until is None else day_of(until, "until", today)
        if first > last:
            raise _Problem("since", f"{iso_day(first)} is after until ({iso_day(last)})")
    except _Problem as exc:
        message = str(exc)
        field = FieldError(field=exc.field, message=message)
        return error_response(422, "invalid_request", f"{exc.field}: {message}", [field])
    try:
        records, capped = await read_records(engine, rule, user, team)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
    days: int = request.app.state.settings.spend_retention_days
    answer, chosen = report(engine, records, first, last, capped, days)
    if format == "json":
        return answer
    name = f"ratewarden-spend-{answer.since}-{answer.until}.csv"
    return Response(
        as_csv(answer, chosen),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
