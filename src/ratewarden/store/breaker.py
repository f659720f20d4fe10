"""Outage behaviour: a deadline on every store operation, and a circuit breaker.

`GuardedStore` wraps any store. Every operation must finish within the store timeout
(`RATEWARDEN_STORE_TIMEOUT_MS`, 100 ms by default), whatever happens underneath: a hung
connect, a Redis stopped mid-reply, a slow script, a client library that retries or
stretches its socket timeouts. Past the deadline the operation is cancelled (redis-py
then drops that connection, so a late reply can never be read by another command) and
the caller gets a `StoreError`, which the engine turns into a decision by the fail mode.
A timeout is not a refusal: a command already sent may still run when a frozen Redis
wakes up (at most once; nothing is retried), while the caller was answered by the fail
mode.

The timeout counts only time in which the daemon ran, and not while the store answers
other operations (store/deadlines.py): while the daemon's process is stopped or its
event loop is behind, the store's answer may be waiting, unread, in the socket, and that
is not the store failing. A busy daemon waits for its answer, up to `STALL_CAP`
timeouts in all (1 s by default); an operation that the cap ends still gets a
`StoreError`, but that says nothing about the store, so the breaker does not count it.

`CircuitBreaker` keeps a dead store from costing a timeout per request. After
`failures` operations in a row fail, the circuit *opens*: for a cool-down every
operation fails at once with `CircuitOpenError` (a `StoreError`, so decisions follow the
fail mode immediately). When the cool-down is over, the circuit is *half-open*: one
operation goes through as a probe while the others still fail at once. A probe that
succeeds closes the circuit; one that fails opens it for another cool-down. Cool-downs
are stretched by a random 0-20 %, so the workers and daemons sharing one Redis do not
probe it in lockstep. There is no background task: the probe is the next operation
that arrives (a check, a background audit flush, or `/readyz`).

The state machine takes its time and randomness as arguments, so tests drive it on a
fake clock.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from ratewarden.store.base import Args, Layer, Store, StoreError
from ratewarden.store.deadlines import Deadline, Deadlines

log = logging.getLogger("ratewarden.store")

T = TypeVar("T")
State = Literal["closed", "open", "half_open"]
STATES: tuple[State, ...] = ("closed", "open", "half_open")
JITTER = 0.2  # each cool-down lasts between 1 and 1 + JITTER times the configured one


class CircuitOpenError(StoreError):
    """Refused without calling the store: its circuit is open after repeated failures."""


class CircuitBreaker:
    """Closed -> open after `failures` consecutive failures -> half-open after a cool-down
    -> closed when one probe succeeds (or open again when it fails).

    `failures=0` turns the breaker off: every operation goes to the store.
    `on_change(old, new)` is called on every transition (metrics listen there).
    """

    def __init__(
        self,
        failures: int = 5,
        cooldown_s: float = 1.0,
        *,
        jitter: float = JITTER,
        now: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        on_change: Callable[[State, State], None] | None = None,
    ) -> None:
        if failures < 0 or cooldown_s < 0 or jitter < 0:
            raise ValueError("failures, cooldown_s and jitter must not be negative")
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._jitter = jitter
        self._now = now
        self._rand = rand
        self._on_change = on_change
        self._state: State = "closed"
        self._consecutive = 0
        self._retry_at = 0.0
        self._probing = False
        self.last_error: StoreError | None = None

    @property
    def state(self) -> State:
        return self._state

    @property
    def enabled(self) -> bool:
        return self.failures > 0

    def admit(self) -> bool:
        """May an operation go to the store now? True if it is the half-open probe.

        Raises CircuitOpenError when it may not.
        """
        if not self.enabled or self._state == "closed":
            return False
        if self._state == "open":
            wait = self._retry_at - self._now()
            if wait > 0:
                raise CircuitOpenError(self._refusal(f"next try in {wait:.2f}s"))
            self._move("half_open")
        if self._probing:
            raise CircuitOpenError(self._refusal("a probe is in flight"))
        self._probing = True
        return True

    def succeeded(self, probe: bool) -> None:
        if probe:
            self._probing = False
            self._consecutive = 0
            self.last_error = None
            self._move("closed")
        elif self._state == "closed":
            self._consecutive = 0
        # An operation admitted before the circuit opened says nothing about now.

    def failed(self, probe: bool, error: StoreError) -> None:
        if probe:
            self._probing = False
            self.last_error = error
            self._consecutive += 1
            self._open()
        elif self._state == "closed":
            self.last_error = error
            self._consecutive += 1
            if self.enabled and self._consecutive >= self.failures:
                self._open()

    def abandoned(self, probe: bool) -> None:
        """The operation ended without a verdict on the store (its caller went away, or a
        bug raised something else): the next operation may probe instead."""
        if probe:
            self._probing = False

    def _open(self) -> None:
        stretch = 1 + self._jitter * self._rand()
        self._retry_at = self._now() + self.cooldown_s * stretch
        self._move("open")

    def _move(self, new: State) -> None:
        old, self._state = self._state, new
        if old == new:
            return
        if new == "open":
            # Once per outage at warning level; each failed probe after that at debug.
            log.log(
                logging.WARNING if old == "closed" else logging.DEBUG,
                "store circuit open after %d consecutive failures (last: %s); "
                "deciding by the fail mode without calling the store for %.2fs",
                self._consecutive,
                self.last_error,
                self._retry_at - self._now(),
            )
        elif new == "closed":
            log.info("store circuit closed: the store answers again")
        if self._on_change is not None:
            self._on_change(old, new)

    def _refusal(self, detail: str) -> str:
        return (
            f"circuit open: the store failed {self._consecutive} times in a row "
            f"(last: {self.last_error}); {detail}"
        )


_SCANS = ("reset", "spend_records")  # no overall deadline: see GuardedStore


class GuardedStore(Layer):
    """A store whose every operation answers within `timeout_ms`, through `breaker`.

    `reset` and `spend_records` (admin operations that scan the keyspace in many round
    trips) are the exceptions to the overall deadline: each of their round trips is still
    bounded by the client's socket timeout (for `redis://`, the deadline's cap), and they
    still go through the breaker.
    """

    def __init__(
        self, store: Store, timeout_ms: int, breaker: CircuitBreaker | None = None
    ) -> None:
        if timeout_ms <= 0:
            raise ValueError("timeout_ms must be positive")
        super().__init__(store)
        self.timeout_s = timeout_ms / 1000
        self._deadlines = Deadlines(self.timeout_s)
        self.breaker = breaker or CircuitBreaker(failures=0)

    async def around(
        self, operation: str, function: Callable[[*Args], Awaitable[T]], *args: *Args
    ) -> T:
        # The coroutine is made only once admitted: a refused call creates nothing to await.
        probe = self.breaker.admit()
        deadline = self._deadlines()
        try:
            if operation not in _SCANS:  # see the class docstring
                async with deadline:
                    result = await function(*args)
            else:
                result = await function(*args)
        except TimeoutError as exc:  # the deadline (the store's own errors are StoreErrors)
            if deadline.cut_short:  # the daemon was behind: no verdict on the store
                self.breaker.abandoned(probe)
                raise self._stalled(operation, deadline) from exc
            error = StoreError(f"{operation} timed out after {self.timeout_s * 1000:g} ms")
            self.breaker.failed(probe, error)
            raise error from exc
        except StoreError as exc:
            self.breaker.failed(probe, exc)
            raise
        except BaseException:
            self.breaker.abandoned(probe)
            raise
        self._deadlines.answered()
        self.breaker.succeeded(probe)
        return result

    def _stalled(self, operation: str, deadline: Deadline) -> StoreError:
        return StoreError(
            f"{operation} not answered within {self._deadlines.cap_s * 1000:g} ms while "
            f"the daemon was behind ({deadline.stalled_s * 1000:.0f} ms of it stalled)"
        )
