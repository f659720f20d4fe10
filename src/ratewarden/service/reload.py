"""Hot reload of the policy: `POST /v1/admin/reload`, SIGHUP, and a file watcher.

Every trigger does the same thing: read the policy source again (the file the daemon
started with, or the packaged example when it started without one), validate it whole,
and then either

- swap it in with one assignment, `engine.policy = new`: a decision reads
  `engine.policy` once and keeps that policy to its end, so each answer comes from
  exactly one policy, never from a mix; or
- refuse it whole: the policy in force stays, the errors are logged (each one
  `file:line: field: message`) and counted as
  `ratewarden_policy_reloads_total{result="error"}`.

The watcher polls the file every `reload_interval_s` seconds (0: off). It reads the file
only when its stat (mtime, size, inode) changed, and reloads when the content's hash is
neither the version in force nor the last content already tried, once the content is
the same on two reads a moment apart (an editor still writing is not half-applied).

Each worker process has its own engine, so each reloads on its own. A reload through one
process (its SIGHUP, a reload request that reached it, its watcher) is announced in the
store (`announce`, service/fleet.py), and every other worker of every daemon on the store
reloads its own source at its next poll (within about a second plus a compile), with the
trigger `FLEET_TRIGGER`, which is not announced again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from ratewarden.engine import Engine
from ratewarden.policy import (
    Policy,
    PolicyError,
    PolicyIssue,
    load_example_policy,
    parse_policy,
)
from ratewarden.policy.bounded_yaml import read_bounded
from ratewarden.policy.compile import compile_runtime_override, policy_version, with_runtime
from ratewarden.policy.model import CompiledOverride
from ratewarden.policy.schema import OverrideSpec
from ratewarden.service.metrics import Metrics

log = logging.getLogger("ratewarden.reload")

# A reload because another process announced one: not announced in turn.
FLEET_TRIGGER = "another process's reload"
# Pause between the two reads that must agree before the watcher reloads a changed file.
SETTLE_S = 0.1


class ReloadResponse(BaseModel):
    """The answer of `POST /v1/admin/reload` when the new policy is in force."""

    version: str = Field(description="the version (content hash) now in force")
    previous_version: str = Field(description="the version in force before this reload")
    changed: bool = Field(description="false when the file was unchanged")
    source: str
    rules: int
    pid: int = Field(
        description="the worker that reloaded; every other process follows within seconds"
    )


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    trigger: str
    previous: Policy
    current: Policy  # the policy in force after the attempt
    error: PolicyError | None = None
    tokens_error: str | None = None  # the user tokens file's mistake: the old tokens stay
    at: float = field(default_factory=time.time)  # wall-clock time of the attempt

    @property
    def ok(self) -> bool:
        return self.error is None

    def response(self) -> ReloadResponse:
        return ReloadResponse(
            version=self.current.version,
            previous_version=self.previous.version,
            changed=self.current.version != self.previous.version,
            source=self.current.source,
            rules=len(self.current.rules),
            pid=os.getpid(),
        )


class PolicyReloader:
    """Reloads `engine.policy` from `path` (None: the packaged example policy)."""

    def __init__(
        self, engine: Engine, metrics: Metrics, path: Path | None, interval_s: float = 0
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.path = path
        self.interval_s = interval_s
        self._lock = asyncio.Lock()
        self._last_tried: str | None = None  # content hash of the last file tried
        self._seen_stat: tuple[int, ...] | None = None
        self._tasks: set[asyncio.Task[ReloadOutcome]] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._signal_installed = False
        # Runtime overrides in force (service/overrides.py): (id, override), compiled into
        # every policy this loads, the file's own reloads included.
        self.runtime: tuple[tuple[str, OverrideSpec], ...] = ()
        # Ones compiled by `try_override` against the file (spec) in force: what the next
        # `use_overrides` reuses rather than compiles again.
        self._tried: tuple[object, dict[str, CompiledOverride]] = (None, {})
        # The last attempt, kept for the console's overview (GET /v1/admin/stats).
        self.last: ReloadOutcome | None = None
        # Reads the user tokens file again (auth.Tokens.reload_users): its mistake, or None.
        self.user_tokens: Callable[[], str | None] | None = None
        # Tells the other processes that this one reloaded (service/fleet.py).
        self.announce: Callable[[], Awaitable[None]] | None = None

    # -- reload ------------------------------------------------------------------------

    async def reload(self, trigger: str, raw: bytes | None = None) -> ReloadOutcome:
        """Load the source again and swap it in, or keep the policy in force if it is invalid.

        `raw` is the file's content when the caller already read it (the watcher), so the
        content judged stable is the content loaded. Any attempt but one that follows
        another process's is announced, so every process reads its source again.
        """
        outcome = await self._reload(trigger, raw)
        if self.announce is not None and trigger != FLEET_TRIGGER:
            await self.announce()
        return outcome

    async def _reload(self, trigger: str, raw: bytes | None) -> ReloadOutcome:
        async with self._lock:
            previous = self.engine.policy
            tokens_error = await self._reload_user_tokens()
            try:
                if raw is None and self.path is not None:
                    raw = await asyncio.to_thread(_read, self.path)
                new = await asyncio.to_thread(self._parse, raw)
            except PolicyError as exc:
                if raw is not None:
                    self._last_tried = policy_version(raw)
                self.metrics.policy_load_failed()
                log.error(
                    "policy reload (%s) refused; version %s stays in force:\n%s",
                    trigger,
                    previous.version,
                    exc.render(),
                )
                self.last = ReloadOutcome(trigger, previous, previous, exc, tokens_error)
                return self.last
            self._last_tried = new.version
            self.engine.policy = new  # the swap: one assignment, seen whole by every decision
            self.metrics.policy_loaded(new)
            if new.version == previous.version:
                log.info("policy reload (%s): %s unchanged (version %s)", trigger, new.source,
                         new.version)  # fmt: skip
            else:
                log.info(
                    "policy reloaded (%s): %s version %s -> %s, %d rules",
                    trigger,
                    new.source,
                    previous.version,
                    new.version,
                    len(new.rules),
                )
            self.last = ReloadOutcome(trigger, previous, new, None, tokens_error)
            return self.last

    async def _reload_user_tokens(self) -> str | None:
        """The user tokens file, read with every reload: a mistake keeps the tokens in
        force (auth.Tokens logs it) and is returned."""
        if self.user_tokens is None:
            return None
        return await asyncio.to_thread(self.user_tokens)

    def _parse(self, raw: bytes | None) -> Policy:
        if self.path is None or raw is None:
            return load_example_policy(self.runtime)
        return parse_policy(raw, source=str(self.path), runtime=self.runtime)

    async def try_override(self, override_id: str, override: OverrideSpec) -> CompiledOverride:
        """One runtime override compiled against the file in force, not applied: its `idle`
        says why it cannot apply. Kept, so applying it (`use_overrides`) does not compile
        it again, unless the file was reloaded in between."""
        policy = self.engine.policy
        compiled = await asyncio.to_thread(
            compile_runtime_override, policy.spec, override_id, override
        )
        if self._tried[0] is not policy.spec:
            self._tried = (policy.spec, {})
        self._tried[1][override_id] = compiled
        return compiled

    def forget_tried(self, override_id: str) -> None:
        """Its trial is applied or refused: nothing more to reuse (kept no longer)."""
        self._tried[1].pop(override_id, None)

    async def use_overrides(self, runtime: Sequence[tuple[str, OverrideSpec]]) -> Policy:
        """Swap in the policy in force with these runtime overrides (newest first) instead of
        the last, compiling only those it has not (policy/compile.py `with_runtime`). Off
        the event loop: checks go on while it merges."""
        async with self._lock:
            policy = self.engine.policy
            tried = self._tried[1] if self._tried[0] is policy.spec else {}
            new = await asyncio.to_thread(with_runtime, policy, runtime, tried)
            self.runtime = tuple(runtime)
            self.engine.policy = new
            self.engine.refusals.clear()  # a refusal remembered under the old limits
            return new

    # -- lifespan: watcher and SIGHUP ---------------------------------------------------

    def start(self) -> None:
        """Start the watcher (when there is a file and an interval) and the SIGHUP handler."""
        if self.path is not None and self.interval_s > 0:
            self._watcher = asyncio.create_task(self._watch(), name="ratewarden-policy-watcher")
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            # Not the main thread, or no SIGHUP here: the other triggers still work.
            log.debug("no SIGHUP handler installed")
        else:
            self._signal_installed = True

    async def stop(self) -> None:
        if self._signal_installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._signal_installed = False
        tasks = [*self._tasks, *([self._watcher] if self._watcher else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watcher = None

    def _on_sighup(self) -> None:
        task = asyncio.create_task(self.reload("SIGHUP"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll()
            except Exception:  # the watcher must outlive any surprise
                log.exception("policy watcher: unexpected error; still watching")

    async def poll(self) -> bool:
        """One look at the file; reload if it changed. True when a reload was attempted."""
        assert self.path is not None
        path = self.path
        stat = await asyncio.to_thread(_stat, path)
        if stat is not None and stat == self._seen_stat:
            return False
        first = await asyncio.to_thread(_read_or_none, path)
        digest = policy_version(first) if first is not None else "unreadable"
        if digest in (self.engine.policy.version, self._last_tried):
            self._seen_stat = stat
            return False
        await asyncio.sleep(SETTLE_S)
        again = await asyncio.to_thread(_read_or_none, path)
        if again != first:
            return False  # still being written: look again at the next poll
        self._seen_stat = stat
        if first is None:
            self._last_tried = digest  # report a missing file once, not every poll
        await self.reload("file change", first)
        return True


def _read(path: Path) -> bytes:
    try:
        return read_bounded(path)  # a huge file is refused, not read whole
    except OSError as exc:
        raise PolicyError(
            str(path), [PolicyIssue((), f"cannot read: {exc.strerror or exc}")]
        ) from None


def _read_or_none(path: Path) -> bytes | None:
    try:
        return read_bounded(path)  # a huge file is refused, not read whole
    except OSError:
        return None


def _stat(path: Path) -> tuple[int, ...] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_mtime_ns, found.st_size, found.st_ino, found.st_dev)
