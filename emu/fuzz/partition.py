"""Which case indices a shard and a worker run: deterministic, disjoint, and together complete.

Campaign indices start at ``start``; shard I of N takes the indices i with i % N == I; worker j
of J takes every J-th of those, beginning with its j-th. ``--cases C`` bounds the campaign
(not the shard) to [start, start + C), so N machines with the same C cover it exactly once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from emu.errors import UsageError


@dataclass(frozen=True, slots=True)
class Partition:
    start: int = 0
    cases: int | None = None  # None: unbounded (a --time campaign)
    shard: int = 0
    shards: int = 1
    worker: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.shard < self.shards or not 0 <= self.worker < self.workers or self.start < 0:
            raise UsageError(f"bad partition: shard {self.shard}/{self.shards}, worker {self.worker}/{self.workers}")

    @property
    def stride(self) -> int:
        return self.shards * self.workers

    def first(self) -> int:
        """This worker's first index."""
        first_of_shard = self.start + (self.shard - self.start) % self.shards
        return first_of_shard + self.worker * self.shards

    def indices(self) -> Iterator[int]:
        stop = None if self.cases is None else self.start + self.cases
        counter = itertools.count(self.first(), self.stride)
        return counter if stop is None else itertools.takewhile(lambda i: i < stop, counter)

    def next_after(self, index: int) -> int:
        return index + self.stride


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` with 0 <= I < N."""
    left, sep, right = text.partition("/")
    try:
        shard, shards = int(left), int(right)
    except ValueError:
        raise UsageError(f"--shard wants I/N (like 0/4), got {text!r}") from None
    if not sep or shards < 1 or not 0 <= shard < shards:
        raise UsageError(f"--shard {text!r}: needs 0 <= I < N")
    return shard, shards
