"""What a hit writes elsewhere (``memory``): a hit may write only below the red zone (the design's
scratch, on the interrupted thread's own stack) and into the kernel's own pages; any other byte it
leaves changed that the original instruction would not have is reported with its address, old and
new bytes and writer. The fake kernel's writes are seen before they land (emu/process/vma.py's WatchedBackend)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from emu.abi import RED_ZONE, Prot
from emu.hotpath.write_log import classify
from emu.hotpath.write_log import entries as log_entries
from emu.process.vma import KERNEL_SIDE
from emu.verify.expected import Expected
from emu.verify.records import Transaction, path_name, violation
from emu.violations import Check, Violation

if TYPE_CHECKING:
    from emu.process.memory import Memory

Reader = Callable[[int, int], bytes | None]  # (address, size) -> the guest's bytes now (None: unmapped)


def kernel_page(mem: Memory, addr: int) -> bool:
    """``addr`` lies in a mapping the kernel made for uprobes or one user code cannot write (text the
    kernel patches probe sites in): no user store lands there by the design's mistake."""
    vma = mem.find(addr)
    return vma is not None and (vma.name in KERNEL_SIDE or not vma.prot & Prot.WRITE)


def outside_the_hits_share(mem: Memory, addr: int, data: bytes, rsp: int) -> bool:
    """A kernel write during a hit at ``rsp`` that the memory check must see: outside the red zone, the
    scratch and the kernel's own pages, and not a uretprobe's return-address hijack (spec 5.1)."""
    if addr == rsp and len(data) == 8 and kernel_page(mem, int.from_bytes(data, "little")):
        return False  # the return address replaced by the uretprobe trampoline's (first: on every uretprobe hit)
    if classify(addr, len(data), rsp - RED_ZONE) != 2:
        return False
    vma = mem.find(addr)
    return vma is not None and vma.name not in KERNEL_SIDE and bool(vma.prot & Prot.WRITE)


def _allowed(mem: Memory, tx: Transaction, addr: int, size: int) -> bool:
    """A guest store there is the hit's right: the kernel's own pages, or the design's scratch deeper
    than the write log's SCRATCH below the red zone, on the interrupted thread's own stack."""
    if kernel_page(mem, addr):
        return True
    stack = mem.find(tx.start_rsp)
    return stack is not None and stack.start <= addr and addr + size <= tx.redzone_base


def outside_writes(tx: Transaction, mem: Memory, describe: Callable[[int], str]) -> dict[int, tuple[int, str]]:
    """Each byte written during ``tx`` outside the red zone and the scratch: (its first old value, the last writer)."""
    written: dict[int, tuple[int, str]] = {}

    def note(addr: int, old: bytes, writer: str) -> None:
        for i, byte in enumerate(old):
            first = written.get(addr + i)
            written[addr + i] = (byte if first is None else first[0], writer)

    for chunk in tx.logged:
        for pc, addr, size, _value, old_word in log_entries(chunk):
            if classify(addr, size, tx.redzone_base) == 2 and not _allowed(mem, tx, addr, size):
                note(addr, old_word.to_bytes(8, "little")[:size], f"guest code at {pc:#x}: {describe(pc)}")
    for addr, old_bytes, _new in tx.kernel_stores:
        note(addr, old_bytes, "the fake kernel (copy_to_user)")
    return written


def check_unseen(tx: Transaction, describe: Callable[[int], str]) -> list[Violation]:
    """An instruction of the hit whose stores cannot be told from its text (emu/cpu/memops.py): the
    check cannot say what it wrote, so it says that."""
    count, pc = tx.unseen
    if not count:
        return []
    return [violation(Check.MEMORY, tx, f"the stores of {count} instruction(s) could not be followed, the first "
                       f"at {pc:#x}: {describe(pc)}", path=path_name(tx))]


def check_memory(tx: Transaction, exp: Expected, read: Reader, mem: Memory,
                 describe: Callable[[int], str]) -> list[Violation]:
    if not tx.outside:
        return []
    written = outside_writes(tx, mem, describe)
    stored = {addr + i: byte for addr, data in exp.stores for i, byte in enumerate(data)}
    found: list[Violation] = []
    for lo, hi, writer in _byte_runs(written):
        now = read(lo, hi - lo) or b""
        old = bytes(written[a][0] for a in range(lo, hi))
        if len(now) == hi - lo and all(stored.get(a) == now[a - lo] for a in range(lo, hi)):
            continue  # what the instruction itself stores there
        found.append(_memory(tx, lo, old, now, writer))
    if tx.unrecorded and not found:
        found.append(violation(Check.MEMORY, tx, "more stores than the write log holds: some were not seen",
                               path=path_name(tx)))
    return found


def _byte_runs(written: dict[int, tuple[int, str]]) -> list[tuple[int, int, str]]:
    """The written bytes as runs [lo, hi) of consecutive addresses with one last writer."""
    runs: list[tuple[int, int, str]] = []
    for addr in sorted(written):
        writer = written[addr][1]
        if runs and runs[-1][1] == addr and runs[-1][2] == writer:
            runs[-1] = (runs[-1][0], addr + 1, writer)
        else:
            runs.append((addr, addr + 1, writer))
    return runs


def _memory(tx: Transaction, addr: int, old: bytes, new: bytes, writer: str) -> Violation:
    where = addr - tx.start_rsp
    place = f"rsp{where:+d}" if 0 <= where < 1 << 20 else f"{addr:#x}"
    summary = f"{place} ({len(old)} bytes at {addr:#x}) {old.hex()} -> {new.hex() or '?'} by {writer}"
    return violation(Check.MEMORY, tx, summary, address=hex(addr), size=len(old), old=old.hex(), new=new.hex(),
                      writer=writer, path=path_name(tx))
