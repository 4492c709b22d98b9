"""Static probe-site scan of one ELF file: USDT notes and 5-/10-byte NOPs, with each design's verdict.

Pure Python over the file (pyelftools + capstone), no emulation: a static glibc binary takes well
under a second. Addresses are link-time (a PIE's bias is not applied).

Per design a site is one of (spec 1.2, 1.5, 4.1; docs/linux-6.18-observed.md section 8a):
- ``optimize``  the design patches it after the first hit (call / jmp slot / lea+call);
- ``int3``      accepted, but it stays an INT3 probe (emulated or stepped out of line) forever;
- ``refused (-ENOTSUPP)`` / ``refused (-ENOEXEC)``: the kernel's instruction analysis refuses to attach.
"""

from __future__ import annotations

import bisect
import errno
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import capstone
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from emu.designs import DESIGNS, Design, get_design
from emu.errors import UsageError
from emu.kernel.errno_ import SyscallError
from emu.kernel.uprobes.insn import ENOTSUPP, MAX_UINSN_BYTES, analyze
from emu.kernel.uprobes.sites import NOP10_HEAD, can_optimize, is_nop5, usdt_combo_site
from emu.probes import UsdtNote, usdt_notes
from emu.render import table

OPTIMIZE = "optimize"
INT3 = "int3"
SITE_LENGTHS = (5, 10)


class SiteKind:
    USDT = "usdt"
    ENTRY = "entry"  # a symbol's first instruction (-mnop-mcount entries, labelled inline sites)
    LABEL = "label"  # a non-function symbol (an asm label on an inline site)
    INLINE = "inline"  # inside a function, found by linear sweep


@dataclass(frozen=True, slots=True)
class Site:
    kind: str
    address: int
    raw: bytes  # the instruction (for USDT: the bytes at the note's pc, up to the long NOP's end)
    text: str  # AT&T disassembly
    function: str | None  # containing function symbol
    offset: int  # from that function's start
    labels: tuple[str, ...] = ()  # every symbol naming exactly this address
    designs: dict[str, str] = field(default_factory=dict)
    usdt: UsdtNote | None = None

    @property
    def where(self) -> str:
        if self.function is None:
            return "-"
        return self.function if self.offset == 0 else f"{self.function}+{self.offset:#x}"

    @property
    def name(self) -> str:
        if self.usdt is not None:
            return f"usdt:{self.usdt.provider}:{self.usdt.name}"
        return ",".join(self.labels) if self.labels else "-"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "address": self.address,
            "bytes": self.raw.hex(),
            "length": len(self.raw),
            "insn": self.text,
            "function": self.function,
            "offset": self.offset,
            "labels": list(self.labels),
            "designs": dict(self.designs),
        }
        if self.usdt is not None:
            out["usdt"] = {
                "provider": self.usdt.provider,
                "name": self.usdt.name,
                "semaphore": self.usdt.semaphore,
                "args": self.usdt.arg_text.split(),
            }
        return out


def _att() -> capstone.Cs:
    cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    cs.syntax = capstone.CS_OPT_SYNTAX_ATT
    return cs


CS_ATT = _att()
def disasm_text(code: bytes, address: int = 0) -> str:
    """Every instruction of ``code`` in AT&T syntax, `;`-separated; undecodable bytes as `(bad) xx`."""
    parts: list[str] = []
    pos = 0
    while pos < len(code):
        insn = next(CS_ATT.disasm_lite(code[pos:], address + pos, 1), None)
        if insn is None:
            parts.append(f"(bad) {code[pos]:02x}")
            pos += 1
            continue
        _, size, mnemonic, op_str = insn
        parts.append(f"{mnemonic} {op_str}".strip())
        pos += size
    return "; ".join(parts)


def verdict(code: bytes, address: int, design: Design) -> str:
    """What ``design`` does with a uprobe on the instruction at the start of ``code`` (file bytes)."""
    try:
        insn = analyze(code[:MAX_UINSN_BYTES], address, accept_nop10=design.site_length == 10)
    except SyscallError as err:
        name = "ENOTSUPP" if err.errno == ENOTSUPP else errno.errorcode.get(err.errno, str(err.errno))
        return f"refused (-{name})"
    return OPTIMIZE if can_optimize(design, insn.raw, address) else INT3


def usdt_verdict(code: bytes, address: int, design: Design) -> str:
    """libbpf's nop combo (spec 3.8): `90` + a long NOP the design optimizes -> the probe goes on +1."""
    if usdt_combo_site(code, address, design) != address:
        return OPTIMIZE + " (+1)"
    return verdict(code, address, design)


def is_site_nop(raw: bytes, mnemonic: str) -> bool:
    """A 5- or 10-byte NOP (any encoding capstone calls a nop, plus [NOPS] forms)."""
    if len(raw) not in SITE_LENGTHS:
        return False
    return mnemonic.startswith("nop") or (len(raw) == 5 and is_nop5(raw)) or raw[:5] == NOP10_HEAD


@dataclass
class _Image:
    segments: list[tuple[int, int, bytes]]  # executable sections: (start, end, data)

    def bytes_at(self, address: int, size: int) -> bytes:
        for start, end, data in self.segments:
            if start <= address < end:
                return data[address - start : address - start + size]
        return b""


@dataclass
class ScanResult:
    path: str
    sites: list[Site]
    functions: int = 0
    instructions: int = 0
    image: _Image | None = None  # the executable sections, for analyses that read the code again (survey)
    bounds: dict[int, tuple[str, int]] = field(default_factory=dict)  # FUNC symbols: start -> (name, size)

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.sites]


def scan_file(path: str, designs: Sequence[str | Design] = tuple(DESIGNS), inline: bool = True) -> ScanResult:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        elf = ELFFile(io.BytesIO(data))
        if elf["e_machine"] != "EM_X86_64":
            raise UsageError(f"{path}: not an x86-64 ELF file ({elf['e_machine']})")
        return _scan(path, elf, [get_design(d) for d in designs], inline)
    except UsageError:
        raise
    except Exception as exc:  # pyelftools raises many kinds on a corrupt file
        raise UsageError(f"cannot scan {path}: {exc}") from None


def _scan(path: str, elf: ELFFile, designs: list[Design], inline: bool) -> ScanResult:
    image = _Image([
        (sec["sh_addr"], sec["sh_addr"] + sec["sh_size"], sec.data())
        for sec in elf.iter_sections()
        if sec["sh_flags"] & SH_FLAGS.SHF_EXECINSTR and sec["sh_type"] == "SHT_PROGBITS"
    ])
    labels: dict[int, list[str]] = {}
    functions: dict[int, tuple[str, int]] = {}  # start -> (name, size), FUNC symbols with a size
    for sec in elf.iter_sections():
        if not isinstance(sec, SymbolTableSection):
            continue
        for sym in sec.iter_symbols():
            kind = sym["st_info"]["type"]
            if not sym.name or sym["st_shndx"] == "SHN_UNDEF" or kind not in ("STT_FUNC", "STT_NOTYPE"):
                continue
            value = sym["st_value"]
            if not image.bytes_at(value, 1):
                continue
            names = labels.setdefault(value, [])
            if sym.name not in names:
                names.append(sym.name)
            if kind == "STT_FUNC" and sym["st_size"] and value not in functions:
                functions[value] = (sym.name, sym["st_size"])
    starts = sorted(functions)
    result = ScanResult(path, [], functions=len(functions), image=image, bounds=functions)

    def container(address: int) -> tuple[str | None, int]:
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0:
            name, size = functions[starts[i]]
            if address < starts[i] + size:
                return name, address - starts[i]
        return None, 0

    def make(kind: str, address: int, raw: bytes, text: str, note: UsdtNote | None = None) -> Site:
        code = image.bytes_at(address, MAX_UINSN_BYTES)
        judge = usdt_verdict if note is not None else verdict
        func, off = container(address)
        return Site(kind, address, raw, text, func, off, tuple(labels.get(address, ())),
                    {d.name: judge(code, address, d) for d in designs}, note)

    sites: dict[int, Site] = {}
    for note in usdt_notes(elf):
        code = image.bytes_at(note.pc, MAX_UINSN_BYTES)
        raw = _usdt_bytes(code, note.pc)
        result.sites.append(make(SiteKind.USDT, note.pc, raw, disasm_text(raw, note.pc), note))
        if len(raw) > 1:  # the combo's long NOP, where libbpf attaches when the kernel optimizes it
            labels.setdefault(note.pc + 1, []).append(f"usdt:{note.provider}:{note.name}+1")
    # Entries: a symbol whose first instruction is a long NOP (-mnop-mcount, labelled inline sites).
    for address in sorted(labels):
        insn = next(CS_ATT.disasm_lite(image.bytes_at(address, MAX_UINSN_BYTES), address, 1), None)
        if insn is None:
            continue
        raw = image.bytes_at(address, insn[1])
        if is_site_nop(raw, insn[2]):
            kind = SiteKind.ENTRY if address in functions else SiteKind.LABEL
            sites[address] = make(kind, address, raw, f"{insn[2]} {insn[3]}".strip())
    if inline:
        for address, raw, text in _sweep(image, functions, result):
            if address not in sites:
                sites[address] = make(SiteKind.INLINE, address, raw, text)
    result.sites.extend(sites[a] for a in sorted(sites))
    return result


def _usdt_bytes(code: bytes, pc: int) -> bytes:
    """The note's `90` plus the long NOP after it when present (the combo), else its instruction."""
    insns = list(CS_ATT.disasm_lite(code, pc, 2))
    if not insns:
        return code[:1]
    if code[:1] == b"\x90" and len(insns) == 2 and len(code) >= 1 + insns[1][1] and \
            is_site_nop(code[1 : 1 + insns[1][1]], insns[1][2]):
        return code[: 1 + insns[1][1]]
    return code[: insns[0][1]]


def _sweep(image: _Image, functions: dict[int, tuple[str, int]], result: ScanResult) -> Iterable[tuple[int, bytes, str]]:
    """Linear sweep of each function; yields the 5-/10-byte NOPs (not at the entry: found above)."""
    for start, (_name, size) in sorted(functions.items()):
        code = image.bytes_at(start, size)
        pos = 0
        while pos < len(code):
            for address, length, mnemonic, op_str in CS_ATT.disasm_lite(code[pos:], start + pos):
                result.instructions += 1
                if length in SITE_LENGTHS and pos and is_site_nop(code[pos : pos + length], mnemonic):
                    yield address, code[pos : pos + length], f"{mnemonic} {op_str}".strip()
                pos += length
            if pos < len(code):
                pos += 1  # capstone stopped at an undecodable byte: skip it and go on


def scan_table(result: ScanResult) -> str:
    designs = list(result.sites[0].designs) if result.sites else list(DESIGNS)
    rows: list[tuple[str, ...]] = [("kind", "address", "site", "where", "bytes", "insn", *designs)]
    for s in result.sites:
        rows.append((s.kind, f"{s.address:#x}", s.name, s.where, s.raw.hex(" "), s.text,
                     *(s.designs[d] for d in designs)))
    lines = [table(rows)]
    notes = [s for s in result.sites if s.usdt is not None]
    if notes:
        lines.append("")
        lines.append(table([("usdt", "address", "semaphore", "arguments")] + [
            (f"{s.usdt.provider}:{s.usdt.name}", f"{s.address:#x}",
             f"{s.usdt.semaphore:#x}" if s.usdt.semaphore else "-", s.usdt.arg_text or "-")
            for s in notes if s.usdt is not None
        ]))
    counts = {d: sum(1 for s in result.sites if s.designs[d].startswith(OPTIMIZE)) for d in designs}
    lines.append("")
    lines.append(f"{len(result.sites)} sites ({result.functions} functions, {result.instructions} instructions swept); "
                 "optimized: " + ", ".join(f"{d} {n}" for d, n in counts.items()))
    return "\n".join(lines)
