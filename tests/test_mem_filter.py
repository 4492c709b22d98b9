"""The filtered memory hooks (emu/hotpath/mem_filter.py): Python sees the loads and stores of the
watched bytes, and with the C extension no other."""

from __future__ import annotations

import struct

import pytest
from conftest import built_extension

from emu import hotpath
from emu.abi import Prot
from emu.cpu import Cpu, Reg
from emu.hotpath.mem_filter import FilteredMemHooks, ranges_of

CODE, DATA = 0x10000, 0x20000


EXTENSION = built_extension("memfilter_hook")
needs_extension = pytest.mark.skipif(EXTENSION is None, reason="the C extension is not built on this host")


def test_ranges_of_joins_consecutive_bytes() -> None:
    assert ranges_of([]) == []
    assert ranges_of([5, 3, 4, 9, 9, 10, 20]) == [(3, 6), (9, 11), (20, 21)]


def _program() -> bytes:
    """Eight times: load qword [DATA + 8 * i], store it to [DATA + 0x100 + 8 * i]; then hlt."""
    code = b""
    for i in range(8):
        code += b"\x48\x8b\x04\x25" + struct.pack("<I", DATA + 8 * i)  # mov rax, [abs]
        code += b"\x48\x89\x04\x25" + struct.pack("<I", DATA + 0x100 + 8 * i)  # mov [abs], rax
    return code + b"\xf4"


def _run(watched: list[int], capacity: int = 32) -> tuple[list[tuple[str, int]], FilteredMemHooks]:
    cpu = Cpu()
    cpu.mem_map(CODE, 0x1000, Prot.READ | Prot.EXEC)
    cpu.mem_map(DATA, 0x1000, Prot.READ | Prot.WRITE)
    cpu.mem_write(CODE, _program())
    seen: list[tuple[str, int]] = []

    def on_read(_uc: object, _t: int, addr: int, _s: int, _v: int, _ud: object) -> bool:
        seen.append(("read", addr))
        return True

    def on_write(_uc: object, _t: int, addr: int, _s: int, _v: int, _ud: object) -> bool:
        seen.append(("write", addr))
        return True

    hooks = FilteredMemHooks(cpu.hooks, on_read, on_write, capacity=capacity)
    hooks.watch(watched)
    cpu.write(Reg.RSP, DATA + 0x800)
    cpu.run(CODE)  # the hlt faults at CPL 3: the run ends there
    return seen, hooks


ALL = [("read", DATA + 8 * i) for i in range(8)] + [("write", DATA + 0x100 + 8 * i) for i in range(8)]


@needs_extension
def test_with_the_extension_python_sees_only_the_watched_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hotpath, "native", EXTENSION)
    seen, hooks = _run([DATA + 8 + 7, DATA + 0x100 + 24])  # the last byte of one load, the first of one store
    assert seen == [("read", DATA + 8), ("write", DATA + 0x100 + 24)]
    assert hooks.passed == 2
    nothing, _ = _run([])
    assert nothing == []


@needs_extension
def test_more_ranges_than_the_table_holds_pass_every_access(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hotpath, "native", EXTENSION)
    seen, _ = _run([DATA + 0x800 + 2 * i for i in range(3)], capacity=2)  # three ranges nobody touches
    assert sorted(seen) == sorted(ALL)


def test_without_the_extension_python_sees_every_access(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure-Python mode cannot filter in C: the callbacks get every access and filter themselves."""
    monkeypatch.setattr(hotpath, "native", None)
    seen, hooks = _run([DATA])
    assert sorted(seen) == sorted(ALL) and hooks.passed is None
