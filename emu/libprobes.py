"""Probes in shared libraries: installed whenever the library is mapped executable (uprobe_mmap).

They are installed through an Installer (emu/attach.py's ProbeAttacher), never the Machine itself:
this module imports neither."""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from emu.abi import Prot, page_down
from emu.errors import EmuError, ProbeRefused, UsageError
from emu.kernel.errno_ import SyscallError
from emu.kernel.uprobes.consumers import Consumer
from emu.kernel.vfs import Vfs
from emu.process.elf import LoadPlan, load_plan
from emu.process.loader import LoadedImage
from emu.process.vma import Vma

if TYPE_CHECKING:  # probes.py loads when a library probe is added (a plain run needs none)
    from emu.probes import ProbeSpec, ResolvedProbe


class Installed(Protocol):
    """One mapping's probe (emu/attach.py's Attachment)."""

    library: bool

    @property
    def address(self) -> int: ...
    def detach(self) -> None: ...
    def summary(self) -> dict[str, Any]: ...


class Installer(Protocol):
    """What installs a library's probes in one process: its files, its mappings, and the attach."""

    @property
    def vfs(self) -> Vfs: ...
    @property
    def mappings(self) -> Iterable[Vma]: ...  # the process's VMAs (its Memory)
    def attach_resolved(self, resolved: ResolvedProbe, consumer: Consumer,
                        images: tuple[LoadedImage | None, ...], library: bool = False) -> Installed: ...


@dataclass(eq=False)
class LibraryProbe:
    """A spec on a library file; ``installed`` grows each time the library is mapped."""

    spec: ProbeSpec
    consumer: Consumer
    plan: LoadPlan
    installed: list[Installed] = field(default_factory=list)
    detached: bool = False
    file_offset: int | None = None  # perf_event_open's probe_offset, instead of a symbol
    ref_ctr_offset: int = 0
    refused: str | None = None  # why a mapping could not take it (uprobe_mmap skips such an instruction)

    @property
    def file_id(self) -> tuple[tuple[int, int], int]:
        return self.plan.file.dev, self.plan.file.inode

    def detach(self) -> None:
        self.detached = True
        for att in self.installed:
            att.detach()

    def summary(self) -> dict[str, Any]:
        from emu.probes import ProbeKind  # probes.py loads with the first probe (see above)

        hits = self.consumer.ret_hits if self.spec.kind is ProbeKind.URETPROBE else self.consumer.hits
        first = self.installed[0].summary() if self.installed else None
        return {
            "spec": self.spec.text,
            "address": first["address"] if first else None,
            "hits": hits,
            "paths": dict(self.consumer.paths),
            "optimized": bool(first and first["optimized"]),
            "mapped": len(self.installed),
            **({"refused": self.refused} if self.refused else {}),
        }


class LibraryProbes:
    def __init__(self, installer: Installer) -> None:
        self.installer = installer
        self.probes: list[LibraryProbe] = []  # the installer calls on_exec_mmap for each executable mapping
        self._plans: dict[str, LoadPlan] = {}  # host path -> its load plan (a survey probes hundreds of sites a file)

    def add(self, spec: ProbeSpec, consumer: Consumer) -> LibraryProbe:
        assert spec.path is not None
        vfs = self.installer.vfs
        try:
            host = vfs.host_path(vfs.resolve(spec.path))
        except SyscallError:
            raise UsageError(f"{spec.text}: no library {spec.path} under {vfs.root}") from None
        try:
            plan = self._plans.get(host) or self._plans.setdefault(host, load_plan(host))
        except EmuError as err:
            raise UsageError(f"{spec.text}: {err}") from None
        if spec.address is not None and not _in_code(plan, spec.address):
            raise UsageError(f"{spec.text}: {spec.address:#x} is not in the code of {spec.path} "
                             "(a library's 0xADDR is a link-time address in the file, as scan prints it)")
        probe = LibraryProbe(spec, consumer, plan)
        self._resolve(probe, 0)  # refuse an unknown symbol now, not at the first mmap
        return self._add(probe)

    def _add(self, probe: LibraryProbe) -> LibraryProbe:
        """Keep it for later mappings and install it on the ones already there."""
        self.probes.append(probe)
        for vma in list(self.installer.mappings):
            if vma.prot & 4 and (vma.dev, vma.inode) == probe.file_id:
                self._install(probe, vma)
        return probe

    def on_exec_mmap(self, vma: Vma) -> None:
        for probe in self.probes:
            if not probe.detached and (vma.dev, vma.inode) == probe.file_id:
                try:
                    self._install(probe, vma)
                except ProbeRefused as err:  # uprobe_mmap: the mapping goes on without this probe
                    probe.refused = str(err)

    def add_offset(self, spec: ProbeSpec, plan: LoadPlan, offset: int, ref_ctr_offset: int,
                   consumer: Consumer) -> LibraryProbe:
        """A probe by file offset (the uprobe PMU's way), installed whenever the file is mapped."""
        if LoadedImage(plan, 0).vaddr_of_offset(offset) is None:
            raise SyscallError(errno.EINVAL)
        return self._add(LibraryProbe(spec, consumer, plan, file_offset=offset, ref_ctr_offset=ref_ctr_offset))

    def _resolve(self, probe: LibraryProbe, bias: int) -> tuple[LoadedImage, Any]:
        from emu.probes import ResolvedProbe, Resolver  # probes.py loads with the first probe (see above)

        image = LoadedImage(probe.plan, bias)
        if probe.file_offset is not None:
            vaddr = image.vaddr_of_offset(probe.file_offset)
            sema = image.vaddr_of_offset(probe.ref_ctr_offset) if probe.ref_ctr_offset else None
            assert vaddr is not None
            return image, ResolvedProbe(probe.spec, vaddr, sema)
        if probe.spec.address is not None:  # a link-time address in the file: where it is mapped this time
            return image, ResolvedProbe(probe.spec, probe.spec.address + bias)
        return image, Resolver(image).resolve(dataclasses.replace(probe.spec, path=None))

    def _install(self, probe: LibraryProbe, vma: Vma) -> None:
        bias = library_bias(probe.plan, vma)
        if bias is None:
            return
        image, resolved = self._resolve(probe, bias)
        if not vma.start <= resolved.address < vma.end:
            return  # another segment of the same file: wait for the text mapping
        probe.installed.append(self.installer.attach_resolved(resolved, probe.consumer, (image,), library=True))


def _in_code(plan: LoadPlan, address: int) -> bool:
    return any(seg.prot & Prot.EXEC and seg.vaddr <= address < seg.vaddr + seg.filesz for seg in plan.segments)


def library_bias(plan: LoadPlan, vma: Vma) -> int | None:
    """Load bias of a library from one of its mappings: the PT_LOAD whose file pages start at vma.offset."""
    for seg in plan.segments:
        if page_down(seg.offset) == vma.offset:
            return vma.start - page_down(seg.vaddr)
    return None
