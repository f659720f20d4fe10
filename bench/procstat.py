"""CPU time from /proc: the whole machine's, and each process's (Linux; elsewhere None).

The benchmark reads what each part of a run (the server and its workers, Redis, the load
generator) spent per decision, so that what bounds a figure on this machine is measured
in the same run instead of argued: two workers on two cores, say, share those cores
with Redis and the load generator.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat (0, 0 elsewhere)."""
    try:
        fields = [float(v) for v in (PROC / "stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """How many of the machine's cores were busy between two `cpu_times()`: the whole
    machine (server, Redis, load generator), so what a second worker could still use."""
    total = after[1] - before[1]
    return None if total <= 0 else (after[0] - before[0]) / total * (os.cpu_count() or 1)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces)."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def family(pid: int) -> list[int]:
    """`pid` and its descendants: a server and its worker processes (`pid` alone where
    there is no /proc; `cpu_seconds` then reads nothing)."""
    if not PROC.is_dir():
        return [pid]
    parent_of = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parent_of[int(entry.name)] = int(fields[1])  # field 4 of stat: the parent
    members, added = {pid}, True
    while added:
        found = {child for child, parent in parent_of.items() if parent in members}
        added = bool(found - members)
        members |= found
    return sorted(members)


def cpu_seconds(pids: list[int]) -> float | None:
    """User and system CPU seconds these processes have used (None if none can be read)."""
    ticks, seen = 0, False
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
            seen = True
    return ticks / os.sysconf("SC_CLK_TCK") if seen else None
