"""Which memory an x86-64 instruction stores to, as formulas over its registers, decoded once per
instruction (capstone) and evaluated on each run of it.

The verifiers watch a probe hit's stores this way instead of with a memory-write hook: Unicorn takes
every load and store of the whole program off its fast path while any such hook exists, hit or no
hit (emu/hotpath/write_log.py). A hit runs a handful of instructions in the kernel's pages (the
trampoline, a slot, an out-of-line step) and the patched site: a code hook over those alone decodes
each instruction's stores here and logs the bytes each overwrites before it lands.

Capstone's own read/write flags on operands are wrong for many SSE/AVX and x87 stores, so the rule is
x86's own: an instruction writes its first operand unless it is one of the few that only read it,
plus the implicit stores (push, call, string stores, enter). tests/test_memops.py checks the formulas
against the stores Unicorn itself reports for the same instructions.

An instruction whose stores cannot be told from its text (xsave's size depends on XCR0 and a mask;
enter with a nesting level; scatters) is ``known=False``: the watch reports that a store went unseen.
Each instruction is also classified by how it may leave the code it is in (``Transfer``).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass

from emu.cpu.regs import Reg
from emu.disasm import cs64

MASK64 = (1 << 64) - 1


class Transfer(enum.Enum):
    """How an instruction may send execution elsewhere than the next one."""

    NONE = "falls through"
    DIRECT = "branch or call to a fixed address (target)"
    INDIRECT = "branch or call to an address in a register or memory (target_op)"
    RETURN = "ret: to the address on the stack"
    KERNEL = "into the kernel (syscall, int3, int): it decides where execution resumes"


@dataclass(frozen=True, slots=True)
class MemOp:
    """One memory operand as a formula: segment base + base + index * scale + disp, ``size`` bytes. A
    string store with a rep prefix runs as one instruction an element (Unicorn's code hooks see each
    iteration, at the rdi of that iteration): it stores ``size`` bytes, or none once rcx is 0."""

    base: int = 0  # a Reg value, 0 for none
    index: int = 0
    scale: int = 1
    disp: int = 0  # signed; rip-relative operands are resolved to their absolute address here
    size: int = 8
    segment: int = 0  # Reg.FS_BASE or Reg.GS_BASE, 0 for none
    string: bool = False
    rep: bool = False
    addr32: bool = False  # a 0x67 prefix: the address wraps at 4 GiB

    def span(self, reg: Callable[[int], int]) -> tuple[int, int]:
        """(lowest address, bytes) this operand touches, with register values from ``reg``."""
        addr = self.disp
        if self.base:
            addr += reg(self.base)
        if self.index:
            addr += reg(self.index) * self.scale
        if self.addr32:
            addr &= 0xFFFFFFFF
        if self.segment:
            addr += reg(self.segment)
        addr &= MASK64
        if self.rep and reg(Reg.RCX) == 0:
            return addr, 0
        return addr, self.size


@dataclass(frozen=True, slots=True)
class Shape:
    """What an instruction of ``length`` bytes stores, and how it may leave."""

    length: int
    stores: tuple[MemOp, ...]
    known: bool  # every store is among ``stores``
    transfer: Transfer
    target: int = 0  # DIRECT: the absolute target
    target_op: MemOp | None = None  # INDIRECT through memory: where the target is read from
    target_reg: int = 0  # INDIRECT through a register
    conditional: bool = False  # DIRECT: only if taken (jcc, loop, jrcxz)


_REG_NAMES: dict[str, tuple[int, bool]] = {}  # capstone's name -> (Reg, it is the 32-bit half)
for _reg in Reg:
    _REG_NAMES[_reg.name.lower()] = (int(_reg), False)
for _name64, _name32 in (("rax", "eax"), ("rbx", "ebx"), ("rcx", "ecx"), ("rdx", "edx"), ("rsi", "esi"), ("rdi", "edi"),
                         ("rbp", "ebp"), ("rsp", "esp"), *((f"r{i}", f"r{i}d") for i in range(8, 16))):
    _REG_NAMES[_name32] = (_REG_NAMES[_name64][0], True)
_SEGMENTS = {"fs": int(Reg.FS_BASE), "gs": int(Reg.GS_BASE)}

# Instructions whose memory first operand is only read (or not touched: lea, nop, prefetch).
_READS_FIRST = frozenset({
    "cmp", "test", "bt", "push", "call", "jmp", "lea", "nop", "prefetch", "prefetchw", "prefetcht0", "prefetcht1",
    "prefetcht2", "prefetchnta", "clflush", "clflushopt", "clwb", "cldemote", "ptwrite", "mul", "imul", "div",
    "idiv", "fld", "fild", "fbld", "fcom", "fcomp", "ficom", "ficomp", "fadd", "fsub", "fsubr", "fmul", "fdiv",
    "fdivr", "fiadd", "fisub", "fisubr", "fimul", "fidiv", "fidivr", "fldcw", "fldenv", "frstor", "fxrstor",
    "fxrstor64", "xrstor", "xrstor64", "xrstors", "xrstors64", "ldmxcsr", "vldmxcsr", "lgdt", "lidt", "lldt", "lmsw",
    "ltr", "verr", "verw", "bound", "invlpg", "cmps", "cmpsb", "cmpsw", "cmpsd", "cmpsq", "scasb", "scasw", "scasd",
    "scasq", "lodsb", "lodsw", "lodsd", "lodsq", "outsb", "outsw", "outsd", "ucomiss", "ucomisd", "comiss", "comisd",
    "vucomiss", "vucomisd", "vcomiss", "vcomisd", "ptest", "vptest", "vtestps", "vtestpd", "xlatb", "bndcl", "bndcu",
    "bndcn", "bndldx", "bndmov", "umonitor", "clzero", "monitor",
})
_STRING_STORES = {"stosb": 1, "stosw": 2, "stosd": 4, "stosq": 8, "movsb": 1, "movsw": 2, "movsd": 4, "movsq": 8}
# Sizes capstone does not give (it reports the operand as 8 bytes or the first element).
_SIZES = {"fxsave": 512, "fxsave64": 512, "fnsave": 108, "fsave": 108, "fnstenv": 28, "fstenv": 28,
          "cmpxchg8b": 8, "cmpxchg16b": 16, "fnstcw": 2, "fstcw": 2, "fnstsw": 2, "fstsw": 2, "stmxcsr": 4,
          "vstmxcsr": 4, "movdir64b": 64}
_UNKNOWN = ("xsave", "xsaveopt", "xsavec", "xsaves", "vpscatter", "vscatter", "enqcmd")
_KERNEL = frozenset({"syscall", "sysenter", "int", "int1", "int3", "into", "ud0", "ud1", "ud2", "hlt"})
_RETURNS = frozenset({"ret", "retf", "iret", "iretd", "iretq"})
_STACK_PUSHES = frozenset({"push", "pushf", "pushfq", "pushfw", "call"})


def _mem(insn: object, op: object, size: int | None = None) -> MemOp:
    mem = op.mem  # type: ignore[attr-defined]
    base_name = insn.reg_name(mem.base) if mem.base else ""  # type: ignore[attr-defined]
    index_name = insn.reg_name(mem.index) if mem.index else ""  # type: ignore[attr-defined]
    disp = mem.disp
    base, addr32 = 0, False
    if base_name in ("rip", "eip"):
        disp += insn.address + insn.size  # type: ignore[attr-defined]
    elif base_name:
        base, addr32 = _REG_NAMES[base_name]
    index = _REG_NAMES[index_name][0] if index_name else 0
    segment = _SEGMENTS.get(insn.reg_name(mem.segment), 0) if mem.segment else 0  # type: ignore[attr-defined]
    return MemOp(base, index, mem.scale, disp, size if size is not None else op.size or 8, segment,  # type: ignore[attr-defined]
                 addr32=addr32)


def _mnemonic(insn: object) -> tuple[str, bool]:
    """The mnemonic without prefixes, and whether a rep prefix came with it."""
    words = insn.mnemonic.split()  # type: ignore[attr-defined]  # "rep stosb", "notrack jmp", "bnd ret"
    return words[-1], any(w in ("rep", "repe", "repz", "repne", "repnz") for w in words[:-1])


def _stores(insn: object, word: str, rep: bool) -> tuple[tuple[MemOp, ...], bool]:
    from capstone import x86 as cx

    ops = insn.operands  # type: ignore[attr-defined]
    opsize16 = 0x66 in insn.prefix  # type: ignore[attr-defined]
    if word.startswith(_UNKNOWN) or (word == "enter" and ops[1].imm != 0):
        return (), False
    if word in _STACK_PUSHES or word == "enter":
        size = 2 if opsize16 and word != "call" else 8
        return (MemOp(int(Reg.RSP), disp=-size, size=size),), True
    if word in _STRING_STORES and (word != "movsd" or all(op.type == cx.X86_OP_MEM for op in ops)):  # not SSE's
        return (MemOp(int(Reg.RDI), size=_STRING_STORES[word], string=True, rep=rep,
                      addr32=0x67 in insn.prefix),), True  # type: ignore[attr-defined]
    if word in ("maskmovq", "maskmovdqu", "vmaskmovdqu"):
        return (MemOp(int(Reg.RDI), size=8 if word == "maskmovq" else 16),), True
    if not ops or ops[0].type != cx.X86_OP_MEM or word in _READS_FIRST or word.startswith(("j", "loop", "cmov")):
        if word in ("xchg", "xadd", "cmpxchg") and len(ops) > 1 and ops[1].type == cx.X86_OP_MEM:
            return (_mem(insn, ops[1]),), True
        return (), True
    op = _mem(insn, ops[0], _SIZES.get(word))
    if word == "pop" and op.base == Reg.RSP:  # the address is computed after the pop's increment
        op = MemOp(op.base, op.index, op.scale, op.disp + 8, op.size, op.segment, addr32=op.addr32)
    return (op,), True


def _transfer(insn: object, word: str) -> tuple[Transfer, int, MemOp | None, int, bool]:
    from capstone import x86 as cx

    if word in _KERNEL:
        return Transfer.KERNEL, 0, None, 0, False
    if word in _RETURNS:
        return Transfer.RETURN, 0, None, 0, False
    if not (word in ("jmp", "call") or word.startswith(("j", "loop"))):
        return Transfer.NONE, 0, None, 0, False
    op = insn.operands[0]  # type: ignore[attr-defined]
    conditional = word not in ("jmp", "call")
    if op.type == cx.X86_OP_IMM:
        return Transfer.DIRECT, op.imm & MASK64, None, 0, conditional
    if op.type == cx.X86_OP_REG:
        return Transfer.INDIRECT, 0, None, _REG_NAMES[insn.reg_name(op.reg)][0], False  # type: ignore[attr-defined]
    return Transfer.INDIRECT, 0, _mem(insn, op, 8), 0, False


@functools.lru_cache(maxsize=4096)
def decode(code: bytes, address: int) -> Shape | None:
    """The shape of the first instruction in ``code`` at ``address``; None if it does not decode."""
    for insn in cs64(detail=True).disasm(code, address, 1):
        word, rep = _mnemonic(insn)
        stores, known = _stores(insn, word, rep)
        transfer, target, target_op, target_reg, conditional = _transfer(insn, word)
        return Shape(insn.size, stores, known, transfer, target, target_op, target_reg, conditional)
    return None
