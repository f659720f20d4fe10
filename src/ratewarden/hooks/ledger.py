"""The calls a host's hooks opened and have not closed, for a host whose PostToolUse cannot
name the call its PreToolUse opened (Codex: the home of that pairing).

Codex names a call by the model's tool-call id, and a model server may give every call
the same one (`call_0`), while its `turn_id` is the same for every call of a prompt. So
its PreToolUse hook gives each call a fresh id and, once the daemon allowed the call,
`keep`s it under keys both hooks of a call read alike (hooks/codex.py: the model's id,
the tool and its input; and the model's id and the tool alone); the PostToolUse hook
`take`s the newest id under its first key, else under its second (another hook may have
rewritten the input), and settles that call.

- **Alike calls.** Calls that share their first key (parallel calls with the same id and
  the same input) match the same rules: each PostToolUse closes one of them, and which one does
  not change a count.
- **Newest first.** A call the daemon allowed that never ran (another hook refused it,
  Codex stopped) leaves its id behind; the next call under the same key is still closed
  by its own PostToolUse, and the leftover's slot frees at its rule's lease_timeout.
- **Bounded.** A session's file keeps at most MAX_OPEN ids, none older than MAX_AGE_MS,
  and goes when its last id does. When a session starts a file, files untouched for
  MAX_AGE_MS go, and the oldest beyond MAX_SESSIONS.
- **Concurrent hooks.** Codex runs parallel tool calls, and their hooks, at once: each
  read-and-write holds one lock on the folder (`flock` on `.lock`, never removed, so no
  process locks a file another just unlinked), a millisecond or so.
- **Where.** `$XDG_RUNTIME_DIR/ratewarden/<host>` (private to the user, cleared when they
  log out), else `${XDG_CACHE_HOME:-$HOME/.cache}/ratewarden/<host>`. A file holds call
  ids, digests of keys and times in ms: never a call's arguments.

Standard library only, and no `pathlib`: a hook process pays for each import.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard, TypeVar

from ratewarden import vocabulary

MAX_OPEN = 64  # ids per session: more than Codex runs at once; a file of a few KB
MAX_AGE_MS = 24 * 3600 * 1000  # a day: longer than any call's lease is worth keeping
MAX_SESSIONS = 256  # files in the folder, each a session with calls still open
LOCK = ".lock"
SUFFIX = ".json"

Keys = tuple[str, ...]  # what a call is found by, the most telling first
Entry = tuple[Keys, str, int]  # keys, call id, when it was kept (ms since the epoch)
T = TypeVar("T")


def folder(host: str, environ: Mapping[str, str]) -> str | None:
    """The host's ledger folder, made if need be (owner only); None when there is none."""
    base = _base(environ)
    if base is None or os.name != "posix":  # flock: POSIX only
        return None
    path = os.path.join(base, "ratewarden", host)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK | os.X_OK) else None


def _base(environ: Mapping[str, str]) -> str | None:
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return runtime
    cache = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(cache):
        return cache
    home = environ.get("HOME", "")
    return os.path.join(home, ".cache") if os.path.isabs(home) else None


def key(*parts: object) -> str:
    """A digest of what both hooks of a call see alike (JSON values; keys sorted, so the
    order the host wrote them in does not matter)."""
    try:
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):  # a part that is not JSON reads as null
        readable = [part if isinstance(part, str) else None for part in parts]
        text = json.dumps(readable, separators=(",", ":"))
    return vocabulary.digest(text)


def keep(where: str, session: str, found_by: Keys, call_id: str, now_ms: int) -> None:
    """Keep `call_id` open under `found_by`; OSError when the folder cannot be written."""

    def add(entries: list[Entry], new: bool) -> list[Entry]:
        if new:
            _sweep(where, now_ms)
        return [*entries, (found_by, call_id, now_ms)][-MAX_OPEN:]

    _update(where, session, now_ms, add)


def take(where: str, session: str, found_by: Keys, now_ms: int) -> str | None:
    """The newest id kept under the first of `found_by`, else the newest under the second,
    and so on; no longer kept. None if there is none."""
    taken: list[str] = []

    def remove(entries: list[Entry], new: bool) -> list[Entry]:
        index = _newest(entries, found_by)
        if index is None:
            return entries
        taken.append(entries[index][1])
        return entries[:index] + entries[index + 1 :]

    _update(where, session, now_ms, remove)
    return taken[0] if taken else None


def _newest(entries: list[Entry], found_by: Keys) -> int | None:
    for level, wanted in enumerate(found_by):
        for index in range(len(entries) - 1, -1, -1):
            keys = entries[index][0]
            if level < len(keys) and keys[level] == wanted:
                return index
    return None


def _update(
    where: str, session: str, now_ms: int, change: Callable[[list[Entry], bool], list[Entry]]
) -> None:
    """Read a session's entries, change them, write them back: under the folder's lock."""
    path = os.path.join(where, vocabulary.digest(session) + SUFFIX)

    def update() -> None:
        entries = _read(path)
        fresh = [entry for entry in entries or () if now_ms - entry[2] < MAX_AGE_MS]
        _write(path, change(fresh, entries is None))

    _locked(where, update)


def _locked(where: str, action: Callable[[], T]) -> T:
    import fcntl  # POSIX; the caller does without a ledger where it is missing

    descriptor = os.open(os.path.join(where, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        return action()
    finally:
        os.close(descriptor)  # releases the lock


def _read(path: str) -> list[Entry] | None:
    """A session's entries; None when it has no file. A file this module did not write
    (torn, edited) reads as no entries: the worst it costs is a call left to its lease."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    return [(tuple(item[0]), item[1], item[2]) for item in data if _entry(item)]


def _entry(item: object) -> TypeGuard[list[Any]]:
    return (
        isinstance(item, list)
        and len(item) == 3
        and isinstance(item[0], list)
        and all(isinstance(key, str) for key in item[0])
        and isinstance(item[1], str)
        and isinstance(item[2], int)
        and not isinstance(item[2], bool)
    )


def _write(path: str, entries: list[Entry]) -> None:
    """Write the entries whole (a reader never sees half a file), or remove the file."""
    if not entries:
        _remove(path)
        return
    temporary = f"{path}.{os.getpid()}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        json.dump(entries, file, separators=(",", ":"))
    os.replace(temporary, path)


def _sweep(where: str, now_ms: int) -> None:
    """Remove the files of sessions untouched for MAX_AGE_MS, then the oldest beyond
    MAX_SESSIONS - 1 (a new one is about to be written)."""
    dated = sorted(_dated(where))
    old = [path for touched_ms, path in dated if now_ms - touched_ms >= MAX_AGE_MS]
    recent = [path for touched_ms, path in dated if now_ms - touched_ms < MAX_AGE_MS]
    for path in (*old, *recent[: max(0, len(recent) - MAX_SESSIONS + 1)]):
        _remove(path)


def _dated(where: str) -> list[tuple[int, str]]:
    """The folder's files (sessions' and any temporary one left), with when each was last
    written, in ms."""
    found = []
    for name in os.listdir(where):
        path = os.path.join(where, name)
        try:
            if name != LOCK:
                found.append((os.stat(path).st_mtime_ns // 1_000_000, path))
        except FileNotFoundError:  # another hook removed it meanwhile
            continue
    return found


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # another hook removed it meanwhile
        os.unlink(path)
