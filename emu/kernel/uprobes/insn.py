"""Instruction analysis for the INT3 path (spec 4.1, 4.2): accept or refuse, then emulate or step out of line."""

from __future__ import annotations

import enum
import errno
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.disasm import cs64
from emu.kernel.errno_ import SyscallError

if TYPE_CHECKING:
    import capstone

ENOTSUPP = 524
MAX_UINSN_BYTES = 16

# Linux's x86_nops[len] for 64-bit (arch/x86/include/asm/nops.h): emulated as ip += len.
X86_NOPS: dict[int, bytes] = {
    1: bytes.fromhex("90"),
    2: bytes.fromhex("6690"),
    3: bytes.fromhex("0f1f00"),
    4: bytes.fromhex("0f1f4000"),
    5: bytes.fromhex("0f1f440000"),
    6: bytes.fromhex("660f1f440000"),
    7: bytes.fromhex("0f1f8000000000"),
    8: bytes.fromhex("0f1f840000000000"),
    9: bytes.fromhex("660f1f840000000000"),
    10: bytes.fromhex("66660f1f840000000000"),
    11: bytes.fromhex("6666660f1f840000000000"),
}

REFUSED_PREFIXES = frozenset({0x26, 0x2E, 0x36, 0x3E, 0xF0})  # segment overrides and lock (spec 4.1)
LEGACY_PREFIXES = frozenset({0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF0, 0xF2, 0xF3})
# Opcodes uprobe_init_insn refuses in 64-bit mode (invalid, I/O, traps, interrupt flag, hlt).
REFUSED_1BYTE = frozenset(
    {0x06, 0x07, 0x0E, 0x16, 0x17, 0x1E, 0x1F, 0x27, 0x2F, 0x37, 0x3F, 0x60, 0x61, 0x62, 0x82, 0x9A, 0xCE,
     0xD4, 0xD5, 0xD6, 0xEA, 0x6C, 0x6D, 0x6E, 0x6F, 0xE4, 0xE5, 0xE6, 0xE7, 0xEC, 0xED, 0xEE, 0xEF,
     0xCC, 0xCD, 0xCF, 0xF1, 0xF4, 0xFA, 0xFB}
)
REFUSED_2BYTE = frozenset({0x00, 0x01, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0B, 0x30, 0x34, 0x35, 0x37, 0x78, 0x79, 0xAE})

# jcc low nibble -> predicate over rflags (spec 4.2; even = condition true)
CF, PF, ZF, SF, OF = 1 << 0, 1 << 2, 1 << 6, 1 << 7, 1 << 11


def jcc_taken(cc: int, flags: int) -> bool:
    base = cc >> 1
    if base == 0:
        hit = bool(flags & OF)
    elif base == 1:
        hit = bool(flags & CF)
    elif base == 2:
        hit = bool(flags & ZF)
    elif base == 3:
        hit = bool(flags & (CF | ZF))
    elif base == 4:
        hit = bool(flags & SF)
    elif base == 5:
        hit = bool(flags & PF)
    elif base == 6:
        hit = bool(flags & SF) != bool(flags & OF)
    else:
        hit = bool(flags & ZF) or (bool(flags & SF) != bool(flags & OF))
    return hit if cc % 2 == 0 else not hit


class Kind(enum.Enum):
    NOP = "nop"
    JMP = "jmp"
    CALL = "call"
    JCC = "jcc"
    PUSH = "push"
    XOL = "xol"


class Fixup(enum.Flag):
    NONE = 0
    IP = enum.auto()
    CALL = enum.auto()


# push opcodes 50..57 in encoding order
PUSH_REGS = ("ax", "cx", "dx", "bx", "sp", "bp", "si", "di")
PUSH_REGS_REX = ("r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
SCRATCH_BY_INDEX = {6: "si", 7: "di", 3: "bx"}


@dataclass(frozen=True, slots=True)
class Analysis:
    """What the kernel decided about one probed instruction."""

    raw: bytes  # the original instruction
    length: int
    kind: Kind
    text: str
    rel: int = 0  # branch displacement
    cc: int = 0  # jcc condition nibble
    push_reg: str = ""
    fixups: Fixup = Fixup.NONE
    xol_bytes: bytes = b""  # the copy executed in the XOL slot (rip-relative rewritten)
    scratch: str = ""  # register standing in for rip in the XOL copy


def decode(code: bytes, address: int) -> capstone.CsInsn | None:
    for insn in cs64(detail=True).disasm(code, address, 1):
        return insn
    return None


def _prefix_end(raw: bytes) -> int:
    i = 0
    while i < len(raw) and raw[i] in LEGACY_PREFIXES:
        i += 1
    return i


def analyze(code: bytes, address: int, accept_nop10: bool = False) -> Analysis:
    """uprobe_init_insn + arch_uprobe_analyze_insn. Raises SyscallError(ENOEXEC/ENOTSUPP)."""
    insn = decode(code[:MAX_UINSN_BYTES], address)
    if insn is None:
        raise SyscallError(errno.ENOEXEC)
    raw = bytes(insn.bytes)
    text = f"{insn.mnemonic} {insn.op_str}".strip()
    if accept_nop10 and raw[:5] == bytes.fromhex("662e0f1f84") and len(raw) == 10:
        return Analysis(raw, 10, Kind.NOP, text)  # LATE10 skips uprobe_init_insn for its own site form
    start = _prefix_end(raw)
    if any(p in REFUSED_PREFIXES for p in raw[:start]):
        raise SyscallError(ENOTSUPP)
    op_at = start + (1 if start < len(raw) and 0x40 <= raw[start] <= 0x4F else 0)
    opcode = raw[op_at]
    if opcode == 0x0F:
        if raw[op_at + 1] in REFUSED_2BYTE:
            raise SyscallError(ENOTSUPP)
    elif opcode in REFUSED_1BYTE or (opcode == 0x8E and (raw[op_at + 1] >> 3) & 7 == 2):
        raise SyscallError(ENOTSUPP)
    return _classify(insn, raw, start, op_at, text)


def _classify(insn: capstone.CsInsn, raw: bytes, start: int, op_at: int, text: str) -> Analysis:
    length = len(raw)
    opcode = raw[op_at]
    if X86_NOPS.get(length) == raw or opcode == 0x90 and op_at == start:
        return Analysis(raw, length, Kind.NOP, text)
    has_66 = 0x66 in raw[:start]
    branch_rel = _branch(raw, op_at)
    if branch_rel is not None:
        if has_66:
            raise SyscallError(ENOTSUPP)
        kind, rel, cc = branch_rel
        return Analysis(raw, length, kind, text, rel=rel, cc=cc)
    if start == 0 and length == 1 and 0x50 <= opcode <= 0x57:
        return Analysis(raw, length, Kind.PUSH, text, push_reg=PUSH_REGS[opcode - 0x50])
    if start == 0 and length == 2 and raw[0] == 0x41 and 0x50 <= raw[1] <= 0x57:
        return Analysis(raw, length, Kind.PUSH, text, push_reg=PUSH_REGS_REX[raw[1] - 0x50])
    return _xol(insn, raw, op_at, text)


def _branch(raw: bytes, op_at: int) -> tuple[Kind, int, int] | None:
    op = raw[op_at]
    if op == 0xEB:
        return Kind.JMP, int.from_bytes(raw[op_at + 1 : op_at + 2], "little", signed=True), 0
    if op == 0xE9:
        return Kind.JMP, int.from_bytes(raw[op_at + 1 : op_at + 5], "little", signed=True), 0
    if op == 0xE8:
        return Kind.CALL, int.from_bytes(raw[op_at + 1 : op_at + 5], "little", signed=True), 0
    if 0x70 <= op <= 0x7F:
        return Kind.JCC, int.from_bytes(raw[op_at + 1 : op_at + 2], "little", signed=True), op & 0xF
    if op == 0x0F and len(raw) > op_at + 1 and 0x80 <= raw[op_at + 1] <= 0x8F:
        return Kind.JCC, int.from_bytes(raw[op_at + 2 : op_at + 6], "little", signed=True), raw[op_at + 1] & 0xF
    return None


def _xol(insn: capstone.CsInsn, raw: bytes, op_at: int, text: str) -> Analysis:
    opcode = raw[op_at]
    reg_field = (raw[op_at + 1] >> 3) & 7 if len(raw) > op_at + 1 else 0
    if opcode in (0xC3, 0xCB, 0xC2, 0xCA) or (opcode == 0xFF and reg_field in (4, 5)):
        fixups = Fixup.NONE  # ret and indirect jmp: "ip is correct"
    elif opcode == 0x9A or (opcode == 0xFF and reg_field in (2, 3)):
        fixups = Fixup.CALL
    else:
        fixups = Fixup.IP
    xol, scratch = _riprel(insn, raw)
    return Analysis(raw, len(raw), Kind.XOL, text, fixups=fixups, xol_bytes=xol, scratch=scratch)


def _riprel(insn: capstone.CsInsn, raw: bytes) -> tuple[bytes, str]:
    """Rewrite a rip-relative operand to [scratch + disp32] (spec 4.2, riprel_analyze)."""
    modrm_at = insn.modrm_offset
    if not modrm_at or (raw[modrm_at] & 0xC7) != 0x05:
        return raw, ""
    out = bytearray(raw)
    reg = (raw[modrm_at] >> 3) & 7
    rex_at = next((i for i in range(modrm_at) if 0x40 <= raw[i] <= 0x4F), None)
    if rex_at is not None:
        reg |= (raw[rex_at] & 0x4) << 1
        out[rex_at] &= ~0x1  # clear REX.B: the scratch is a low register
    vex_at = next((i for i in range(modrm_at) if raw[i] in (0xC4, 0x62)), None)
    vvvv = -1
    if vex_at is not None:
        out[vex_at + 1] |= 0x60
        vvvv = (~raw[vex_at + 2] >> 3) & 0xF
    index = 6
    if reg == 6 or vvvv == 6:
        index = 7
        if reg == 7 or vvvv == 7:
            index = 3
    out[modrm_at] = 0x80 | (raw[modrm_at] & 0x38) | index
    return bytes(out), SCRATCH_BY_INDEX[index]
