"""Hits that repeat one Python judged, found in C (emu/hotpath_src/repeats.c), so that a design that
breaks the red zone the same way on every hit is judged once, not once a hit.

When the edges cannot settle a hit only because its red zone differs from the start, every register,
rip and rsp included, is as the site hook found it and no store landed outside (the edges tested
that first). If the kernel part of the hit also ran in C (the syscall front) and Python has no record
of the hit, what the checks read of it is its *evidence*: the site, the handler chain's path and the
kernel's exit, the red zone before and after, the guest's stores into it (pc, offset, size, value; at
most REPEAT_ENTRIES) and the code at each store's pc (the writer a violation names). The checks
are functions of that evidence and of the hit's number. So a hit whose evidence is that of a hit
Python judged has that hit's violations, with its own number: C keeps the number and settles the
hit, and Python makes the violations when anything next reads or adds to the log, in hit order
(ViolationLog.pull_from).

Python arms the memo with a hit it judged whose violations are all red-zone ones (arm). The fake
kernel writing guest memory, or the tracker binding new sites, disarms it.

Buffer layout (64-bit words; struct repeats in emu/hotpath_src/verify.h):
  0 armed   1 the transaction whose evidence the candidate holds   2 hits held back   3 their room
  4.. the memo's evidence, then the candidate's (EVIDENCE_BYTES each), then the hits' numbers
"""

from __future__ import annotations

import ctypes

ARMED, CANDIDATE_SEQ, COUNT, CAPACITY = range(4)
REPEAT_ENTRIES, REDZONE_WORDS, CODE_BYTES = 16, 16, 16  # as in verify.h
EVIDENCE_BYTES = 8 * (4 + 2 * REDZONE_WORDS + 4 * REPEAT_ENTRIES) + CODE_BYTES * REPEAT_ENTRIES
MEMO = 4 * 8
CANDIDATE = MEMO + EVIDENCE_BYTES
HITS = (CANDIDATE + EVIDENCE_BYTES) // 8  # the word of the first hit's number
HELD_BACK = 4096  # hits C holds back before a repeat goes to Python (which takes them first)


class RepeatedVerdicts:
    def __init__(self, capacity: int = HELD_BACK) -> None:
        self._buf = ctypes.create_string_buffer(8 * (HITS + capacity))
        self._words = memoryview(self._buf).cast("B").cast("Q")
        self._words[CAPACITY] = capacity

    @property
    def address(self) -> int:
        return ctypes.addressof(self._buf)

    @property
    def candidate_seq(self) -> int:
        """The transaction whose evidence C kept last (0: none)."""
        return self._words[CANDIDATE_SEQ]

    @property
    def armed(self) -> bool:
        return self._words[ARMED] != 0

    def arm(self) -> None:
        """The memo takes the candidate's evidence: C holds back the hits that repeat it."""
        base = self.address
        ctypes.memmove(base + MEMO, base + CANDIDATE, EVIDENCE_BYTES)
        self._words[ARMED] = 1

    def disarm(self) -> None:
        self._words[ARMED] = 0
        self._words[CANDIDATE_SEQ] = 0

    def take(self) -> list[int]:
        """The numbers of the hits held back since the last take, in hit order."""
        words = self._words
        count = words[COUNT]
        if not count:
            return []
        words[COUNT] = 0
        return words[HITS : HITS + count].tolist()
