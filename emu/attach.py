"""Attaching probes to a process: specs resolved against the executable, USDT sites, probes on
shared libraries (emu/libprobes.py) and the uprobe PMU's attach by file offset (perf_event_open)."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from emu import abi
from emu.abi import Prot
from emu.designs import Design
from emu.disasm import describe_insn
from emu.errors import EmuError, ProbeRefused, UsageError
from emu.kernel.dispatch import Kernel
from emu.kernel.errno_ import SyscallError, errno_name
from emu.kernel.fs.namei import lookup
from emu.kernel.uprobes.consumers import Consumer, count_return
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.records import Uprobe
from emu.kernel.uprobes.sites import usdt_combo_site
from emu.kernel.vfs import Vfs
from emu.process.elf import load_plan
from emu.process.loader import LoadedImage
from emu.process.memory import Memory
from emu.process.vma import Vma

if TYPE_CHECKING:  # probes and library probes load on first use: a plain run of a binary needs neither;
    # the Protocol is for the type checker only (making its class costs start-up time)
    from typing import Protocol

    from emu.libprobes import LibraryProbe, LibraryProbes
    from emu.probes import ProbeSpec, ResolvedProbe, Resolver

    class ProbeHost(Protocol):
        """The process probes attach to (emu/machine.py's Machine); read at each use, since an execve
        replaces its image and its uprobes."""

        @property
        def mem(self) -> Memory: ...
        @property
        def kernel(self) -> Kernel: ...
        @property
        def uprobes(self) -> Uprobes: ...
        @property
        def design(self) -> Design: ...
        @property
        def path(self) -> str: ...  # the executable's host path
        @property
        def exe(self) -> LoadedImage: ...
        @property
        def interp(self) -> LoadedImage | None: ...


@dataclass(eq=False)
class Attachment:
    """One attached probe spec: where it landed and its consumer (the hit counts live there)."""

    resolved: ResolvedProbe
    consumer: Consumer
    uprobe: Uprobe
    process: ProbeHost
    library: bool = False  # installed on behalf of a LibraryProbe (summarized there)

    @property
    def address(self) -> int:
        return self.uprobe.vaddr

    def detach(self) -> None:
        self.process.uprobes.detach(self.uprobe, self.consumer)

    def summary(self) -> dict[str, Any]:
        from emu.probes import ProbeKind  # probes.py loads with the first probe (see above)

        up = self.process.uprobes
        hits = self.consumer.ret_hits if self.resolved.spec.kind is ProbeKind.URETPROBE else self.consumer.hits
        return {
            "spec": self.resolved.spec.text,
            "address": self.address,
            "hits": hits,
            "paths": dict(self.consumer.paths),
            # an execve took the probe's image away (and maybe mapped nothing there): not optimized now
            "optimized": up.probes.get(self.address) is self.uprobe and up.is_optimized(self.uprobe),
        }


class ProbeAttacher:
    """The probes attached to one process, and the ways to attach more."""

    def __init__(self, process: ProbeHost) -> None:
        self.process = process
        self.attachments: list[Attachment] = []
        self.library_observers: list[Callable[[Attachment], None]] = []  # each library probe installed (uprobe_mmap)
        self._libraries: LibraryProbes | None = None  # made by the first library probe (libraries)
        self._resolver: Resolver | None = None  # made on first use (resolver)

    def inherit(self, parent: ProbeAttacher) -> None:
        """A forked child's: the parent's symbols, and its library probes (one list per inode: later
        mappings in the child get them too)."""
        self._resolver = parent._resolver
        self.libraries.probes = parent.libraries.probes

    def new_image(self) -> None:
        """After an execve: the symbols are the new executable's."""
        self._resolver = None

    # ------------------------------------------------------------ lookups
    @property
    def resolver(self) -> Resolver:
        """Symbols and USDT notes of the executable (probes.py loads only when a probe or a caller needs them)."""
        if self._resolver is None:
            from emu.probes import Resolver  # probes.py loads with the first probe or symbol lookup

            self._resolver = Resolver(self.process.exe)
        return self._resolver

    @property
    def libraries(self) -> LibraryProbes:
        """Probes by spec on shared libraries (libprobes.py loads with the first one)."""
        if self._libraries is None:
            from emu.libprobes import LibraryProbes  # libprobes.py loads with the first library probe

            self._libraries = LibraryProbes(self)
        return self._libraries

    def library_probes(self) -> list[LibraryProbe]:
        return self._libraries.probes if self._libraries is not None else []

    def summaries(self) -> tuple[dict[str, Any], ...]:
        """What each probe spec hit, for the run's result (a library probe once, not per mapping)."""
        return tuple(a.summary() for a in self.attachments if not a.library) + tuple(
            lib.summary() for lib in self.library_probes())

    # libprobes.Installer: what LibraryProbes needs from the process
    @property
    def vfs(self) -> Vfs:
        return self.process.kernel.vfs

    @property
    def mappings(self) -> Memory:
        return self.process.mem

    # ------------------------------------------------------------ attaching
    def attach(self, spec: str | ProbeSpec, consumer: Consumer | None = None) -> Attachment | LibraryProbe:
        """Attach a probe spec (uprobe:SYM+OFF, uretprobe:SYM, usdt:PROV:NAME, uprobe:0xADDR, uprobe:PATH:SYM).

        A spec naming another file (a shared library) is installed whenever that file is mapped
        executable, like the kernel's uprobe_mmap; it returns a LibraryProbe."""
        from emu.probes import ProbeKind, parse_spec  # probes.py loads with the first probe

        parsed = parse_spec(spec) if isinstance(spec, str) else spec
        consumer = consumer or Consumer()
        if parsed.kind is ProbeKind.URETPROBE and consumer.ret_handler is None:
            consumer.ret_handler = count_return
        if parsed.path is not None and not self._is_exe(parsed.path):
            return self.libraries.add(parsed, consumer)
        resolved = self.resolver.resolve(dataclasses.replace(parsed, path=None))
        return self.attach_resolved(resolved, consumer, (self.process.exe, self.process.interp))

    def attach_resolved(self, resolved: ResolvedProbe, consumer: Consumer,
                        images: tuple[LoadedImage | None, ...], library: bool = False) -> Attachment:
        process = self.process
        parsed = resolved.spec
        address = self._usdt_site(resolved) if resolved.usdt else resolved.address
        vma = process.mem.find(address)
        if vma is None or not vma.prot & Prot.EXEC:
            raise UsageError(f"{parsed.text}: address {address:#x} is not in an executable mapping")
        try:
            uprobe = process.uprobes.attach(address, consumer, resolved.semaphore, self._file_bytes(address, images))
        except SyscallError as err:
            raise ProbeRefused(f"{parsed.text}: the kernel refuses the instruction at {address:#x}: "
                               f"{describe_insn(process.mem, address)} (-{errno_name(err.errno)}, {err.errno})",
                               err.errno) from None
        attachment = Attachment(resolved, consumer, uprobe, process)
        attachment.library = library
        self.attachments.append(attachment)
        if library:
            for observer in self.library_observers:
                observer(attachment)
        return attachment

    def perf_attach(self, path: str, offset: int, retprobe: bool, ref_ctr_offset: int,
                    consumer: Consumer) -> Callable[[], None]:
        """The uprobe PMU's attach by file offset: installed now where the file is mapped, and
        whenever it is mapped later (as the kernel's uprobes live on the inode)."""
        from emu.probes import ProbeKind, ProbeSpec  # the first perf_event_open loads probes.py

        process = self.process
        guest = lookup(process.kernel, abi.AT_FDCWD & 0xFFFFFFFF, path)
        host = process.kernel.vfs.host_path(guest)
        try:
            st = os.stat(host)
        except OSError:
            raise SyscallError(errno.ENOENT) from None
        ident = ((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)
        for image in (process.exe, process.interp):
            if image is not None and (image.plan.file.dev, image.plan.file.inode) == ident:
                vaddr = image.vaddr_of_offset(offset)
                if vaddr is None:
                    raise SyscallError(errno.EINVAL)
                ref = image.vaddr_of_offset(ref_ctr_offset) if ref_ctr_offset else None
                uprobe = process.uprobes.attach(vaddr, consumer, ref, self._file_bytes(vaddr, (image,)))
                return lambda: process.uprobes.detach(uprobe, consumer)
        try:
            plan = load_plan(host)
        except EmuError:
            raise SyscallError(errno.EINVAL) from None
        kind = ProbeKind.URETPROBE if retprobe else ProbeKind.UPROBE
        spec = ProbeSpec(f"{kind.value}:{guest}+{offset:#x}", kind, path=guest)
        return self.libraries.add_offset(spec, plan, offset, ref_ctr_offset, consumer).detach

    def library_mmap(self, vma: Vma) -> None:
        """uprobe_mmap for library probes (registered with the kernel before any other observer, as always)."""
        if self._libraries is not None:
            self._libraries.on_exec_mmap(vma)

    def _is_exe(self, path: str) -> bool:
        return os.path.realpath(path) == os.path.realpath(self.process.path) or path == self.process.kernel.ident.exe

    def _file_bytes(self, address: int, images: tuple[LoadedImage | None, ...]) -> bytes | None:
        """The instruction bytes as the file has them (the kernel analyzes those, not memory's)."""
        for image in images:
            if image is not None:
                code = self.resolver.bytes_at(image, address - image.bias, 16)
                if code:
                    return code
        return None

    def _usdt_site(self, resolved: ResolvedProbe) -> int:
        return usdt_combo_site(self.process.mem.read(resolved.address, 16), resolved.address, self.process.design)
