"""Function bounds without symbols: the unwind tables (.eh_frame_hdr's search table, then the FDE).

A stripped binary keeps .eh_frame for unwinding: each FDE gives a function's first address and
length. The search table in .eh_frame_hdr is sorted by first address, so one FDE is read per
lookup. Only the encodings GCC and Clang emit on x86-64 are read (table: datarel sdata4; FDE:
pcrel sdata4); anything else gives no bounds, and the site stays `unknown`.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile

DATAREL_SDATA4, PCREL_SDATA4 = 0x3B, 0x1B


@dataclass(frozen=True, slots=True)
class UnwindBounds:
    starts: tuple[int, ...]  # sorted function starts from the search table
    fdes: tuple[int, ...]  # the FDE address of each
    eh_frame: tuple[int, bytes]  # (address, data) of .eh_frame

    @classmethod
    def read(cls, elf: ELFFile) -> UnwindBounds | None:
        hdr, frame = elf.get_section_by_name(".eh_frame_hdr"), elf.get_section_by_name(".eh_frame")
        if hdr is None or frame is None:
            return None
        data, base = hdr.data(), hdr["sh_addr"]
        if len(data) < 12 or data[0] != 1 or data[3] != DATAREL_SDATA4 or data[2] != 0x03:  # count: udata4
            return None
        count = struct.unpack_from("<I", data, 8)[0]
        if len(data) < 12 + 8 * count:
            return None
        pairs = struct.unpack_from(f"<{2 * count}i", data, 12)
        order = sorted(zip(pairs[::2], pairs[1::2], strict=True))
        return cls(tuple(base + s for s, _ in order), tuple(base + f for _, f in order),
                   (frame["sh_addr"], frame.data()))

    def around(self, address: int) -> tuple[int, int] | None:
        """(start, size) of the FDE covering ``address``."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0:
            return None
        frame_addr, frame = self.eh_frame
        at = self.fdes[i] - frame_addr
        if not 0 <= at <= len(frame) - 16:
            return None
        pc_field = self.fdes[i] + 8
        begin, size = struct.unpack_from("<iI", frame, at + 8)
        start = pc_field + begin
        if start != self.starts[i] or not start <= address < start + size:  # another encoding, or a gap
            return None
        return start, size
