"""Probes on a shared library: installed when the library is mapped executable (uprobe_mmap)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from emu.designs import DESIGNS
from emu.errors import UsageError
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.libprobes import LibraryProbe
from emu.machine import Machine, RunOptions

HELLO = str(Path(__file__).resolve().parent.parent / "elf_samples" / "hello_dynamic")
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
pytestmark = pytest.mark.skipif(not Path(LIBC).exists(), reason=f"{LIBC} absent")


def machine(design: str = "linux-6.18") -> tuple[Machine, GuestIO]:
    io = GuestIO.captured()
    return Machine(HELLO, [HELLO], {}, RunOptions(design=design), io), io


@pytest.mark.parametrize("design", list(DESIGNS))
def test_libc_function_probed_after_ld_so_maps_it(design: str) -> None:
    m, io = machine(design)
    seen: list[int] = []
    probe = m.attach(f"uprobe:{LIBC}:fwrite", Consumer(handler=lambda hit: seen.append(hit.regs.di)))
    assert isinstance(probe, LibraryProbe) and probe.installed == []  # libc is not mapped yet
    result = m.run()
    assert (result.exit_status, bytes(io.out)) == (0, b"hello, world\n")
    assert len(probe.installed) == 1 and len(seen) == 1
    text = next(v for v in m.mem if v.start <= probe.installed[0].address < v.end)
    assert text.name.endswith("libc.so.6") and text.prot & 4
    # fwrite(ptr, size, nmemb, stream): the first argument points at the string
    assert m.mem.read(seen[0], 13) == b"hello, world\n"


def test_uretprobe_in_libc_sees_return_values() -> None:
    m, _ = machine()
    returned: list[int] = []

    def on_return(hit: Hit) -> None:
        returned.append(hit.regs.ax)

    probe = m.attach(f"uretprobe:{LIBC}:malloc", Consumer(ret_handler=on_return))
    m.run()
    assert probe.summary()["hits"] == len(returned) >= 1
    heap = [v for v in m.mem if v.name == "[heap]"]
    assert all(any(v.start <= p < v.end for v in heap) for p in returned)


def test_refusals_name_the_problem() -> None:
    m, _ = machine()
    with pytest.raises(UsageError, match="did you mean"):
        m.attach(f"uprobe:{LIBC}:fwriet")
    with pytest.raises(UsageError, match="no library"):
        m.attach("uprobe:/lib/no-such-lib.so:f")


def test_detached_library_probe_is_not_installed_later() -> None:
    m, _ = machine()
    probe = m.attach(f"uprobe:{LIBC}:fwrite")
    assert isinstance(probe, LibraryProbe)
    probe.detach()
    m.run()
    assert probe.installed == [] and probe.consumer.hits == 0


def _dynsym(path: str, name: str) -> int:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(path, "rb") as fh:
        table = ELFFile(fh).get_section_by_name(".dynsym")
        assert isinstance(table, SymbolTableSection)
        found = table.get_symbol_by_name(name)
        assert found, name
        return int(found[0]["st_value"])


def test_a_link_time_address_in_a_library_is_where_the_library_is_mapped() -> None:
    """uprobe:LIB:0xADDR names the address as scan and survey print it; the probe lands on fwrite's first
    instruction wherever ld.so maps libc (before, the address was taken as absolute: never installed)."""
    by_name, by_address = machine(), machine()
    named = by_name[0].attach(f"uprobe:{LIBC}:fwrite")
    addressed = by_address[0].attach(f"uprobe:{LIBC}:{_dynsym(LIBC, 'fwrite'):#x}")
    by_name[0].run()
    by_address[0].run()
    assert isinstance(named, LibraryProbe) and isinstance(addressed, LibraryProbe)
    assert [i.address for i in addressed.installed] == [i.address for i in named.installed] != []
    assert addressed.consumer.hits == named.consumer.hits == 1


def test_a_library_address_outside_its_code_is_refused() -> None:
    m, _io = machine()
    with pytest.raises(UsageError, match="not in the code of"):
        m.attach(f"uprobe:{LIBC}:0x10")


def test_an_instruction_the_design_refuses_leaves_the_mapping_and_the_run_alone() -> None:
    """uprobe_mmap skips a probe it cannot install: libc's first `nopw %cs:(...)` (a 10-byte NOP with a
    segment prefix, -ENOTSUPP under every design but nop10) is refused there, and hello still runs."""
    from emu.process.elf import load_plan

    plan = load_plan(os.path.realpath(LIBC))
    data = Path(os.path.realpath(LIBC)).read_bytes()
    text = next(seg for seg in plan.segments if seg.prot & 4)
    offset = data.index(bytes.fromhex("662e0f1f840000000000"), text.offset, text.offset + text.filesz)
    m, io = machine("int3")
    probe = m.attach(f"uprobe:{LIBC}:{text.vaddr + offset - text.offset:#x}")
    result = m.run()
    assert (result.exit_status, bytes(io.out)) == (0, b"hello, world\n")
    assert isinstance(probe, LibraryProbe) and probe.installed == [] and "-ENOTSUPP" in (probe.refused or "")
    assert probe.summary()["refused"] == probe.refused
