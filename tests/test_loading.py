"""The seams of a process: its image is built (emu/process/loading.py) and library probes are installed
(emu/libprobes.py) without a Machine, each through the few objects it needs."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from emu.abi import AuxType, Prot
from emu.cpu import Cpu
from emu.guestio import GuestIO
from emu.kernel.dispatch import Kernel, KernelConfig
from emu.kernel.errno_ import SyscallError
from emu.kernel.uprobes.consumers import Consumer
from emu.kernel.vfs import Vfs
from emu.libprobes import LibraryProbes
from emu.probes import ProbeKind, ProbeSpec, ResolvedProbe
from emu.process import layout
from emu.process.elf import LoadPlan, load_plan
from emu.process.loader import LoadedImage
from emu.process.loading import executable, install_stdio, load_process
from emu.process.memory import Memory
from emu.process.vma import Vma
from emu.runtypes import RunOptions

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
HELLO = str(SAMPLES / "hello_static")


def bare_process() -> tuple[Kernel, Memory]:
    cpu = Cpu()
    mem = Memory(cpu, layout.no_aslr().mmap_base)
    return Kernel(cpu, mem, KernelConfig()), mem


def test_an_image_is_built_without_a_machine() -> None:
    kernel, mem = bare_process()
    plan = load_plan(HELLO)
    image = load_process(kernel, mem, layout.no_aslr(), HELLO, plan, [HELLO, "one"], ["A=b"], RunOptions())
    assert image.interp is None and image.entry == image.exe.entry == plan.entry  # a static ET_EXEC: no bias
    assert any(v.name == "[stack]" and v.start <= image.entry_sp < v.end for v in mem)
    assert mem.find(image.vdso) is not None and mem.find(image.entry) is not None
    auxv = dict(kernel.ident.auxv)
    assert auxv[AuxType.AT_ENTRY] == image.entry and auxv[AuxType.AT_SYSINFO_EHDR] == image.vdso
    argc, argv0 = struct.unpack("<QQ", mem.read(image.entry_sp, 16))
    assert argc == 2 and mem.read_cstring(argv0) == HELLO.encode()
    assert kernel.ident.argv == (HELLO.encode(), b"one") and kernel.brk.start >= image.exe.end


def test_the_standard_streams_are_fds_0_to_2() -> None:
    kernel, _mem = bare_process()
    io = GuestIO.captured()
    install_stdio(kernel, io)
    assert [kernel.files.get(fd).file for fd in (0, 1, 2)] == [io.stdin, io.stdout, io.stderr]


def test_execve_loads_an_executable_elf() -> None:
    kernel, _mem = bare_process()
    host, plan = executable(kernel, HELLO)
    assert host == HELLO and plan.entry == load_plan(HELLO).entry


@pytest.mark.parametrize("mode, content, expected", [
    (0o644, (SAMPLES / "hello_static").read_bytes(), errno.EACCES),  # an ELF, but no execute bit
    (0o755, b"#!/bin/sh\necho hi\n", errno.ENOEXEC),  # executable, not an ELF
    (0o755, b"\x7fELF" + b"\0" * 12, errno.ENOEXEC),  # an ELF magic with nothing behind it
])
def test_execve_refuses_what_the_kernel_refuses(tmp_path: Path, mode: int, content: bytes, expected: int) -> None:
    path = tmp_path / "prog"
    path.write_bytes(content)
    os.chmod(path, mode)
    kernel, _mem = bare_process()
    with pytest.raises(SyscallError) as err:
        executable(kernel, str(path))
    assert err.value.errno == expected


def test_a_directory_is_not_an_executable(tmp_path: Path) -> None:
    kernel, _mem = bare_process()
    with pytest.raises(SyscallError) as err:
        executable(kernel, str(tmp_path))
    assert err.value.errno == errno.EACCES


class FakeAttachment:
    def __init__(self, resolved: ResolvedProbe) -> None:
        self.resolved = resolved
        self.library = False
        self.detached = False

    @property
    def address(self) -> int:
        return self.resolved.address

    def detach(self) -> None:
        self.detached = True

    def summary(self) -> dict[str, Any]:
        return {"address": self.address, "optimized": False}


class RecordingInstaller:
    """libprobes.Installer with no process behind it: it records what it is asked to install."""

    def __init__(self) -> None:
        self.vfs = Vfs("/", "/")
        self.mappings: list[Vma] = []
        self.installed: list[FakeAttachment] = []

    def attach_resolved(self, resolved: ResolvedProbe, consumer: Consumer,
                        images: tuple[LoadedImage | None, ...], library: bool = False) -> FakeAttachment:
        att = FakeAttachment(resolved)
        att.library = library
        self.installed.append(att)
        return att


def text_vma(plan: LoadPlan, bias: int) -> Vma:
    seg = next(s for s in plan.segments if s.prot & Prot.EXEC)
    start = bias + (seg.vaddr & ~0xFFF)
    return Vma(start, start + 0x10000, Prot.READ | Prot.EXEC, name=plan.file.path, offset=seg.offset & ~0xFFF,
               dev=plan.file.dev, inode=plan.file.inode)


def test_a_library_probe_installs_through_its_installer_at_each_mapping() -> None:
    installer = RecordingInstaller()
    plan = load_plan(HELLO)
    seg = next(s for s in plan.segments if s.prot & Prot.EXEC)
    offset = seg.offset + 0x10
    spec = ProbeSpec(f"uprobe:{HELLO}+{offset:#x}", ProbeKind.UPROBE, path=HELLO)
    probe = LibraryProbes(installer).add_offset(spec, plan, offset, 0, Consumer())
    assert probe.installed == []  # nothing is mapped yet
    libraries = LibraryProbes(installer)
    libraries.probes.append(probe)
    for bias in (0, 0x100000):
        libraries.on_exec_mmap(text_vma(plan, bias))
    expected = [bias + seg.vaddr + 0x10 for bias in (0, 0x100000)]
    assert [att.address for att in installer.installed] == expected
    assert all(att.library for att in installer.installed) and probe.summary()["mapped"] == 2
    other = Vma(0x700000, 0x710000, Prot.READ | Prot.EXEC, offset=0, dev=plan.file.dev, inode=plan.file.inode + 1)
    libraries.on_exec_mmap(other)  # another file's text: nothing installed
    probe.detach()
    libraries.on_exec_mmap(text_vma(plan, 0x200000))  # detached: later mappings get nothing
    assert len(installer.installed) == 2 and all(att.detached for att in installer.installed)


def test_a_library_probe_outside_the_file_is_einval() -> None:
    plan = load_plan(HELLO)
    spec = ProbeSpec(f"uprobe:{HELLO}+0x10000000", ProbeKind.UPROBE, path=HELLO)
    with pytest.raises(SyscallError) as err:
        LibraryProbes(RecordingInstaller()).add_offset(spec, plan, 0x10000000, 0, Consumer())
    assert err.value.errno == errno.EINVAL
