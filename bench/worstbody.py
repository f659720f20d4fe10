"""Worst bodies: what the costliest requests within the caps cost the daemon, next to a
normal check, and what sending them does to other clients (issue 15, item 6).

Every body here fits the body cap (RATEWARDEN_MAX_BODY_BYTES, 256 KiB). Those of more
than wire.bounded.MAX_ITEMS items are refused unread, their items counted on their bytes (wide,
deep, keys, unknown fields, strings dense with escapes and commas, too many calls); the
rest are read and validated, each at the item cap and costly in its own way (the largest
accepted args, thousands of keys, arrays too deep, unknown fields, a count that must
resolve escapes before a parse, JSON pydantic-core cannot read, a batch refused at its
last call).

- Cost: each body is sent on its own for a while, two connections in a closed loop, and
  the server's CPU time is divided by the requests it answered; a normal check is
  measured the same way in the same run, and each body's cost is given as a multiple of
  it (the target: the worst at most 10 times a normal check).
- Interference: other clients offer normal checks at a fixed rate, first alone, then
  while four connections send the costliest body in a closed loop; their p50 and p99.

bench/run.py runs it against its one-rule server; on its own, against a running daemon:

    python -m bench.worstbody --port 8470 --pid 12345 --rate 200
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_core import to_json

from ratewarden.service.settings import Settings
from ratewarden.wire.bodies import MAX_ARGS_BYTES, MAX_ARGS_DEPTH, MAX_BATCH
from ratewarden.wire.bounded import MAX_ITEMS, count_items

BODY_CAP = int(Settings.model_fields["max_body_bytes"].default)
HOOK_CAP = int(Settings.model_fields["max_hook_body_bytes"].default)
ROOM = 64  # bytes under the cap: never a 413
SENDERS = 4  # connections sending the worst body while others are measured
OTHERS = 64  # connections of the other clients: enough never to queue for one
TARGET = 10.0  # the worst body's cost, in normal checks
NORMAL = "normal check"
CHECK = b'{"user":"u","tool":"t","args":{"k":['  # a check whose args hold a list...
END = b"]}}"  # ...closed here


def repeated(unit: bytes, count: int) -> bytes:
    """`unit` `count` times; in `unit`, `{n}` is replaced by the repetition's number (six
    digits), so that keys differ."""
    if b"{n}" not in unit:
        return unit * count
    return b"".join(unit.replace(b"{n}", b"%06d" % i) for i in range(count))


def filled(head: bytes, unit: bytes, tail: bytes, size: int = BODY_CAP - ROOM) -> bytes:
    """`head`, then `unit` as often as fits in `size` bytes with `tail`."""
    width = len(unit) + (3 if b"{n}" in unit else 0)
    return head + repeated(unit, (size - len(head) - len(tail)) // width) + tail


def at_item_cap(head: bytes, unit: bytes, tail: bytes) -> bytes:
    """`head`, then `unit` as often as the body stays within MAX_ITEMS with `tail`."""
    base = count_items(head + tail)
    per = count_items(head + unit + tail) - base
    body = head + repeated(unit, (MAX_ITEMS - base) // per) + tail
    assert count_items(body) <= MAX_ITEMS
    assert len(body) <= BODY_CAP - ROOM
    return body


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def largest_valid() -> bytes:
    """Args at every cap at once: MAX_ARGS_DEPTH deep, MAX_ITEMS items in the body (empty
    arrays, the costliest items to read), then a string up to MAX_ARGS_BYTES."""
    head = b'{"user":"u","tool":"t","args":{"s":"","k":[' + nested(MAX_ARGS_DEPTH - 2)
    body = at_item_cap(head, b",[]", b"]}}")
    room = MAX_ARGS_BYTES - len(to_json(json.loads(body)["args"]))
    return body.replace(b'"s":""', b'"s":"' + b"x" * room + b'"', 1)


def normal_checks() -> bytes:
    """What bench/run.py sends: one call each, users in turn (one line each)."""
    return b"\n".join(b'{"user":"user-%d","tool":"terminal"}' % i for i in range(1000))


def batch_refused_last() -> bytes:
    """MAX_BATCH calls of args at the item cap between them, the last one refused: every
    call but the last is read and validated, args checks included."""
    last = b'{"user":""}'

    def batch(arrays: int) -> bytes:
        call = b'{"user":"u","tool":"t","args":{"k":[' + b"[]," * arrays + b"[]]}}"
        return b'{"calls":[' + b",".join([call] * (MAX_BATCH - 1)) + b"," + last + b"]}"

    base, per = count_items(batch(0)), count_items(batch(1)) - count_items(batch(0))
    body = batch((MAX_ITEMS - base) // per)
    assert count_items(body) <= MAX_ITEMS
    return body


# Argument conditions (issue 25, item 2). The worst-body server's policy (`policy`) adds
# to the one rule a `deny` rule per pattern, each on a tool of its own, so that each body
# below is checked against one pattern, on a 64 KiB `args.command` it does not match: a
# typical pattern; the hungriest run of counted states let through (its states at the
# limit of policy/automaton.py's count), on the run of `a`s that makes its DFA the
# largest; and the largest exponential DFA let through (`a[ab]{12}c`, 2^13 states; with
# 13 it is refused at load), on random `a`s and `b`s (eight texts in turn).
REGEX_RULES = {
    "regex-typical": r"\brm\s+-rf\s+/(\s|$)",
    "regex-costliest": "(a|b|c|d){690}Z",
    "regex-exponential": "a[ab]{12}c",
}
COMMAND_ROOM = MAX_ARGS_BYTES - len(b'{"command":""}')  # ASCII: args of exactly 64 KiB


def policy(one_rule: str) -> str:
    """`one_rule` (a policy whose rules come last) with the REGEX_RULES."""
    rules = "".join(
        f"  - name: {tool}\n"
        f"    match: {{tool: {tool}, args: {{command: {{regex: '{pattern}'}}}}}}\n"
        f"    deny: refused\n"
        for tool, pattern in REGEX_RULES.items()
    )
    return one_rule + rules


def commands(tool: str, *texts: str) -> bytes:
    """A check of `tool` whose `args.command` is each text in turn (one line each)."""
    lines = [to_json({"user": "u", "tool": tool, "args": {"command": t}}) for t in texts]
    assert all(len(to_json(json.loads(line)["args"])) <= MAX_ARGS_BYTES for line in lines)
    return b"\n".join(lines)


def random_ab(seed: int) -> str:
    return "".join(random.Random(seed).choices("ab", k=COMMAND_ROOM))


KEYS = b'{"user":"u","tool":"t","args":{'  # a check whose args are an object...
ESCAPED_COMMAS = b'\\"' + b"," * 62  # 64 bytes, 62 commas in a string: count them out
# The narrowest strings that fill the body cap without being more than 2 * MAX_ITEMS + 1.
STRING_WIDTH = -(-(BODY_CAP - ROOM) // (2 * MAX_ITEMS + 1)) + 1
# name -> the body; each is the worst of its kind found so far. Over MAX_ITEMS, a body is
# refused unread; within, it is read and validated.
BODIES: dict[str, Callable[[], bytes]] = {
    NORMAL: normal_checks,
    # -- over the item cap: refused before it is read
    "256 KiB of numbers": lambda: filled(CHECK, b"0,", b"0" + END),
    "256 KiB of arrays 30 deep": lambda: filled(CHECK, nested(30) + b",", b"[]" + END),
    "256 KiB of keys": lambda: filled(KEYS, b'"{n}":0,', b'"":0}}'),
    "256 KiB of unknown fields": lambda: filled(b'{"user":"u","tool":"t",', b'"{n}":0,', b'"":0}'),
    "256 KiB of empty strings": lambda: filled(CHECK, b'"",', b'""' + END),
    "256 KiB of escaped quotes": lambda: filled(CHECK, b'"\\"\\\\",', b'""' + END),
    # just few enough strings to be taken out, then counted to the end
    "256 KiB of strings of escaped commas": lambda: filled(
        CHECK, b'"' + ESCAPED_COMMAS[: STRING_WIDTH - 3] + b'",', b'""' + END
    ),
    f"batch: 10 000 calls (cap {MAX_BATCH})": lambda: filled(
        b'{"calls":[', b'{"user":"u","tool":"t"},', b'{"user":"u","tool":"t"}]}'
    ),
    # -- within the item cap: read, then validated
    "args at every cap (accepted)": largest_valid,
    f"{MAX_ITEMS} keys (accepted)": lambda: at_item_cap(KEYS, b'"{n}":0,', b'"":0}}'),
    f"{MAX_ITEMS} arrays 40 deep": lambda: at_item_cap(CHECK, nested(40) + b",", b"[]" + END),
    f"{MAX_ITEMS} unknown fields": lambda: at_item_cap(
        b'{"user":"u","tool":"t",', b'"{n}":0,', b'"":0}'
    ),
    f"metadata: {MAX_ITEMS} unknown fields": lambda: at_item_cap(
        b'{"user":"u","tool":"t","metadata":{', b'"{n}":0,', b'"":0}}'
    ),
    f"{MAX_ITEMS} keys and 190 KiB of escaped commas": lambda: at_item_cap(
        KEYS, b'"{n}":0,', b'"":"' + ESCAPED_COMMAS * 3000 + b'"}}'
    ),
    f"{MAX_ITEMS} keys, then a lone surrogate": lambda: at_item_cap(
        KEYS, b'"{n}":0,', b'"":"\\ud800"}}'
    ),
    f"{MAX_ITEMS} keys, then a 5 000-digit integer": lambda: at_item_cap(
        KEYS, b'"{n}":0,', b'"":' + b"1" * 5000 + b"}}"
    ),
    f"batch: {MAX_BATCH} calls at the item cap, the last refused": batch_refused_last,
    # -- a host's own HTTP hook: its cap is RATEWARDEN_MAX_HOOK_BODY_BYTES (issue 25)
    "hook: a normal Bash call": lambda: hook_payload(b'{"command":"ls -la"}'),
    "hook: strings of escapes to the hook cap": lambda: hook_filled(b'"' + b"\\u0001" * 170 + b'"'),
    "hook: one string of escapes to the hook cap": lambda: hook_one_string(b"\\u0001"),
    "hook: a string to the hook cap (a file to write)": lambda: hook_one_string(b"x"),
    f"hook: {MAX_ITEMS} items of empty arrays": lambda: hook_payload(
        b'{"command":"ls","k":[' + b"[]," * (MAX_ITEMS - 20) + b"[]]}"
    ),
    # -- argument conditions: a 64 KiB command against a regex (REGEX_RULES)
    f"64 KiB command, regex `{REGEX_RULES['regex-typical']}`": lambda: commands(
        "regex-typical", ("rm -rf " * COMMAND_ROOM)[:COMMAND_ROOM]
    ),
    f"64 KiB command, regex `{REGEX_RULES['regex-costliest']}`": lambda: commands(
        "regex-costliest", "a" * COMMAND_ROOM
    ),
    f"64 KiB command, regex `{REGEX_RULES['regex-exponential']}`": lambda: commands(
        "regex-exponential", *(random_ab(seed) for seed in range(8))
    ),
}
HOOK = "/v1/hooks/claude-code?user=u"


def hook_payload(tool_input: bytes) -> bytes:
    """Claude Code's PreToolUse payload around `tool_input` (JSON text)."""
    head = b'{"hook_event_name":"PreToolUse","tool_name":"Bash","session_id":"s",'
    return head + b'"tool_use_id":"toolu_1","tool_input":' + tool_input + b"}"


def hook_filled(string: bytes) -> bytes:
    """A tool input of strings `string` in one list, as many as the hook cap and the item
    cap allow."""
    count = min((HOOK_CAP - 1024) // (len(string) + 1), MAX_ITEMS - 20)
    return hook_payload(b'{"command":"ls","k":[' + b",".join([string] * count) + b"]}")


def hook_one_string(char: bytes) -> bytes:
    """A tool input of one string of `char` filling the hook cap."""
    room = (HOOK_CAP - 1024) // len(char)
    return hook_payload(b'{"command":"ls","content":"' + char * room + b'"}')


def path_of(name: str) -> str:
    if name.startswith("hook"):
        return HOOK
    return "/v1/check/batch" if name.startswith("batch") else "/v1/check"


@dataclass(frozen=True)
class Target:
    """A running daemon, and how to drive it."""

    python: str
    workdir: Path
    port: int
    pid: int
    warmup: float
    duration: float


def loadgen(
    target: Target, name: str, connections: int, rate: float = 0.0
) -> subprocess.Popen[str]:
    """A load generator sending the body `name` (bench/loadgen.py), started."""
    slug = "".join(char if char.isalnum() else "-" for char in name)
    bodies = target.workdir / f"worst-{slug}.jsonl"
    if not bodies.exists():
        bodies.write_bytes(BODIES[name]() + b"\n")
    command = [
        target.python, "-m", "bench.loadgen", "--port", str(target.port),
        "--path", path_of(name), "--bodies", str(bodies),
        "--connections", str(connections), "--rate", str(rate),
        "--warmup", str(target.warmup), "--duration", str(target.duration),
        "--watch", f"server={target.pid}",
    ]  # fmt: skip
    root = Path(__file__).resolve().parent.parent  # so `bench` imports
    return subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"load generator failed ({process.returncode})")
    result: dict[str, Any] = json.loads(out)
    return result


def cost(target: Target, name: str) -> dict[str, Any]:
    """The server's CPU per answered request, sending `name` alone."""
    result = finished(loadgen(target, name, connections=2))
    answered = sum(result["statuses"].values())
    if not answered or "server" not in result["cpu_s"]:
        raise RuntimeError(f"{name}: nothing measured ({result})")
    return {
        "bytes": len(BODIES[name]().split(b"\n")[0]),
        "statuses": result["statuses"],
        "requests_per_s": answered / target.duration,
        "server_cpu_us": result["cpu_s"]["server"] / answered * 1e6,
    }


def interference(target: Target, worst: str, rate: float) -> dict[str, Any]:
    """Other clients' latency at `rate` normal checks a second, alone, then while SENDERS
    connections send the body `worst` in a closed loop."""
    alone = finished(loadgen(target, NORMAL, connections=OTHERS, rate=rate))
    attack = loadgen(target, worst, connections=SENDERS)
    others = finished(loadgen(target, NORMAL, connections=OTHERS, rate=rate))
    sent = finished(attack)

    def latency(run: dict[str, Any]) -> dict[str, float]:
        # `answered`: of those due in the measured window, answered by the end of the drain
        return {key: run[key] for key in ("answered", "p50_ms", "p99_ms", "p999_ms", "max_ms")}

    return {
        "rate": rate,
        "worst": worst,
        "alone": latency(alone),
        "while_sent": latency(others),
        "worst_per_s": sum(sent["statuses"].values()) / target.duration,
    }


def measure_worst(target: Target, rate: float) -> dict[str, Any]:
    """Each body's cost, then the costliest one's effect on other clients at `rate`."""
    bodies = {name: cost(target, name) for name in BODIES}
    normal = bodies[NORMAL]["server_cpu_us"]
    for row in bodies.values():
        row["vs_normal"] = row["server_cpu_us"] / normal
    worst = max((n for n in bodies if n != NORMAL), key=lambda n: bodies[n]["vs_normal"])
    return {
        "bodies": bodies,
        "worst": worst,
        "worst_vs_normal": bodies[worst]["vs_normal"],
        "target": TARGET,
        "met": bodies[worst]["vs_normal"] <= TARGET,
        "interference": interference(target, worst, rate),
    }


def report(results: dict[str, Any]) -> list[str]:
    """The Markdown lines for bench/run.py's report."""
    lines = ["", "| body (within the caps) | bytes | answer | requests/s "
             "| server CPU us/request | x normal check |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name, row in results["bodies"].items():
        answer = ", ".join(row["statuses"])
        shown = name.replace("|", "\\|")  # a table cell: the pipe escaped
        lines.append(
            f"| {shown} | {row['bytes']} | {answer} | {row['requests_per_s']:.0f} "
            f"| {row['server_cpu_us']:.0f} | {row['vs_normal']:.1f} |"
        )
    seen = results["interference"]
    lines += [
        "",
        f"Worst body: {results['worst']}, {results['worst_vs_normal']:.1f} normal checks "
        f"(target <= {results['target']:.0f}: {'met' if results['met'] else 'NOT met'}). "
        f"Other clients at {seen['rate']:.0f} checks/s: {_latency(seen['alone'])} alone; "
        f"{_latency(seen['while_sent'])} while {SENDERS} connections send it "
        f"({seen['worst_per_s']:.0f}/s).",
    ]
    return lines


def _latency(run: dict[str, float]) -> str:
    if not run["answered"]:
        return "none answered"
    return (
        f"p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms ({run['answered']:.0f} answered)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worstbody", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="the daemon's process id")
    parser.add_argument("--rate", type=float, default=200.0, help="other clients' checks/s")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=3.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ratewarden-worst-") as tmp:
        target = Target(sys.executable, Path(tmp), args.port, args.pid, args.warmup, args.duration)
        results = measure_worst(target, args.rate)
    print("\n".join(report(results)))
    json.dump(results, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
