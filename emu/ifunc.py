"""Which variant of an ifunc the emulated process runs, against the one the host runs.

glibc picks memcpy, strlen and their kin once, at start-up, from CPUID: each IRELATIVE
relocation names a GOT slot and the resolver whose answer goes there. The emulated CPU is not
the host's (cpumodel.py), so the two runs of one static binary may call different variants,
and a probe on one variant is hit in one run and not in the other. This module reads the
slots of the executable and of each probed library in both processes once they are filled and
before the program's own code runs (at __libc_setup_tls in a static binary, at the entry of a
dynamic one): the emulated process under a probe
there, the native one under ptrace with an int3 there.

A probe is reported when its function is a variant: the target of a slot in either run, or a
function named ``__<ifunc>_<suffix>`` (glibc's naming), so variants neither run picks count too.
In a file without a symbol table (Debian's libc.so.6) variants have no names: a probe there is
reported only at a variant's first byte, and the variants are named by address.
"""

from __future__ import annotations

import bisect
import ctypes
import io
import os
import signal
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.errors import UsageError

if TYPE_CHECKING:
    from emu.process.elf import LoadPlan

R_X86_64_IRELATIVE = 37
PTRACE_TRACEME, PTRACE_CONT = 0, 7


Choices = dict[str, tuple[str, ...]]  # ifunc name -> the names of the variant its slot points to (or its address)


class _AtMain(Exception):
    """Raised by the probe on main to end the emulated run there."""


@dataclass(frozen=True, slots=True)
class Slot:
    got: int  # link-time address of the GOT slot
    resolver: int
    ifunc: str  # the IFUNC symbol the resolver belongs to (memcpy)


@dataclass(frozen=True, slots=True)
class Symbols:
    """The executable's functions (sorted by start) and ifunc slots, from its sections."""

    starts: tuple[int, ...]
    functions: tuple[tuple[int, int, tuple[str, ...]], ...]  # start, end, every name (aliases: memcpy = memmove)
    addresses: dict[str, int]
    slots: tuple[Slot, ...]
    is_dyn: bool
    first_vaddr: int
    entry: int
    dynamic: bool  # has an interpreter (ld.so relocates it before its entry)

    @classmethod
    def read(cls, path: str) -> Symbols:
        from elftools.elf.elffile import ELFFile
        from elftools.elf.relocation import RelocationSection
        from elftools.elf.sections import SymbolTableSection

        with open(path, "rb") as fh:
            elf = ELFFile(io.BytesIO(fh.read()))
        functions: dict[int, tuple[int, int, tuple[str, ...]]] = {}
        resolvers: dict[int, str] = {}
        addresses: dict[str, int] = {}
        for sec in elf.iter_sections():
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                kind, value, size = sym["st_info"]["type"], sym["st_value"], sym["st_size"]
                if not sym.name or sym["st_shndx"] == "SHN_UNDEF":
                    continue
                if kind in ("STT_GNU_IFUNC", "STT_LOOS"):
                    names = (resolvers[value], sym.name) if value in resolvers else (sym.name,)
                    resolvers[value] = min(names, key=lambda n: (n.startswith("_"), len(n)))  # memcpy, not __new_memcpy
                elif kind == "STT_FUNC" and size:
                    start, end, names = functions.get(value, (value, value + size, ()))
                    functions[value] = (start, end, (*names, sym.name))
                    addresses.setdefault(sym.name, value)
        slots = []
        for sec in elf.iter_sections():
            if isinstance(sec, RelocationSection) and sec.is_RELA():
                for rel in sec.iter_relocations():
                    if rel["r_info_type"] == R_X86_64_IRELATIVE:
                        addend = rel["r_addend"]
                        slots.append(Slot(rel["r_offset"], addend, resolvers.get(addend, f"{addend:#x}")))
        ordered = tuple(sorted(functions.values()))
        loads = [seg["p_vaddr"] for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
        interp = any(seg["p_type"] == "PT_INTERP" for seg in elf.iter_segments())
        return cls(tuple(f[0] for f in ordered), ordered, addresses, tuple(slots), elf["e_type"] == "ET_DYN",
                   min(loads) & ~0xFFF if loads else 0, elf["e_entry"], interp)

    def function_at(self, vaddr: int) -> tuple[str, ...]:
        """Every name of the function holding ``vaddr`` (none outside functions)."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i >= 0 and self.functions[i][0] <= vaddr < self.functions[i][1]:
            return self.functions[i][2]
        return ()


def _named(names: Sequence[str], ifunc: str) -> str:
    """The alias that says which ifunc it serves (__memcpy_ssse3 rather than __memmove_ssse3 for memcpy)."""
    return next((n for n in names if n.startswith(f"__{ifunc}_")), names[0])


@dataclass(frozen=True, slots=True)
class IfuncProbe:
    """A probe in a variant of an ifunc, and the variants each run calls."""

    spec: str
    function: str
    ifunc: str
    emulated: str | None  # None: the run did not reach main
    host: str | None

    def line(self) -> str:
        differs = self.emulated != self.host
        return (f"warning: {self.spec} is in {self.function}, a variant of the ifunc {self.ifunc}: the emulated CPU "
                f"selects {self.emulated or 'unknown'}, the host selects {self.host or 'unknown'}"
                + (" (hit counts may differ)" if differs else ""))


def _targets(symbols: Symbols, words: dict[int, int], bias: int) -> Choices:
    """ifunc name -> every name of the function its slot points to."""
    out: Choices = {}
    for slot in symbols.slots:
        target = words.get(slot.got)
        if target is not None:  # a stripped file (Debian's libc.so.6) names it by address
            out.setdefault(slot.ifunc, symbols.function_at(target - bias) or (f"{target - bias:#x}",))
    return out


def _stop_at(exe: Symbols) -> int | None:
    """Where the slots are filled and no code of the program has run yet (link-time address): a static
    binary's __libc_start_main applies its IRELATIVE relocations right before __libc_setup_tls (then
    come the constructors and main); ld.so relocates every library before the executable's entry."""
    if exe.dynamic:
        return exe.entry
    return exe.addresses.get("__libc_setup_tls", exe.addresses.get("main"))


def emulated_choices(exe: str, argv: Sequence[str], env: dict[str, str],
                     files: dict[str, Symbols]) -> dict[str, Choices] | None:
    """Per file (host path): the variants the emulated process's resolvers chose, read where
    :func:`_stop_at` says (None: the run never got there)."""
    from emu.guestio import GuestIO
    from emu.kernel.uprobes.consumers import Consumer, Hit
    from emu.libprobes import library_bias
    from emu.machine import Machine

    stop_at = _stop_at(files[exe])
    if stop_at is None:
        return None

    def stop(_hit: Hit) -> int:
        raise _AtMain

    machine = Machine(exe, list(argv), env, io=GuestIO.captured())
    machine.attach(f"uprobe:{stop_at + machine.exe.bias:#x}", Consumer(handler=stop))
    try:
        machine.run()
    except _AtMain:
        out = {}
        for path, symbols in files.items():
            bias = machine.exe.bias if path == exe else None
            if bias is None:
                st = os.stat(path)
                ident = ((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)
                vma = next((v for v in machine.mem if (v.dev, v.inode) == ident), None)
                bias = library_bias(_plan(path), vma) if vma is not None else None
            if bias is not None:
                words = {s.got: struct.unpack("<Q", machine.mem.read(s.got + bias, 8))[0] for s in symbols.slots}
                out[path] = _targets(symbols, words, bias)
        return out
    return None


def _plan(path: str) -> LoadPlan:
    from emu.process.elf import load_plan

    return load_plan(path)


def host_choices(exe: str, argv: Sequence[str], env: dict[str, str],
                 files: dict[str, Symbols]) -> dict[str, Choices] | None:
    """As emulated_choices, for the host: the program runs natively under ptrace up to an int3 at the
    same place (its output to /dev/null), the slots are read from /proc/<pid>/mem, then it is killed."""
    stop_at = _stop_at(files[exe])
    if stop_at is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            libc.ptrace(PTRACE_TRACEME, 0, None, None)
            os.execve(exe, list(argv), env)
        finally:
            os._exit(127)
    try:
        return _read_when_stopped(libc, pid, exe, stop_at, files)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _read_when_stopped(libc: ctypes.CDLL, pid: int, exe: str, stop_at: int,
                       files: dict[str, Symbols]) -> dict[str, Choices] | None:
    _, status = os.waitpid(pid, 0)
    if not os.WIFSTOPPED(status):
        return None  # the exec failed
    exe_bias = _bias(pid, exe, files[exe]) if files[exe].is_dyn else 0
    if exe_bias is None:
        return None
    where = stop_at + exe_bias
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(where)
        original = mem.read(1)
        mem.seek(where)
        mem.write(b"\xcc")
        libc.ptrace(PTRACE_CONT, pid, None, None)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTRAP):
            return None
        out = {}
        for path, symbols in files.items():
            bias = _bias(pid, path, symbols) if symbols.is_dyn else 0
            if bias is None:
                continue
            words = {}
            for slot in symbols.slots:
                mem.seek(slot.got + bias)
                words[slot.got] = struct.unpack("<Q", mem.read(8))[0]
            out[path] = _targets(symbols, words, bias)
        mem.seek(where)
        mem.write(original)
    return out


def _bias(pid: int, path: str, symbols: Symbols) -> int | None:
    """Load bias of ``path`` in the traced process, from its mapping of file offset 0 (None: not mapped)."""
    real = os.path.realpath(path)
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == real and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16) - symbols.first_vaddr
    return None


def variant_family(symbols: Symbols, names: Sequence[str], targets: Sequence[Choices]) -> str | None:
    """The ifunc the function called ``names`` (the probe's own name first) is a variant of: the probe's
    name says so as glibc spells variants, a slot points at it in a run, or one of its aliases says so."""
    families = sorted({s.ifunc for s in symbols.slots}, key=len, reverse=True)
    first = next((f for f in families if names[0].startswith(f"__{f}_")), None)
    if first is not None:
        return first
    for chosen in targets:
        for ifunc, target in chosen.items():
            if set(target) & set(names):
                return ifunc
    for ifunc in families:
        if any(n.startswith(f"__{ifunc}_") for n in names):
            return ifunc
    return None


def ifunc_probes(path: str, argv: Sequence[str], env: dict[str, str], specs: Sequence[str]) -> list[IfuncProbe]:
    """The probes among ``specs`` (by symbol or address, in the executable or a library) that sit in an
    ifunc variant, with the variant each run picks."""
    from emu.probes import ProbeKind, parse_spec

    exe = os.path.realpath(path)
    files = {exe: _symbols(exe)}
    places: list[tuple[str, str, tuple[str, ...]]] = []  # spec, file, names of its function
    for text in specs:
        spec = parse_spec(text)
        if spec.kind is ProbeKind.USDT:
            continue
        where = exe if spec.path is None else os.path.realpath(spec.path)
        if where not in files:
            if not os.path.isfile(where):
                continue  # the command reports a missing library itself
            files[where] = _symbols(where)
        symbols = files[where]
        vaddr = spec.address if spec.address is not None else symbols.addresses.get(spec.symbol or "")
        if vaddr is None or not symbols.slots:
            continue
        names = symbols.function_at(vaddr + spec.offset) or (f"{vaddr + spec.offset:#x}",)
        if names:
            own = [n for n in names if n == spec.symbol]
            places.append((text, where, (*own, *(n for n in names if n != spec.symbol))))
    if not places:
        return []
    emulated = emulated_choices(exe, argv, env, files) or {}
    host = host_choices(exe, argv, env, files) or {}
    found = []
    for text, where, names in places:
        picks = [chosen[where] for chosen in (emulated, host) if where in chosen]
        ifunc = variant_family(files[where], names, picks)
        if ifunc is not None:
            found.append(IfuncProbe(text, _named(names, ifunc), ifunc, _choice(emulated.get(where), ifunc),
                                    _choice(host.get(where), ifunc)))
    return found


def _symbols(path: str) -> Symbols:
    try:
        return Symbols.read(path)
    except Exception as exc:  # pyelftools raises many kinds on a corrupt file
        raise UsageError(f"cannot read the symbols of {path}: {exc}") from None


def _choice(chosen: Choices | None, ifunc: str) -> str | None:
    names = (chosen or {}).get(ifunc)
    return _named(names, ifunc) if names else None
