"""Schemathesis against the daemon's own OpenAPI schema, in process, bounded in time.

Its engine runs the way `schemathesis run` does (coverage phase: boundary and
schema-violating values for every parameter, undeclared methods; fuzzing phase: hypothesis,
valid and invalid), at most 50 examples per operation and per mode, through the real app
(auth, body cap, validation, engine, memory store) with an admin token. Every response
must be a non-5xx that the schema documents, in the documented shape and content type,
and schema-violating input must be refused.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, StopReason, events, from_schema
from schemathesis.python import asgi

from ratewarden.clock import FakeClock
from ratewarden.policy import parse_policy
from ratewarden.service.app import create_app
from ratewarden.service.settings import Settings
from ratewarden.store import MemoryStore

TOKEN = "schemathesis-admin-token"
# Every kind of rule, matching every tool, with small limits: generated calls hit denials,
# asks, shadow refusals, soft limits and held slots, not only allows.
POLICY = """\
version: 1
tools:
  default: {cost: 0.25}
rules:
  - name: per-user-rate
    per: [user]
    rate: 3/minute
  - name: per-tool-bucket
    per: [user, tool]
    rate: 2/minute
    algorithm: token_bucket
    burst: 2
  - name: per-session-window
    per: [session]
    rate: 5/minute
    algorithm: fixed_window
    on_exceed: ask
  - name: per-team-slot
    per: [team]
    concurrency: 1
  - name: daily-spend
    per: [user]
    budget: 1.00/day
    soft_limit: 50%
  - name: global-shadow
    per: []
    rate: 1/minute
    mode: shadow
"""
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
    "unsupported_method",
]
# Per operation, per phase and mode. No `max-time`: with it, the fuzzing phase repeats
# until the time is up; without, the run ends when the examples are spent (~10 s).
MAX_EXAMPLES = 50


def describe(recorder: Any, case_id: str, check: Any) -> str:
    failure = check.failure_info.failure
    text = f"{recorder.label}: {check.name}: {failure.title}\n  {failure.message[:500]}"
    interaction = recorder.interactions.get(case_id)
    if interaction is not None:
        request = interaction.request
        body = (request.body or b"")[:300]
        text += f"\n  request: {request.method} {request.uri} {body!r}"
        if interaction.response is not None:
            answer = (interaction.response.content or b"")[:300]
            text += f"\n  response: {interaction.response.status_code} {answer!r}"
    return text


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation() -> None:
    settings = Settings(store_url="memory://", fail=None, admin_tokens=[TOKEN])
    store = MemoryStore(FakeClock(1_700_000_000_000 + 17_345))
    app = create_app(settings, store=store, policy=parse_policy(POLICY.encode()))
    config = SchemathesisConfig.from_dict(
        {
            "headers": {"Authorization": f"Bearer {TOKEN}"},
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
        }
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    started = time.monotonic()
    failures: list[str] = []
    tested: set[str] = set()
    cases = 0
    finished: events.EngineFinished | None = None
    try:
        for event in from_schema(schema).execute():
            if isinstance(event, events.ScenarioFinished) and event.label:
                cases += len(event.recorder.cases)
                if event.status is not Status.SKIP:
                    tested.add(event.label)
                for case_id, checks in event.recorder.checks.items():
                    failures.extend(
                        describe(event.recorder, case_id, check)
                        for check in checks
                        if check.status is Status.FAILURE and check.failure_info is not None
                    )
            elif isinstance(event, events.NonFatalError | events.FatalError):
                failures.append(f"engine error: {event}")
            elif isinstance(event, events.EngineFinished):
                finished = event
    finally:
        asgi.shutdown_lifespans()  # the app's lifespan ran in schemathesis' portal thread
    elapsed = time.monotonic() - started
    seed = schema.config.seed
    assert not failures, f"seed {seed}:\n" + "\n".join(sorted(set(failures)))
    assert finished is not None
    assert finished.stop_reason is StopReason.COMPLETED, finished.stop_reason
    # Every operation was exercised, with a real number of cases, within the time bound.
    operations = {
        f"{method.upper()} {path}"
        for path, item in schema.raw_schema["paths"].items()
        for method in item
    }
    assert tested == operations, operations ^ tested
    assert cases > 20 * len(operations), cases
    assert elapsed < 60, elapsed
