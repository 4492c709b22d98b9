"""Sees every write the fake kernel makes to guest memory (its copy_to_user), before it lands.

Installed as the Memory's backend: writes are reported, then passed on; every other operation is
the real backend's own bound method (no extra call on the kernel's reads)."""

from __future__ import annotations

from collections.abc import Callable

from emu.abi import Prot
from emu.vma import MemoryBackend, SharedPages

WriteSeen = Callable[[int, bytes], None]  # (address, the bytes about to be written)


class WatchedBackend:
    def __init__(self, backend: MemoryBackend, on_write: WriteSeen) -> None:
        self.backend = backend
        self.on_write = on_write
        self.mem_read: Callable[[int, int], bytes] = backend.mem_read
        self.mem_map: Callable[[int, int, Prot], None] = backend.mem_map
        self.mem_unmap: Callable[[int, int], None] = backend.mem_unmap
        self.mem_protect: Callable[[int, int, Prot], None] = backend.mem_protect
        self.flush_code: Callable[[int, int], None] = backend.flush_code
        self.mem_map_shared: Callable[[int, int, Prot, SharedPages, int], None] = backend.mem_map_shared

    def mem_write(self, addr: int, data: bytes) -> None:
        self.on_write(addr, data)
        self.backend.mem_write(addr, data)
