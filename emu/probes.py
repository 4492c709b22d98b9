"""Probe specs in bpftrace syntax, resolved against a loaded executable: symbols, offsets, USDT notes."""

from __future__ import annotations

import dataclasses
import enum
import io
import re
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.disasm import cs64
from emu.errors import UsageError
from emu.process.loader import LoadedImage

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

_REG_ALIASES = {
    "rax": ("ax", 8), "eax": ("ax", 4), "ax": ("ax", 2), "al": ("ax", 1),
    "rbx": ("bx", 8), "ebx": ("bx", 4), "bx": ("bx", 2), "bl": ("bx", 1),
    "rcx": ("cx", 8), "ecx": ("cx", 4), "cx": ("cx", 2), "cl": ("cx", 1),
    "rdx": ("dx", 8), "edx": ("dx", 4), "dx": ("dx", 2), "dl": ("dx", 1),
    "rsi": ("si", 8), "esi": ("si", 4), "si": ("si", 2), "sil": ("si", 1),
    "rdi": ("di", 8), "edi": ("di", 4), "di": ("di", 2), "dil": ("di", 1),
    "rbp": ("bp", 8), "ebp": ("bp", 4), "bp": ("bp", 2), "bpl": ("bp", 1),
    "rsp": ("sp", 8), "esp": ("sp", 4), "sp": ("sp", 2), "spl": ("sp", 1),
    "rip": ("ip", 8),
}
for _n in range(8, 16):
    _REG_ALIASES.update({f"r{_n}": (f"r{_n}", 8), f"r{_n}d": (f"r{_n}", 4), f"r{_n}w": (f"r{_n}", 2),
                         f"r{_n}b": (f"r{_n}", 1)})

_SPEC = re.compile(r"^(uprobe|uretprobe|usdt):(.+)$")


class ProbeKind(enum.Enum):
    UPROBE = "uprobe"
    URETPROBE = "uretprobe"
    USDT = "usdt"


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    text: str
    kind: ProbeKind
    path: str | None = None
    symbol: str | None = None
    offset: int = 0
    address: int | None = None
    provider: str = ""
    name: str = ""


def parse_spec(text: str) -> ProbeSpec:
    match = _SPEC.match(text)
    if match is None:
        raise UsageError(f"bad probe spec {text!r}: want uprobe:SYM[+OFF], uprobe:0xADDR, uretprobe:SYM, usdt:PROV:NAME")
    kind = ProbeKind(match.group(1))
    rest = match.group(2)
    if kind is ProbeKind.USDT:
        parts = rest.split(":")
        if len(parts) == 2:
            return ProbeSpec(text, kind, provider=parts[0], name=parts[1])
        if len(parts) == 3:
            return ProbeSpec(text, kind, path=parts[0], provider=parts[1], name=parts[2])
        raise UsageError(f"bad probe spec {text!r}: want usdt:[PATH:]PROVIDER:NAME")
    path, _, target = rest.rpartition(":")
    if not target:
        raise UsageError(f"bad probe spec {text!r}: no symbol or address")
    if re.fullmatch(r"0x[0-9a-fA-F]+", target):
        return ProbeSpec(text, kind, path=path or None, address=int(target, 16))
    symbol, plus, off = target.partition("+")
    offset = 0
    if plus:
        try:
            offset = int(off, 0)
        except ValueError:
            raise UsageError(f"bad probe spec {text!r}: offset {off!r} is not a number") from None
    return ProbeSpec(text, kind, path=path or None, symbol=symbol, offset=offset)


@dataclass(frozen=True, slots=True)
class UsdtArg:
    """One ``SIZE@OPERAND`` of a USDT note: a register, a constant, or memory at
    ``offset + base + index*scale`` (``symbol`` names a data object, for ``sym(%rip)`` operands;
    its address is filled in by :meth:`Resolver.notes` with the load bias applied)."""

    size: int  # bytes; negative for signed
    reg: str | None = None
    offset: int = 0
    base: str | None = None
    index: str | None = None
    scale: int = 1
    const: int | None = None
    symbol: str | None = None
    address: int | None = None  # absolute address of ``symbol``

    def read(self, regs: object, read_mem: object) -> int:
        width = abs(self.size)
        if self.const is not None:
            value = self.const
        elif self.address is not None or self.base is not None or self.index is not None:
            addr = self.address if self.address is not None else self.offset
            if self.base is not None and self.address is None:
                addr += getattr(regs, self.base)
            if self.index is not None:
                addr += getattr(regs, self.index) * self.scale
            value = int.from_bytes(read_mem(addr & ((1 << 64) - 1), width), "little")  # type: ignore[operator]
        else:
            assert self.reg is not None
            value = getattr(regs, self.reg)
        value &= (1 << (8 * width)) - 1
        if self.size < 0 and value >> (8 * width - 1):
            value -= 1 << (8 * width)
        return value


_MEM_OPERAND = re.compile(r"(?P<off>[^(]*)\((?:%(?P<base>\w+))?(?:,%(?P<index>\w+)(?:,(?P<scale>\d+))?)?\)")


def parse_usdt_arg(spec: str) -> UsdtArg:
    size_text, at, operand = spec.partition("@")
    if not at:
        size_text, operand = "8", spec
    size = int(size_text)
    if operand.startswith("$"):
        return UsdtArg(size, const=int(operand[1:], 0))
    if operand.startswith("%"):
        reg, _ = _REG_ALIASES[operand[1:]]
        return UsdtArg(size, reg=reg)
    m = _MEM_OPERAND.fullmatch(operand)
    if m is None or (m["base"] and m["base"] not in _REG_ALIASES) or (m["index"] and m["index"] not in _REG_ALIASES):
        raise UsageError(f"unsupported USDT argument {spec!r}")
    off = m["off"]
    base = _REG_ALIASES[m["base"]][0] if m["base"] else None
    index = _REG_ALIASES[m["index"]][0] if m["index"] else None
    scale = int(m["scale"] or 1)
    if base == "ip":  # sym(%rip): the data object itself (libbpf reads it at its address)
        return UsdtArg(size, symbol=off, index=index, scale=scale)
    try:
        offset = int(off or "0", 0)
    except ValueError:
        raise UsageError(f"unsupported USDT argument {spec!r}") from None
    return UsdtArg(size, offset=offset, base=base, index=index, scale=scale)


@dataclass(frozen=True, slots=True)
class UsdtNote:
    provider: str
    name: str
    pc: int  # link-time address, .stapsdt.base-adjusted
    semaphore: int  # link-time address or 0
    args: tuple[UsdtArg, ...]
    arg_text: str


def usdt_notes(elf: ELFFile) -> list[UsdtNote]:
    base_sec = elf.get_section_by_name(".stapsdt.base")
    notes: list[UsdtNote] = []
    for sec in elf.iter_sections():
        if sec.name != ".note.stapsdt":
            continue
        data = sec.data()
        pos = 0
        while pos + 12 <= len(data):
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            pos += 12
            owner = data[pos : pos + namesz].rstrip(b"\0")
            pos += (namesz + 3) & ~3
            desc = data[pos : pos + descsz]
            pos += (descsz + 3) & ~3
            if owner != b"stapsdt" or ntype != 3 or len(desc) < 24:
                continue
            pc, base, sema = struct.unpack_from("<QQQ", desc)
            provider, name, args = (desc[24:].split(b"\0") + [b"", b""])[:3]
            if base_sec is not None and base:
                pc += base_sec["sh_addr"] - base
                if sema:
                    sema += base_sec["sh_addr"] - base
            arg_text = args.decode()
            parsed = tuple(parse_usdt_arg(a) for a in arg_text.split())
            notes.append(UsdtNote(provider.decode(), name.decode(), pc, sema, parsed, arg_text))
    return notes


@dataclass(frozen=True, slots=True)
class ResolvedProbe:
    spec: ProbeSpec
    address: int
    semaphore: int | None = None
    usdt: UsdtNote | None = None


class Resolver:
    """Resolves specs against one loaded ELF image (the executable)."""

    def __init__(self, image: LoadedImage) -> None:
        self.image = image
        self._symbols: dict[str, tuple[int, int]] | None = None
        self._notes: list[UsdtNote] | None = None

    def _read_sections(self) -> None:
        """Symbols and USDT notes from the section headers. Linux never reads those to run a file,
        so a broken section table only matters once a probe asks for a symbol or a note."""
        symbols: dict[str, tuple[int, int]] = {}
        objects: dict[str, int] = {}
        from elftools.elf.elffile import ELFFile  # ~40 ms to import: only when a probe needs symbols
        from elftools.elf.sections import SymbolTableSection

        try:
            elf = ELFFile(io.BytesIO(self.image.plan.data))
            for sec in elf.iter_sections():
                if isinstance(sec, SymbolTableSection):
                    for sym in sec.iter_symbols():
                        kind = sym["st_info"]["type"]
                        if not sym.name or sym["st_shndx"] == "SHN_UNDEF":
                            continue
                        if kind in ("STT_FUNC", "STT_NOTYPE"):
                            symbols.setdefault(sym.name, (sym["st_value"], sym["st_size"]))
                        elif kind == "STT_OBJECT":
                            objects.setdefault(sym.name, sym["st_value"])
            notes = [self._bind(note, objects) for note in usdt_notes(elf)]
        except Exception as exc:  # pyelftools raises many kinds on a corrupt section table
            raise UsageError(f"cannot read the symbols of {self.image.plan.file.path}: {exc}") from None
        self._symbols, self._notes = symbols, notes

    def _bind(self, note: UsdtNote, objects: dict[str, int]) -> UsdtNote:
        """Fill in the addresses of ``sym(%rip)`` arguments (with the image's load bias)."""
        args = []
        for arg in note.args:
            if arg.symbol is not None:
                if arg.symbol not in objects:
                    raise UsageError(f"USDT {note.provider}:{note.name}: no data symbol {arg.symbol!r}")
                arg = dataclasses.replace(arg, address=objects[arg.symbol] + self.image.bias)
            args.append(arg)
        return dataclasses.replace(note, args=tuple(args))

    @property
    def symbols(self) -> dict[str, tuple[int, int]]:
        if self._symbols is None:
            self._read_sections()
        assert self._symbols is not None
        return self._symbols

    @property
    def notes(self) -> list[UsdtNote]:
        if self._notes is None:
            self._read_sections()
        assert self._notes is not None
        return self._notes

    def resolve(self, spec: ProbeSpec) -> ResolvedProbe:
        if spec.path is not None and spec.kind is not ProbeKind.USDT:
            raise UsageError(f"{spec.text}: probes in other files than the executable are not supported yet")
        if spec.kind is ProbeKind.USDT:
            return self._usdt(spec)
        if spec.address is not None:
            return ResolvedProbe(spec, spec.address)
        assert spec.symbol is not None
        if spec.symbol not in self.symbols:
            import difflib

            near = difflib.get_close_matches(spec.symbol, list(self.symbols), n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise UsageError(f"{spec.text}: no symbol {spec.symbol!r} in {self.image.plan.file.path}{hint}")
        value, size = self.symbols[spec.symbol]
        start = value + self.image.bias
        if spec.offset:
            self._check_boundary(spec, start, max(size, spec.offset + 1))
        return ResolvedProbe(spec, start + spec.offset)

    def _check_boundary(self, spec: ProbeSpec, start: int, size: int) -> None:
        code = self._bytes_at(start - self.image.bias, size)
        for addr, length, _, _ in cs64().disasm_lite(code, start):
            if addr - start == spec.offset:
                return
            if addr - start > spec.offset:
                break
            _ = length
        raise UsageError(f"{spec.text}: offset {spec.offset:#x} is not on an instruction boundary")

    def _bytes_at(self, vaddr: int, size: int) -> bytes:
        return self.bytes_at(self.image, vaddr, size)

    @staticmethod
    def bytes_at(image: LoadedImage, vaddr: int, size: int) -> bytes:
        """File bytes at link-time address ``vaddr`` of ``image`` (empty if not file-backed)."""
        for seg in image.plan.segments:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                off = seg.offset + vaddr - seg.vaddr
                return image.plan.data[off : off + min(size, seg.vaddr + seg.filesz - vaddr)]
        return b""

    def _usdt(self, spec: ProbeSpec) -> ResolvedProbe:
        for note in self.notes:
            if note.provider == spec.provider and note.name == spec.name:
                sema = note.semaphore + self.image.bias if note.semaphore else None
                return ResolvedProbe(spec, note.pc + self.image.bias, sema, note)
        known = sorted({f"{n.provider}:{n.name}" for n in self.notes})
        raise UsageError(f"{spec.text}: no USDT probe {spec.provider}:{spec.name} (known: {', '.join(known) or 'none'})")


def scan_specs(resolver: Resolver, nop_forms: tuple[int, ...] = (5, 10)) -> list[ProbeSpec]:
    """Every probe-able site of the executable: USDT notes, and symbols whose first instruction is a
    5- or 10-byte NOP (``-mnop-mcount`` entries, labelled inline sites)."""
    from emu.kernel.uprobes.sites import NOP10_HEAD, is_nop5

    specs: list[ProbeSpec] = []
    seen: set[int] = set()
    for note in resolver.notes:
        key = (note.provider, note.name)
        spec = parse_spec(f"usdt:{key[0]}:{key[1]}")
        if spec not in specs:
            specs.append(spec)
    for name, (value, _size) in sorted(resolver.symbols.items(), key=lambda kv: kv[1][0]):
        code = resolver._bytes_at(value, 10)
        if value in seen or len(code) < 5:
            continue
        if (5 in nop_forms and is_nop5(code[:5])) or (10 in nop_forms and code[:5] == NOP10_HEAD):
            seen.add(value)
            specs.append(parse_spec(f"uprobe:{name}"))
    return specs
