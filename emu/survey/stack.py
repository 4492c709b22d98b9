"""What one x86-64 instruction does to the stack, as far as static analysis can tell.

Addresses are *entry-relative*: a register known to hold a stack address holds "value of rsp at
the start of the analysis + delta". ``Regs`` maps the registers so known (rsp, a frame pointer,
a `lea` of a local) to their deltas; any other write forgets a register. An instruction's
``Effect`` lists the stack bytes it reads and writes (half-open ranges of entry-relative
addresses), the bytes below rsp a call leaves to its callee, and why it is opaque when it touches
the stack in a way the ranges cannot describe (an indexed access, a string instruction, rsp lost).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import capstone
from capstone import x86

Regs = dict[str, int]  # canonical 64-bit register name -> entry-relative delta
Range = tuple[int, int]  # [lo, hi) entry-relative
RSP = "rsp"
_GPRS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", *(f"r{n}" for n in range(8, 16)))
# A call may change these (SysV caller-saved): a tracked pointer in one does not survive it.
CALL_CLOBBERED = ("rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11")
_NO_ACCESS = ("lea", "nop", "prefetch", "endbr64", "clflush", "clflushopt", "clwb")
_ACC_READ, _ACC_WRITE = capstone.CS_AC_READ, capstone.CS_AC_WRITE


@functools.cache
def _decoder() -> capstone.Cs:
    cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    cs.detail = True
    return cs


@functools.cache
def canonical(name: str) -> str | None:
    """The 64-bit register that contains ``name`` (eax -> rax, r8d -> r8, spl -> rsp), else None."""
    if name in _GPRS:
        return name
    digits = name[1:].rstrip("dwb")
    if name.startswith("r") and digits.isdigit():
        return f"r{digits}"
    stem = {"al": "ax", "ah": "ax", "bl": "bx", "bh": "bx", "cl": "cx", "ch": "cx", "dl": "dx", "dh": "dx",
            "sil": "si", "dil": "di", "bpl": "bp", "spl": "sp"}.get(name, name.removeprefix("e"))
    return f"r{stem}" if f"r{stem}" in _GPRS else None


Operand = tuple[int, int, int, str | None, str | None, int, str | None]
# (type, access, size, mem base, mem index, disp or imm, reg name), bases and registers canonical


@dataclass(frozen=True, slots=True)
class Insn:
    """One instruction as the fast (lite) sweep gives it; ``detail()`` decodes operands on demand."""

    address: int
    size: int
    mnemonic: str
    op_str: str
    raw: bytes

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.op_str}".strip()

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def direct_target(self) -> int | None:
        """The target of a direct jmp/jcc/call (its operand is a plain address)."""
        text = self.op_str
        if text.startswith("0x"):
            try:
                return int(text, 16)
            except ValueError:
                return None
        return int(text) if text.isdigit() else None

    @property
    def is_string(self) -> bool:
        """movs/stos/lods/scas/cmps/ins/outs: the opcode after the legacy and REX prefixes."""
        for byte in self.raw:
            if byte in _PREFIXES or 0x40 <= byte <= 0x4F:
                continue
            return byte in _STRING_OPCODES
        return False

    def detail(self) -> tuple[tuple[Operand, ...], tuple[str, ...]]:
        """Operands, and the canonical registers written (explicitly or implicitly)."""
        return _detail(self.raw, self.address)


_PREFIXES = frozenset((0xF0, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65, 0x66, 0x67))
_STRING_OPCODES = frozenset((0x6C, 0x6D, 0x6E, 0x6F, 0xA4, 0xA5, 0xA6, 0xA7, 0xAA, 0xAB, 0xAC, 0xAD, 0xAE, 0xAF))
# Instructions that write a register their operand text does not name (or use rsp implicitly).
SYSCALL_ARGS = ("rdi", "rsi", "rdx", "r10", "r8", "r9")
KERNEL_READ_SPAN = 128  # bytes a system call is taken to read from a stack address it is given
_IMPLICIT = frozenset(("push", "pushfq", "pop", "popfq", "call", "ret", "retf", "leave", "enter", "mul", "div",
                       "idiv", "imul", "cqo", "cdq", "cwd", "cdqe", "cwde", "cbw", "cpuid", "rdtsc", "rdtscp",
                       "syscall", "xgetbv", "rdpkru", "cmpxchg", "cmpxchg8b", "cmpxchg16b", "xlatb", "lahf",
                       "loop", "loope", "loopne", "rdpid", "rdsspq", "xsave", "xrstor", "xsavec", "fxsave"))
_ALIASES: dict[str, tuple[str, ...]] = {
    "rax": ("ax", "al", "ah"), "rbx": ("bx", "bl", "bh"), "rcx": ("cx", "cl", "ch"), "rdx": ("dx", "dl", "dh"),
    "rsi": ("si",), "rdi": ("di",), "rbp": ("bp",), "rsp": ("sp",),
    **{f"r{n}": (f"r{n}",) for n in range(8, 16)},
}


@functools.lru_cache(maxsize=65536)
def _detail(raw: bytes, address: int) -> tuple[tuple[Operand, ...], tuple[str, ...]]:
    ci = next(_decoder().disasm(raw, address, 1))
    ops: list[Operand] = []
    for op in ci.operands:
        if op.type == x86.X86_OP_MEM:
            base = canonical(ci.reg_name(op.mem.base)) if op.mem.base else None
            index = ci.reg_name(op.mem.index) if op.mem.index else None
            ops.append((op.type, op.access, op.size, base, index, op.mem.disp, None))
        elif op.type == x86.X86_OP_REG:
            ops.append((op.type, op.access, op.size, None, None, 0, canonical(ci.reg_name(op.reg))))
        else:
            ops.append((op.type, op.access, op.size, None, None, op.imm, None))
    _read, written = ci.regs_access()
    return tuple(ops), tuple(dict.fromkeys(c for r in written if (c := canonical(ci.reg_name(r))) is not None))


def decode(code: bytes, address: int) -> list[Insn]:
    """Linear sweep of ``code`` (capstone's lite mode); stops at the first byte it cannot decode."""
    out: list[Insn] = []
    for a, size, mnemonic, op_str in _decoder().disasm_lite(code, address):
        out.append(Insn(a, size, mnemonic, op_str, code[a - address : a - address + size]))
    return out


def touches(insn: Insn, regs: Regs) -> bool:
    """Can ``insn`` read, write or move a tracked stack register? (False: its effect is nothing.)"""
    m = insn.mnemonic
    if m in _IMPLICIT or m.startswith("rep") or insn.is_string:
        return True
    text = insn.op_str
    return any(alias in text for reg in regs for alias in _ALIASES.get(reg, (reg,)))


@dataclass(frozen=True, slots=True)
class Effect:
    regs: Regs  # after the instruction
    loads: tuple[Range, ...] = ()
    stores: tuple[Range, ...] = ()
    clobber_below: int | None = None  # a call: every byte below this address belongs to the callee
    opaque: str | None = None  # why this instruction's stack accesses cannot be described


def effect(insn: Insn, regs: Regs) -> Effect:
    """What ``insn`` does, given the registers known before it."""
    m = insn.mnemonic
    if m.startswith("nop") or m in ("endbr64", "int3", "hlt", "ud2") or not touches(insn, regs):
        return Effect(regs)
    operands, written = insn.detail()
    out = dict(regs)
    loads: list[Range] = []
    stores: list[Range] = []
    opaque = _memory_operands(insn, operands, regs, loads, stores)
    if m == "syscall":
        loads.extend(_handed_to_the_kernel(regs))
    for reg in written:
        out.pop(reg, None)
    rsp = regs.get(RSP)
    special = _stack_insn(insn, operands, regs, out, loads, stores)
    if special is not None:
        return special if opaque is None else Effect(special.regs, opaque=opaque)
    _track_moves(insn, operands, regs, out)
    if RSP in written and RSP not in out and rsp is not None:
        opaque = opaque or f"rsp made unknowable at {insn.address:#x} ({insn.text})"
    return Effect(out, tuple(loads), tuple(stores), opaque=opaque)


def _handed_to_the_kernel(regs: Regs) -> list[Range]:
    """What a system call may read through its arguments: from each stack address among them, a red
    zone's worth (the length it is given is not tracked; a write(2) of red-zone bytes reads them)."""
    return [(regs[r], regs[r] + KERNEL_READ_SPAN) for r in SYSCALL_ARGS if r in regs]


def _memory_operands(insn: Insn, operands: tuple[Operand, ...], regs: Regs, loads: list[Range],
                     stores: list[Range]) -> str | None:
    """Explicit memory operands based on a tracked register; the reason if one cannot be placed."""
    if insn.mnemonic.startswith(_NO_ACCESS):
        return None
    for kind, access, size, base, index, disp, _reg in operands:
        if kind != x86.X86_OP_MEM or base is None or base not in regs:
            continue
        if index is not None or insn.is_string or not size:
            return f"stack access of unknown extent at {insn.address:#x} ({insn.text})"
        lo = regs[base] + disp
        if access & _ACC_READ or not access:
            loads.append((lo, lo + size))
        if access & _ACC_WRITE:
            stores.append((lo, lo + size))
    if insn.is_string and ("rdi" in regs or "rsi" in regs):
        return f"string instruction on a stack pointer at {insn.address:#x} ({insn.text})"
    return None


def _stack_insn(insn: Insn, operands: tuple[Operand, ...], regs: Regs, out: Regs, loads: list[Range],
                stores: list[Range]) -> Effect | None:
    """push/pop/call/ret/leave/enter; None for anything else (rsp arithmetic is a tracked move)."""
    m, rsp = insn.mnemonic, regs.get(RSP)
    implicit = m in ("push", "pushfq", "pop", "popfq", "call", "leave", "enter") or m.startswith("ret")
    if implicit and m != "leave":
        if rsp is None:
            return Effect(out, opaque=f"rsp not tracked at {insn.address:#x} ({insn.text})")
        return _implicit_rsp(insn, operands, rsp, out, loads, stores)
    if m == "leave":
        if "rbp" not in regs:
            return Effect(out, opaque=f"leave without a tracked frame pointer at {insn.address:#x}")
        out[RSP] = regs["rbp"] + 8
        return Effect(out, ((regs["rbp"], regs["rbp"] + 8),))
    return None


def _implicit_rsp(insn: Insn, operands: tuple[Operand, ...], rsp: int, out: Regs, loads: list[Range],
                  stores: list[Range]) -> Effect:
    """The instructions that move or use rsp without naming it."""
    m = insn.mnemonic
    if m in ("push", "pushfq"):
        size = 2 if operands and operands[0][2] == 2 else 8
        out[RSP] = rsp - size
        return Effect(out, tuple(loads), (*stores, (out[RSP], out[RSP] + size)))
    if m in ("pop", "popfq"):
        size = 2 if operands and operands[0][2] == 2 else 8
        if operands and operands[0][6] == RSP:
            return Effect(out, opaque=f"pop into rsp at {insn.address:#x}")
        out[RSP] = rsp + size
        return Effect(out, ((rsp, rsp + size), *loads), tuple(stores))
    if m == "call":
        for reg in CALL_CLOBBERED:
            out.pop(reg, None)
        out[RSP] = rsp
        return Effect(out, tuple(loads), clobber_below=rsp)
    if m.startswith("ret"):
        return Effect(out, tuple(loads))
    return Effect(out, opaque=f"enter at {insn.address:#x}")


def _track_moves(insn: Insn, operands: tuple[Operand, ...], regs: Regs, out: Regs) -> None:
    """mov reg,reg / lea disp(reg),reg / add|sub imm,reg keep a tracked register tracked."""
    ops = operands
    if len(ops) != 2 or ops[0][0] != x86.X86_OP_REG or ops[0][2] != 8:
        return
    dst, src = ops[0][6], ops[1]
    if dst is None:
        return
    m = insn.mnemonic
    if m == "mov" and src[0] == x86.X86_OP_REG and src[6] in regs:
        out[dst] = regs[src[6]]
    elif m == "lea" and src[3] in regs and src[4] is None:
        out[dst] = regs[src[3]] + src[5]
    elif m in ("add", "sub") and src[0] == x86.X86_OP_IMM and dst in regs:
        out[dst] = regs[dst] + (src[5] if m == "add" else -src[5])
