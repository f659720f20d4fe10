"""Who is refused, in the embedded store (store/base.py `ActivityLog`): the same sketches
and per-user lists as on Redis (store/redis_activity.py), with the same caps, in this
process only. Not in the state file: like the fleet's reports, a record of the recent
past, which a restart may lose."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ratewarden.store.base import SketchCounts, UserDenialCaps


@dataclass
class _Bucket:
    expires_at: int
    sketches: dict[str, dict[str, int]] = field(default_factory=dict)


def _trimmed(counts: dict[str, int], keep: int) -> dict[str, int]:
    """The `keep` highest, as Redis' ZREMRANGEBYRANK keeps them (ties by member)."""
    if len(counts) <= keep:
        return counts
    ranked = sorted(counts.items(), key=lambda item: (item[1], item[0]))
    return dict(ranked[len(ranked) - keep :])


class MemoryActivity:
    """The activity log of one `MemoryStore`; its caller holds the store's lock."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self._buckets: dict[str, _Bucket] = {}
        self._lists: dict[str, tuple[collections.deque[str], int]] = {}  # user -> (list, expiry)
        self._last: dict[str, int] = {}  # user -> last refusal (ms): the index

    def add_to_sketches(self, adds: Sequence[SketchCounts], keep: int) -> None:
        now = self._now_ms()
        self._buckets = {k: b for k, b in self._buckets.items() if b.expires_at > now}
        for add in adds:
            bucket = self._buckets.setdefault(add.bucket, _Bucket(now + add.ttl_ms))
            bucket.expires_at = now + add.ttl_ms
            for sketch, counts in add.counts.items():
                if not counts:
                    continue
                found = bucket.sketches.setdefault(sketch, {})
                for member, count in counts.items():
                    found[member] = found.get(member, 0) + count
                bucket.sketches[sketch] = _trimmed(found, keep)

    def read_sketches(self, buckets: Sequence[str], sketch: str) -> list[dict[str, int]]:
        return [dict(self._sketch(bucket, sketch)) for bucket in buckets]

    def sketch_scores(self, buckets: Sequence[str], sketch: str, member: str) -> list[int]:
        return [self._sketch(bucket, sketch).get(member, 0) for bucket in buckets]

    def _sketch(self, bucket: str, sketch: str) -> dict[str, int]:
        found = self._buckets.get(bucket)
        if found is None or found.expires_at <= self._now_ms():
            return {}
        return found.sketches.get(sketch, {})

    def push_user_denials(
        self, entries: Sequence[tuple[str, str]], now_ms: int, caps: UserDenialCaps
    ) -> None:
        expires_at = self._now_ms() + caps.ttl_ms  # as Redis' PEXPIRE: on the store's clock
        for user, line in entries:
            found = self._lists.get(user)
            lines = found[0] if found else collections.deque(maxlen=caps.keep)
            lines.appendleft(line)
            self._lists[user] = (lines, expires_at)
            self._last.pop(user, None)  # re-inserted last: the dict is the index, oldest first
            self._last[user] = now_ms
        for user in [u for u, at in self._last.items() if at <= now_ms - caps.ttl_ms]:
            self._forget(user)
        while len(self._last) > caps.users:
            self._forget(next(iter(self._last)))

    def _forget(self, user: str) -> None:
        del self._last[user]
        self._lists.pop(user, None)

    def user_denials(self, user: str, count: int) -> list[str]:
        found = self._lists.get(user)
        if found is None or found[1] <= self._now_ms():
            return []
        return list(found[0])[:count]

    def sizes(self) -> tuple[int, int, int]:
        """Members in the largest sketch, entries in the longest list, users indexed."""
        largest = max(
            (len(s) for b in self._buckets.values() for s in b.sketches.values()), default=0
        )
        longest = max((len(lines) for lines, _ in self._lists.values()), default=0)
        return largest, longest, len(self._last)
