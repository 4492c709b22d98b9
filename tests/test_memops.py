"""The store formulas of emu/cpu/memops.py against the stores Unicorn itself reports for the same
instruction, run once on a CPU of its own with a write hook over everything: no store may be missed,
and an unconditional one must be exactly where the formula says."""

from __future__ import annotations

import random

import pytest
from keystone import KS_ARCH_X86, KS_MODE_64, Ks

from emu.abi import PAGE_SIZE, Prot
from emu.cpu import Cpu, Reg
from emu.cpu.memops import Transfer, decode

CODE = 0x400000
DATA = 0x10000000  # 1 MiB of data the registers point into
DATA_SIZE = 0x100000
POINTERS = (Reg.RAX, Reg.RBX, Reg.RCX, Reg.RDX, Reg.RSI, Reg.RDI, Reg.RBP, Reg.RSP, Reg.R8, Reg.R12, Reg.R13)

STORES = [
    "mov qword ptr [rax + 8], rbx", "mov dword ptr [rbx + rcx*4 - 12], eax", "mov word ptr [rdx], ax",
    "mov byte ptr [rsi + 1], al", "mov qword ptr [rsp - 8], rax", "mov byte ptr [rip + 0x1000], 1",
    "mov qword ptr fs:[8], rax", "mov dword ptr [eax], ebx", "push rax", "push qword ptr [rbx]", "push 0x10",
    "pushfq", "call 0x400100", "call rax", "pop qword ptr [rbx]", "pop qword ptr [rsp + 8]", "add qword ptr [rax], rbx",
    "inc dword ptr [rbx]", "neg byte ptr [r8]", "not qword ptr [rdx]", "shl qword ptr [rsi], 3", "xchg qword ptr [rax], rbx",
    "xchg rbx, qword ptr [rax]", "xadd dword ptr [rbx], ecx", "lock cmpxchg qword ptr [rdx], rcx", "cmpxchg16b xmmword ptr [rsi]",
    "cmpxchg8b qword ptr [rdi]", "sete byte ptr [rax]", "bts qword ptr [rbx], 3", "movnti qword ptr [rax], rbx",
    "movups xmmword ptr [rsp - 16], xmm0", "movaps xmmword ptr [rbp - 48], xmm1", "movdqu xmmword ptr [rax], xmm2",
    "movq qword ptr [rbx], xmm3", "movd dword ptr [r8], xmm4", "movsd qword ptr [rdx], xmm5", "movss dword ptr [rsi], xmm6",
    "pextrb byte ptr [rdi], xmm0, 1", "vmovups xmmword ptr [rbx], xmm1",
    "maskmovdqu xmm0, xmm1", "stmxcsr dword ptr [rax]", "fnstcw word ptr [rbx]", "fnstsw word ptr [r8]",
    "fnstenv [rdx]", "fnsave [rsi]", "fxsave [rbp]", "fst qword ptr [rax]", "fstp tbyte ptr [rbx]", "fistp dword ptr [r8]",
    "stosb", "stosq", "rep stosb", "rep stosq", "movsq", "rep movsd dword ptr [rdi], dword ptr [rsi]", "rep movsb", "enter 16, 0",
]
NOT_STORES = [
    "lea rax, [rsp - 8]", "nop word ptr [rax + rax]", "cmp qword ptr [rax], rbx", "test byte ptr [rbx], 1",
    "mov rax, qword ptr [rbx]", "movups xmm0, xmmword ptr [rax]", "imul rax, qword ptr [rbx]", "fld qword ptr [rcx]",
    "prefetcht0 byte ptr [rax]", "lodsq", "scasb", "cmpsb", "ret", "pop rax", "leave", "movsd xmm0, qword ptr [rax]",
]


def _cpu() -> Cpu:
    cpu = Cpu()
    cpu.mem_map(CODE, PAGE_SIZE, Prot.READ | Prot.EXEC)
    cpu.mem_map(DATA, DATA_SIZE, Prot.READ | Prot.WRITE)
    return cpu


def _run(asm: str, seed: int, down: bool = False) -> tuple[set[int], set[int]]:
    """(the bytes Unicorn reported stored, the bytes the formulas name), one run from random pointers."""
    code = bytes(Ks(KS_ARCH_X86, KS_MODE_64).asm(asm, CODE)[0])
    shape = decode(code + bytes(16), CODE)
    assert shape is not None and shape.length == len(code) and shape.known
    cpu = _cpu()
    cpu.mem_write(CODE, code + b"\xf4")
    rng = random.Random(seed)
    values: dict[int, int] = {}
    for reg in POINTERS:
        values[int(reg)] = DATA + 0x40000 + rng.randrange(0, 0x80000, 64)  # aligned: cmpxchg16b, fxsave
        cpu.write(reg, values[int(reg)])
    values[int(Reg.RCX)] = rng.randrange(0, 3)  # a rep count (rcx is no pointer in these templates)
    cpu.write(Reg.RCX, values[int(Reg.RCX)])
    values[int(Reg.FS_BASE)] = DATA + 0x1000
    cpu.write(Reg.FS_BASE, values[int(Reg.FS_BASE)])
    values[int(Reg.GS_BASE)] = 0
    flags = 0x202 | (0x400 if down else 0)
    cpu.write(Reg.RFLAGS, flags)
    values[int(Reg.RFLAGS)] = flags
    cpu.write(Reg.RAX, values[int(Reg.RAX)])
    seen: set[int] = set()
    cpu.hooks.add_mem_write(lambda addr, size, _value: seen.update(range(addr, addr + size)), 1, 0)
    cpu.run(CODE, count=1)
    predicted: set[int] = set()
    for op in shape.stores:
        lo, n = op.span(lambda reg: values[reg])
        predicted.update(range(lo, lo + n))
    return seen, predicted


@pytest.mark.parametrize("asm", STORES)
def test_the_formulas_name_every_byte_unicorn_stores(asm: str) -> None:
    # these may store less than their operand (cmpxchg keeps memory, maskmov skips masked bytes, fxsave
    # leaves its reserved fields as they were)
    conditional = any(word in asm for word in ("cmpxchg", "maskmov", "fxsave"))
    for seed in range(4):
        seen, predicted = _run(asm, seed)
        assert seen or conditional or "rep" in asm, f"{asm}: Unicorn stored nothing (the test's set-up is wrong)"
        assert seen <= predicted, f"{asm}: missed {sorted(seen - predicted)[:8]}"
        if not conditional:
            assert seen == predicted, f"{asm}: names more than stored: {sorted(predicted - seen)[:8]}"


@pytest.mark.parametrize("asm", ["rep stosb", "rep movsq", "stosd", "movsw"])
def test_string_stores_walk_down_when_df_is_set(asm: str) -> None:
    seen, predicted = _run(asm, 7, down=True)
    assert seen == predicted


@pytest.mark.parametrize("asm", NOT_STORES)
def test_loads_and_address_arithmetic_store_nothing(asm: str) -> None:
    seen, predicted = _run(asm, 1)
    assert seen == predicted == set()


def test_what_cannot_be_told_from_the_text_is_marked_unknown() -> None:
    ks = Ks(KS_ARCH_X86, KS_MODE_64)
    for asm in ("xsave [rax]", "xsavec [rax]", "enter 16, 1"):
        shape = decode(bytes(ks.asm(asm, CODE)[0]), CODE)
        assert shape is not None and not shape.known, asm


@pytest.mark.parametrize(("asm", "transfer", "conditional"), [
    ("jmp 0x401000", Transfer.DIRECT, False), ("call 0x401000", Transfer.DIRECT, False),
    ("jne 0x401000", Transfer.DIRECT, True), ("loop 0x400010", Transfer.DIRECT, True), ("jmp rax", Transfer.INDIRECT, False),
    ("call qword ptr [rbx + 8]", Transfer.INDIRECT, False),
    ("ret", Transfer.RETURN, False), ("ret 8", Transfer.RETURN, False), ("syscall", Transfer.KERNEL, False),
    ("int3", Transfer.KERNEL, False), ("push rax", Transfer.NONE, False), ("mov rax, rbx", Transfer.NONE, False),
])
def test_transfers(asm: str, transfer: Transfer, conditional: bool) -> None:
    code = bytes(Ks(KS_ARCH_X86, KS_MODE_64).asm(asm, CODE)[0])
    shape = decode(code, CODE)
    assert shape is not None and (shape.transfer, shape.conditional) == (transfer, conditional)
    if transfer is Transfer.DIRECT:
        assert shape.target == int(asm.split()[-1], 16)
    if asm == "jmp rax":
        assert shape.target_reg == Reg.RAX
    if asm.startswith("call qword"):
        assert shape.target_op is not None and (shape.target_op.base, shape.target_op.disp) == (Reg.RBX, 8)
