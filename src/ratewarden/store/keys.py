"""Every Redis key ratewarden writes, and why each lives as long as it does.

Key shape: `rw:{<rule>|<dimension>=<value>|...}:<algorithm>`, for example
`rw:{terminal-per-minute|user=discord%3A1234}:sw`.

- Rule names and dimension values are percent-encoded with nothing left unescaped but
  letters, digits and `-._~`, so no user or tool string (braces, colons, `|`, `=`,
  newlines, NULs, any Unicode) can produce another counter's key: the encoding is
  injective and the separators never appear inside a part.
- Everything that identifies one counter sits inside the `{...}` hash tag, so a
  counter's keys always land on one cluster node.
- The algorithm is part of the key so that a reload that changes a rule's algorithm
  starts a fresh counter instead of misreading the old one's bytes.
- Dimensions absent from a call (no session given) encode as empty; requests never
  carry empty strings, so "absent" cannot collide with a real value.

TTLs (each key expires once it can no longer change a decision):
- sliding window (`sw`): the window length, refreshed at every admission: once the
  newest admission has left the window, the counter holds nothing that counts.
- token bucket (`tb`): until the theoretical arrival time, when the bucket is full again.
- fixed window (`fw`): until the end of the current clock-aligned window.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import quote

from ratewarden.limiter.ops import ALGORITHM_CODES
from ratewarden.policy.model import Algorithm

PREFIX = "rw"


@lru_cache(maxsize=65_536)
def encode(part: str) -> str:
    """Percent-encode one key part; cached because the same users and tools recur."""
    return quote(part, safe="")


def counter_key(rule: str, algorithm: Algorithm, scope: Iterable[tuple[str, str | None]]) -> str:
    """The key of one rule's counter for one scope (the `per` dimensions and their values)."""
    tag = "|".join([encode(rule), *(f"{dim}={encode(value or '')}" for dim, value in scope)])
    return f"{PREFIX}:{{{tag}}}:{ALGORITHM_CODES[algorithm]}"


def all_keys_pattern() -> str:
    """A SCAN pattern matching every key ratewarden owns."""
    return f"{PREFIX}:{{*"
