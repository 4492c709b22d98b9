"""Hits that repeat one Python judged, found in C (emu/hotpath_src/repeats.c), so that a design that
breaks the red zone the same way on every hit is judged once a site, not once a hit.

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

C keeps one judged hit's evidence (a memo) for each of SLOTS slots, a site's slot chosen by its
address; two sites that share a slot take turns. Python arms the candidate's slot with a hit it
judged whose violations are all red-zone ones (arm). The fake kernel writing guest code (a mapping
that can run), or the tracker binding new sites, disarms every slot.

Buffer layout (64-bit words; struct repeats in emu/hotpath_src/verify.h):
  0 the transaction whose evidence the candidate holds   1 its slot   2 hits held back   3 their room
  4.. armed, a word a slot; then the candidate's evidence and each slot's memo (EVIDENCE_BYTES each);
  then (slot, hit number) of each hit held back
"""

from __future__ import annotations

import ctypes

from emu import hotpath

SLOTS = hotpath.constant("REPEAT_SLOTS", 16)
REPEAT_ENTRIES, REDZONE_WORDS, CODE_BYTES = 16, 16, 16  # as in verify.h: the evidence's size without the extension
_HEADER = "candidate_seq candidate_slot count capacity"
_EVIDENCE = 8 * (4 + 2 * REDZONE_WORDS + 4 * REPEAT_ENTRIES) + CODE_BYTES * REPEAT_ENTRIES
_LAYOUT = hotpath.struct_layout("repeats", [(name, 8) for name in _HEADER.split()] + [
    ("armed", 8 * SLOTS), ("candidate", _EVIDENCE), ("memo", SLOTS * _EVIDENCE), ("hits", 0)])
CANDIDATE_SEQ, CANDIDATE_SLOT, COUNT, CAPACITY, ARMED, HITS = hotpath.words(_LAYOUT, _HEADER + " armed hits")
CANDIDATE, MEMOS = _LAYOUT["candidate"], _LAYOUT["memo"]  # byte offsets
EVIDENCE_BYTES = MEMOS - CANDIDATE  # one struct evidence
HELD_BACK = 4096  # hits C holds back before a repeat goes to Python (which takes them first)


class RepeatedVerdicts:
    def __init__(self, capacity: int = HELD_BACK) -> None:
        self._buf = ctypes.create_string_buffer(8 * (HITS + 2 * capacity))
        self._words = memoryview(self._buf).cast("B").cast("Q")
        self._words[CAPACITY] = capacity
        self._armed = False  # some slot may be armed (disarm() then clears them)

    @property
    def address(self) -> int:
        return ctypes.addressof(self._buf)

    @property
    def candidate_seq(self) -> int:
        """The transaction whose evidence C kept last (0: none)."""
        return self._words[CANDIDATE_SEQ]

    @property
    def holding(self) -> bool:
        """A slot may be armed or a candidate waits: what disarm() would clear."""
        return self._armed or bool(self._words[CANDIDATE_SEQ])

    def arm(self) -> int:
        """The candidate's slot takes its evidence: C holds back the hits that repeat it. The slot."""
        slot = self._words[CANDIDATE_SLOT]
        base = self.address
        ctypes.memmove(base + MEMOS + slot * EVIDENCE_BYTES, base + CANDIDATE, EVIDENCE_BYTES)
        self._words[ARMED + slot] = 1
        self._armed = True
        return slot

    def disarm(self) -> None:
        """No slot compares hits any more, and the candidate cannot be armed (the fake kernel calls
        this on every write into guest code: cheap while nothing is armed)."""
        self._words[CANDIDATE_SEQ] = 0
        if self._armed:
            ctypes.memset(self.address + 8 * ARMED, 0, 8 * SLOTS)
            self._armed = False

    def take(self) -> list[int]:
        """(slot, hit number) of each hit held back since the last take, flat, in hit order."""
        words = self._words
        count = words[COUNT]
        if not count:
            return []
        words[COUNT] = 0
        return words[HITS : HITS + 2 * count].tolist()
