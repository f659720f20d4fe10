"""A glob of `*` and literal text matches without a regular expression (policy/model.py
`StarGlob`), and exactly as fnmatch does: property-tested against `fnmatchcase`."""

from __future__ import annotations

import fnmatch

from hypothesis import given
from hypothesis import strategies as st

from ratewarden.policy.model import NameSet, StarGlob, compile_glob

PATTERNS = st.text(alphabet="ab*.-\n", min_size=1, max_size=9).filter(lambda p: "*" in p)
NAMES = st.text(alphabet="ab.-\n*", max_size=12)


@given(PATTERNS, NAMES)
def test_a_star_glob_matches_as_fnmatch_does(pattern: str, name: str) -> None:
    glob = compile_glob(pattern)
    assert isinstance(glob, StarGlob)
    assert glob.match(name) == fnmatch.fnmatchcase(name, pattern)


@given(st.text(alphabet="ab?[]!*", min_size=1, max_size=8), NAMES)
def test_any_other_glob_matches_as_fnmatch_does(pattern: str, name: str) -> None:
    assert bool(compile_glob(pattern).match(name)) == fnmatch.fnmatchcase(name, pattern)


def test_a_name_set_of_star_globs() -> None:
    names = NameSet.of(["browser_*", "*-bot", "mcp__*__read*", "exact"])
    assert "browser_open" in names
    assert "ci-bot" in names
    assert "mcp__files__read_file" in names
    assert "mcp__files__write" not in names
    assert "exact" in names
    assert "exactly" not in names
    assert "-bot" in names  # `*` matches nothing too
