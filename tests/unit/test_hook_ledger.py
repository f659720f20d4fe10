"""The ledger of open calls (ratewarden.hooks.ledger): what a PostToolUse takes back, how
long anything stays, and many hook processes at once."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from ratewarden import vocabulary
from ratewarden.hooks import ledger

NOW = 1_800_000_000_000  # ms
K = ("k", "group")  # a call's keys: the most telling first
OTHER = ("other", "group 2")


@pytest.fixture
def where(tmp_path: Path) -> str:
    found = ledger.folder("codex", {"HOME": str(tmp_path)})
    assert found == str(tmp_path / ".cache" / "ratewarden" / "codex")
    return found


def files(where: str) -> list[str]:
    return sorted(os.listdir(where))


def session_file(where: str, session: str) -> str:
    return os.path.join(where, vocabulary.digest(session) + ledger.SUFFIX)


def test_a_kept_id_is_taken_once(where: str) -> None:
    ledger.keep(where, "s1", K, "call_0~a", NOW)
    assert ledger.take(where, "s1", K, NOW) == "call_0~a"
    assert ledger.take(where, "s1", K, NOW) is None
    assert files(where) == [".lock"]  # a session's file goes with its last id


def test_the_newest_id_under_a_key_is_taken_first(where: str) -> None:
    # A call allowed that never ran (another hook refused it) leaves its id: the next
    # call under that key is still closed by its own PostToolUse.
    for call in ("left", "a", "b"):
        ledger.keep(where, "s1", K, call, NOW)
    ledger.keep(where, "s1", OTHER, "c", NOW)
    assert ledger.take(where, "s1", K, NOW) == "b"
    assert ledger.take(where, "s1", K, NOW) == "a"
    assert ledger.take(where, "s1", OTHER, NOW) == "c"
    assert ledger.take(where, "s1", K, NOW) == "left"


def test_an_id_not_found_by_its_first_key_is_found_by_its_second(where: str) -> None:
    # Another hook rewrote the input: the PostToolUse's first key is not the one kept.
    ledger.keep(where, "s1", ("input 1", "call_0 Bash"), "a", NOW)
    ledger.keep(where, "s1", ("input 2", "call_0 Bash"), "b", NOW)
    assert ledger.take(where, "s1", ("input 1", "call_0 Bash"), NOW) == "a"  # first key first
    assert ledger.take(where, "s1", ("rewritten", "call_0 Edit"), NOW) is None
    assert ledger.take(where, "s1", ("rewritten", "call_0 Bash"), NOW) == "b"


def test_sessions_do_not_share_ids(where: str) -> None:
    ledger.keep(where, "s1", K, "one", NOW)
    assert ledger.take(where, "s2", K, NOW) is None
    assert ledger.take(where, "s1", K, NOW) == "one"


def test_a_session_keeps_at_most_max_open_ids(where: str) -> None:
    for n in range(ledger.MAX_OPEN + 5):
        ledger.keep(where, "s1", K, f"id{n}", NOW)
    taken = [ledger.take(where, "s1", K, NOW) for _ in range(ledger.MAX_OPEN + 5)]
    assert taken[: ledger.MAX_OPEN] == [f"id{n}" for n in range(ledger.MAX_OPEN + 4, 4, -1)]
    assert taken[ledger.MAX_OPEN :] == [None] * 5  # the oldest five went


def test_an_id_older_than_max_age_is_gone(where: str) -> None:
    ledger.keep(where, "s1", K, "old", NOW)
    ledger.keep(where, "s1", K, "new", NOW + ledger.MAX_AGE_MS - 1)
    later = NOW + ledger.MAX_AGE_MS
    assert ledger.take(where, "s1", K, later) == "new"
    assert ledger.take(where, "s1", K, later) is None
    assert files(where) == [".lock"]


def test_a_new_session_sweeps_files_left_for_a_day(where: str) -> None:
    ledger.keep(where, "ended", K, "left", NOW)
    left_at_s = (NOW - ledger.MAX_AGE_MS) / 1000
    os.utime(session_file(where, "ended"), (left_at_s, left_at_s))
    (Path(where) / "x.json.123.tmp").write_text("[")  # a hook killed mid-write
    os.utime(os.path.join(where, "x.json.123.tmp"), (left_at_s, left_at_s))
    ledger.keep(where, "fresh", K, "id", NOW)
    assert len(files(where)) == 2  # the lock and the fresh session's file
    assert ledger.take(where, "ended", K, NOW) is None


def test_at_most_max_sessions_files(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "MAX_SESSIONS", 3)
    for n in range(5):
        ledger.keep(where, f"s{n}", K, f"id{n}", NOW)
        at_s = NOW / 1000 - 100 + n  # in the order they were written, on the test's clock
        os.utime(session_file(where, f"s{n}"), (at_s, at_s))
    assert len(files(where)) == 1 + 3
    assert [ledger.take(where, f"s{n}", K, NOW) for n in range(5)] == [
        None, None, "id2", "id3", "id4"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "content", ["[", '{"a": 1}', '[[["k"], "id"]]', '[[["k"], "id", true]]', '[["k", "id", 1]]']
)
def test_a_file_it_did_not_write_reads_as_no_ids(where: str, content: str) -> None:
    ledger.keep(where, "s1", K, "id", NOW)
    [name] = [name for name in files(where) if name != ".lock"]
    (Path(where) / name).write_text(content)
    assert ledger.take(where, "s1", K, NOW) is None
    ledger.keep(where, "s1", K, "again", NOW)
    assert ledger.take(where, "s1", K, NOW) == "again"


def test_the_file_holds_ids_and_digests_only(where: str) -> None:
    key = ledger.key("call_0", "Bash", {"command": "echo secret-value"})
    ledger.keep(where, "s1", (key,), "call_0~1234", NOW)
    [name] = [name for name in files(where) if name != ".lock"]
    text = (Path(where) / name).read_text()
    assert "secret-value" not in text
    assert json.loads(text) == [[[key], "call_0~1234", NOW]]
    assert oct(os.stat(os.path.join(where, name)).st_mode & 0o777) == "0o600"
    assert oct(os.stat(where).st_mode & 0o777) == "0o700"


def test_keys_read_the_input_whatever_the_order_of_its_fields() -> None:
    assert ledger.key("c", "Bash", {"a": 1, "b": 2}) == ledger.key("c", "Bash", {"b": 2, "a": 1})
    assert ledger.key("c", "Bash", {"a": 1}) != ledger.key("c", "Bash", {"a": 2})
    assert ledger.key("c", "Bash", {"a": 1}) != ledger.key("c", "Edit", {"a": 1})
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert ledger.key("c", "Bash", deep) == ledger.key("c", "Bash", None)  # unreadable: None


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"HOME": "relative"}, None),
        ({"HOME": "/h", "XDG_CACHE_HOME": "{tmp}/cache"}, "{tmp}/cache/ratewarden/codex"),
        ({"HOME": "{tmp}/h", "XDG_RUNTIME_DIR": "{tmp}/run"}, "{tmp}/run/ratewarden/codex"),
        ({"HOME": "{tmp}/h", "XDG_RUNTIME_DIR": "{tmp}/no"}, "{tmp}/h/.cache/ratewarden/codex"),
    ],
)  # fmt: skip
def test_where_the_ledger_is(tmp_path: Path, environ: dict[str, str], expected: str | None) -> None:
    (tmp_path / "run").mkdir()
    filled = {name: value.format(tmp=tmp_path) for name, value in environ.items()}
    found = ledger.folder("codex", filled)
    assert found == (None if expected is None else expected.format(tmp=tmp_path))


def test_no_ledger_where_the_folder_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert ledger.folder("codex", {"HOME": str(tmp_path / "file")}) is None


def _open_then_close(where: str, worker: int, rounds: int) -> list[str | None]:
    """What one hook process after another does: keep a few ids under one key, then take
    as many; then keep one and take one, again and again."""
    opened = [f"w{worker}-{n}" for n in range(7)]  # 8 workers x 7: within MAX_OPEN
    for call in opened:
        ledger.keep(where, "s1", K, call, NOW)
    taken = [ledger.take(where, "s1", K, NOW) for _ in opened]
    for n in range(rounds):
        ledger.keep(where, "s1", K, f"w{worker}-r{n}", NOW)
        taken.append(ledger.take(where, "s1", K, NOW))
    return taken


def test_many_hook_processes_at_once_lose_and_repeat_no_id(where: str) -> None:
    # Codex runs parallel calls' hooks at once: 8 processes on the same session, key and
    # file; every id kept is taken exactly once.
    workers, rounds = 8, 30
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        taken = pool.starmap(_open_then_close, [(where, w, rounds) for w in range(workers)])
    flat = [call for batch in taken for call in batch]
    kept = [f"w{w}-{n}" for w in range(workers) for n in range(7)]
    kept += [f"w{w}-r{n}" for w in range(workers) for n in range(rounds)]
    assert None not in flat
    assert sorted(c for c in flat if c is not None) == sorted(kept)  # None: asserted out
    assert files(where) == [".lock"]
