"""The embedded store's state file: its counters, budgets, call records and recent
denials, kept across a restart.

The file is JSON (never pickle: loading it runs no code), written whole and atomically:
a temporary file in the same directory, fsync, `os.replace`, fsync of the directory.
A reader therefore sees either the previous snapshot or the new one, never a mix, even
if the machine loses power mid-write.

    {"format": "ratewarden-state", "version": 1, "saved_at_ms": 1700000000000,
     "cells": [[key, expires_at_ms, {"ring": [capacity, [stamp, ...]]}], ...],
     "denials": ["<audit JSON line>", ...],
     "overrides": {"version": 3, "documents": {"<id>": "<override JSON>", ...}}}

Each cell's value is tagged by its type (see `limiter.reference`): `ring` (a sliding
log), `tat` (a token bucket's theoretical arrival time), `window` (a fixed window's
`[start, count]`), `budget`, `spend` (a budget's spend record of one day, micro-units),
`slots` (concurrency leases) and `record` (an allowed call). Expiry times are absolute
epoch milliseconds, so cells that expired while the daemon was down are dropped on load.

A file that cannot be read or parsed is refused with `StateFileError` (the daemon does
not start): starting empty would silently reset everyone's spend.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ratewarden.errors import RatewardenError
from ratewarden.limiter.reference import Budget, DaySpend, Record, Ring

FORMAT = "ratewarden-state"
VERSION = 1

log = logging.getLogger("ratewarden.store")


class StateFileError(RatewardenError):
    """The state file cannot be read, parsed, locked or written; the message says why."""


@dataclass(slots=True)
class State:
    """What a snapshot holds: live cells `key -> (value, expires_at_ms)` and denials."""

    cells: dict[str, tuple[Any, int]]
    denials: list[str]
    saved_at_ms: int = 0
    overrides: tuple[int, dict[str, str]] = (0, {})  # runtime overrides: version, documents
    dropped: int = 0  # cells in the file that had expired by the time it was loaded


# -- encoding ------------------------------------------------------------------------


def encode_value(value: Any) -> dict[str, Any]:
    """One cell's value as tagged JSON; TypeError for a type the file cannot hold."""
    if isinstance(value, Ring):
        return {"ring": [value.capacity, list(value.stamps)]}
    if isinstance(value, Budget):
        return {
            "budget": {
                "period": value.period,
                "spent": value.spent,
                "reserved": value.reserved,
                "holds": {call: [amount, expiry] for call, (amount, expiry) in value.holds.items()},
                "charged": dict(value.charged),
            }
        }
    if isinstance(value, Record):
        return {
            "record": {
                "fingerprint": value.fingerprint,
                "numbers": list(value.numbers),
                "holds": value.holds,
                "settled": value.settled,
            }
        }
    if isinstance(value, DaySpend):  # a budget's spend record of one day
        return {"spend": value.amount}
    if isinstance(value, tuple) and len(value) == 2:
        return {"window": [value[0], value[1]]}
    if isinstance(value, dict):
        return {"slots": dict(value)}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"tat": value}
    if isinstance(value, str):  # a loop rule's last result (a digest)
        return {"result": value}
    raise TypeError(f"a memory-store cell of type {type(value).__name__} cannot be saved")


def encode(
    cells: Mapping[str, tuple[Any, int]],
    denials: Iterable[str],
    now_ms: int,
    overrides: tuple[int, Mapping[str, str]] = (0, {}),
) -> dict[str, Any]:
    """The snapshot document of the live cells at `now_ms` (call with the store locked)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "saved_at_ms": now_ms,
        "cells": [
            [key, expires_at, encode_value(value)]
            for key, (value, expires_at) in cells.items()
            if expires_at > now_ms
        ],
        "denials": list(denials),
        "overrides": {"version": overrides[0], "documents": dict(overrides[1])},
    }


def dumps(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


# -- decoding ------------------------------------------------------------------------


class _Invalid(ValueError):
    pass


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"{what} must be an integer, not {value!r}")
    return value


def _number(value: Any, what: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"{what} must be a number, not {value!r}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"{what} must be a string, not {value!r}")
    return value


def _list(value: Any, what: str, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        shape = "a list" if length is None else f"a list of {length}"
        raise _Invalid(f"{what} must be {shape}, not {value!r}")
    return value


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(f"{what} must be an object, not {value!r}")
    return value


def _field(found: dict[str, Any], name: str, what: str) -> Any:
    if name not in found:
        raise _Invalid(f"{what} has no {name!r}")
    return found[name]


def _day_spend(value: Any, what: str) -> DaySpend:
    return DaySpend(_int(value, what))


# One number or string each: a token bucket's TAT, a loop rule's last result, a budget's
# spend record of one day.
_SCALARS: dict[str, Callable[[Any, str], Any]] = {
    "tat": _number,
    "result": _str,
    "spend": _day_spend,
}


def decode_value(tagged: Any, what: str) -> Any:
    """The cell value a tagged JSON object stands for (the inverse of `encode_value`)."""
    found = _dict(tagged, what)
    if len(found) != 1:
        raise _Invalid(f"{what} must have exactly one type tag, not {sorted(found)}")
    ((tag, body),) = found.items()
    where = f"{what}.{tag}"
    if tag == "ring":
        capacity, stamps = _list(body, where, 2)
        return Ring(
            _int(capacity, f"{where} capacity"),
            [_int(s, f"{where} stamp") for s in _list(stamps, f"{where} stamps")],
        )
    if tag in _SCALARS:
        return _SCALARS[tag](body, where)
    if tag == "window":
        start, count = _list(body, where, 2)
        return (_int(start, f"{where} start"), _int(count, f"{where} count"))
    if tag == "slots":
        return {
            _str(call, f"{where} call"): _int(expiry, f"{where} expiry")
            for call, expiry in _dict(body, where).items()
        }
    if tag == "budget":
        found = _dict(body, where)
        period = _field(found, "period", where)
        holds = {}
        for call, hold in _dict(_field(found, "holds", where), f"{where}.holds").items():
            amount, expiry = _list(hold, f"{where}.holds[{call!r}]", 2)
            holds[call] = (_int(amount, f"{where} hold amount"), _int(expiry, f"{where} expiry"))
        return Budget(
            period=None if period is None else _int(period, f"{where}.period"),
            spent=_int(_field(found, "spent", where), f"{where}.spent"),
            reserved=_int(_field(found, "reserved", where), f"{where}.reserved"),
            holds=holds,
            charged={  # absent in files written before it existed
                _str(call, f"{where} call"): _int(amount, f"{where} charged amount")
                for call, amount in _dict(found.get("charged", {}), f"{where}.charged").items()
            },
        )
    if tag == "record":
        found = _dict(body, where)
        settled = _field(found, "settled", where)
        if not isinstance(settled, bool):
            raise _Invalid(f"{where}.settled must be true or false, not {settled!r}")
        return Record(
            fingerprint=_str(_field(found, "fingerprint", where), f"{where}.fingerprint"),
            numbers=[
                _int(n, f"{where}.numbers")
                for n in _list(_field(found, "numbers", where), f"{where}.numbers")
            ],
            holds=_str(_field(found, "holds", where), f"{where}.holds"),
            settled=settled,
        )
    raise _Invalid(f"{what} has an unknown type tag {tag!r}")


def decode(document: Any, now_ms: int) -> State:
    """The state a parsed snapshot holds, without the cells that expired by `now_ms`."""
    top = _dict(document, "the file")
    if top.get("format") != FORMAT:
        raise _Invalid(f"it is not a ratewarden state file (format {top.get('format')!r})")
    version = top.get("version")
    if version != VERSION:
        raise _Invalid(
            f"it has version {version!r}, and this ratewarden reads version {VERSION} "
            "(was it written by a newer ratewarden?)"
        )
    state = State({}, [], _int(_field(top, "saved_at_ms", "the file"), "saved_at_ms"))
    for n, entry in enumerate(_list(_field(top, "cells", "the file"), "cells")):
        what = f"cells[{n}]"
        key, expires_at, tagged = _list(entry, what, 3)
        key = _str(key, f"{what} key")
        expires_at = _int(expires_at, f"{what} expiry")
        value = decode_value(tagged, what)
        if expires_at <= now_ms:
            state.dropped += 1
            continue
        state.cells[key] = (value, expires_at)
    state.denials = [
        _str(line, "denials[]") for line in _list(_field(top, "denials", "the file"), "denials")
    ]
    if "overrides" in top:  # files written before runtime overrides have none
        state.overrides = _overrides(top["overrides"])
    return state


def _overrides(found: Any) -> tuple[int, dict[str, str]]:
    if not isinstance(found, dict):
        raise StateFileError("the file's overrides: expected an object")
    documents = found.get("documents")
    if not isinstance(documents, dict):
        raise StateFileError("the file's overrides: expected documents by id")
    version = _int(found.get("version"), "overrides version")
    return version, {
        _str(key, "overrides id"): _str(doc, f"overrides[{key!r}]")
        for key, doc in documents.items()
    }


# -- the file ------------------------------------------------------------------------


class StateFile:
    """One state file: locked for this process, loaded once, then rewritten atomically.

    The lock (`flock` on `<file>.lock`, held until `release`) keeps a second daemon from
    using the same file: two writers would overwrite each other's counters.
    """

    def __init__(self, path: Path, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.path = path.absolute()  # a later chdir must not move it
        self.interval_s = interval_s
        self._lock_file: IO[bytes] | None = None
        self._writing = threading.Lock()
        self._written = -1  # sequence number of the snapshot on disk

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def acquire(self) -> None:
        """Lock the file for this process, or raise StateFileError naming the problem."""
        if self._lock_file is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = self.lock_path.open("ab")
        except OSError as exc:
            raise StateFileError(self._problem("cannot create the lock file for", exc)) from exc
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            raise StateFileError(
                f"the state file {self.path} is in use by another ratewarden process "
                f"({self.lock_path} is locked); give each daemon its own "
                "RATEWARDEN_STATE_FILE, or share counters through Redis "
                "(RATEWARDEN_STORE_URL=redis://...)"
            ) from exc
        self._lock_file = handle

    def release(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor drops the flock
            self._lock_file = None

    def load(self, now_ms: int) -> State | None:
        """The saved state (expired cells dropped), or None if there is no file yet."""
        self._remove_stale_temporaries()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateFileError(self._refusal(f"it cannot be read ({exc.strerror})")) from exc
        try:
            return decode(json.loads(data.decode("utf-8")), now_ms)
        except UnicodeDecodeError as exc:
            raise StateFileError(self._refusal(f"it is not UTF-8 text ({exc.reason})")) from exc
        except json.JSONDecodeError as exc:
            reason = "it is empty" if not data.strip() else f"it is not valid JSON ({exc})"
            raise StateFileError(self._refusal(reason)) from exc
        except _Invalid as exc:
            raise StateFileError(self._refusal(str(exc))) from exc

    def write(self, data: bytes, sequence: int | None = None) -> None:
        """Replace the file with `data` atomically and durably.

        Writes are serialized; with `sequence`, a snapshot older than the one already
        written is dropped (a write that outlived its cancelled caller cannot undo a
        newer one).
        """
        with self._writing:
            if sequence is not None and sequence <= self._written:
                return
            self._replace(data)
            if sequence is not None:
                self._written = sequence

    def _replace(self, data: bytes) -> None:
        directory = self.path.parent
        try:
            fd, temporary = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".tmp", dir=directory
            )
        except OSError as exc:
            raise StateFileError(self._problem("cannot write", exc)) from exc
        try:
            with os.fdopen(fd, "wb") as out:  # mkstemp made it 0600: it names users
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise StateFileError(self._problem("cannot write", exc)) from exc
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _fsync_directory(directory)  # the rename itself must reach the disk

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of a write interrupted by a crash; never the state file itself."""
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()

    def _problem(self, what: str, exc: OSError) -> str:
        return (
            f"{what} the state file {self.path}: {exc.strerror or exc}; set "
            "RATEWARDEN_STATE_FILE to a writable path, or to 'off' to keep counters in "
            "memory only (they are then lost at every restart)"
        )

    def _refusal(self, reason: str) -> str:
        return (
            f"cannot load the state file {self.path}: {reason}. It holds the embedded "
            "store's counters and budgets, and starting without it would reset everyone's "
            "spend, so ratewarden does not start. Restore it from a backup, or move it "
            "aside to start from zero (or set RATEWARDEN_STATE_FILE=off)."
        )


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # some filesystems cannot open a directory; the data itself is synced
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["FORMAT", "VERSION", "State", "StateFile", "StateFileError", "decode", "encode"]
