"""The fake kernel's writes to guest memory (its copy_to_user), seen before they land by a Memory
backend that passes everything on, and which of them are the kernel's right during a hit."""

from __future__ import annotations

from collections.abc import Callable

from emu.abi import RED_ZONE, Prot
from emu.hotpath.write_log import classify
from emu.memory import Memory
from emu.vma import MemoryBackend, SharedPages

KERNEL_SIDE = frozenset({"[uprobes-trampoline]", "[uprobes]"})  # the pages the kernel maps for uprobes


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


class WatchedBackend:
    """Reports each write, then passes it on; every other operation is the backend's own bound method."""

    def __init__(self, backend: MemoryBackend, on_write: Callable[[int, bytes], None]) -> None:  # (address, bytes)
        self.backend, self.on_write = backend, on_write
        self.mem_read: Callable[[int, int], bytes] = backend.mem_read
        self.mem_map: Callable[[int, int, Prot], None] = backend.mem_map
        self.mem_unmap: Callable[[int, int], None] = backend.mem_unmap
        self.mem_protect: Callable[[int, int, Prot], None] = backend.mem_protect
        self.flush_code: Callable[[int, int], None] = backend.flush_code
        self.mem_map_shared: Callable[[int, int, Prot, SharedPages, int], None] = backend.mem_map_shared

    def mem_write(self, addr: int, data: bytes) -> None:
        self.on_write(addr, data)
        self.backend.mem_write(addr, data)
