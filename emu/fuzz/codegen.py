"""A case -> machine code (keystone) and initial data, at the fixed addresses of layout.py.

The driver is the same for every case: load flags and the 15 registers from the data table,
call the function, copy its result block; twice; write the results to stdout; exit 0. The
function: entry instruction, save rsp, the stores (values from the data table through rax and
xmm0), rax reloaded, the probe site, one instruction a redirecting consumer skips, then the
registers and flags as they are after the site, the sp delta and every store read back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache, lru_cache

from emu.fuzz import layout as L
from emu.fuzz.case import CASE_REGS, Case, Store, StoreKind
from emu.fuzz.sites import entry_code, site_form

_GPR64 = {"ax": "rax", "bx": "rbx", "cx": "rcx", "dx": "rdx", "si": "rsi", "di": "rdi", "bp": "rbp"}
_SIZE_PTR = {1: "byte", 2: "word", 4: "dword", 8: "qword", 16: "xmmword"}
_RAX_PART = {1: "al", 2: "ax", 4: "eax", 8: "rax"}
SKIPPED = "not rdx"  # after the site: what a redirect skips (no flags touched)


def absm(address: int) -> str:
    """An absolute memory operand. The SIB form (no base, no index): keystone 0.9.2 turns a plain
    ``[0x600008]`` into ``[rip + 0x600008]`` unless it is the first instruction."""
    return f"[{address:#x} + riz*1]"


def reg64(name: str) -> str:
    return _GPR64.get(name, name)


@dataclass(frozen=True, slots=True)
class Program:
    code: bytes  # at CODE_BASE
    data: bytes  # at DATA_BASE
    site: int  # the site's first byte
    site_len: int
    after_skip: int  # where a redirecting consumer sends ip


@lru_cache(maxsize=1)
def _assembler():  # type: ignore[no-untyped-def]
    from keystone import KS_ARCH_X86, KS_MODE_64, Ks

    return Ks(KS_ARCH_X86, KS_MODE_64)


def assemble(text: str, address: int) -> bytes:
    encoding, _ = _assembler().asm(text, address)
    return bytes(encoding or b"")


@lru_cache(maxsize=1)
def driver() -> bytes:
    return _driver_calls() + assemble(_EXIT, L.CODE_BASE + len(_driver_calls()))


def driver_end() -> int:
    """The address where the driver, done calling, starts writing the results and exiting."""
    return L.CODE_BASE + len(_driver_calls())


_EXIT = "\n".join(["mov eax, 1", "mov edi, 1", f"mov esi, {L.RESULTS:#x}", f"mov edx, {L.RESULTS_SIZE}", "syscall",
                    "mov eax, 231", "xor edi, edi", "syscall", "hlt"])


@lru_cache(maxsize=1)
def _driver_calls() -> bytes:
    lines = []
    for call in range(L.CALLS):
        lines += [f"mov rax, qword ptr {absm(L.FLAGS_SLOT)}", "push rax", "popfq"]
        lines += [f"mov {reg64(r)}, qword ptr {absm(L.REGS_TABLE + 8 * i)}" for i, r in enumerate(CASE_REGS) if i]
        lines += [f"mov rax, qword ptr {absm(L.REGS_TABLE)}", f"call {L.FUNC:#x}"]
        for at in range(0, L.BLOCK, 16):  # straight-line copy: each `rep movsq` step is a block of its own
            lines += [f"movdqu xmm0, xmmword ptr {absm(L.SCRATCH + at)}",
                      f"movdqu xmmword ptr {absm(L.RESULTS + call * L.BLOCK + at)}, xmm0"]
    return assemble("\n".join(lines), L.CODE_BASE)


@cache
def snippet(text: str) -> bytes:
    """Position-independent code (no rip-relative or relative operands in the function), so
    each piece is assembled once and reused at any address."""
    return assemble(text, 0)


def _store(i: int, s: Store) -> tuple[str, str]:
    """The value load (depends on the slot only) and the store (on the store only): two cache keys."""
    dest = f"{_SIZE_PTR[s.size]} ptr [rsp - {s.offset}]"
    value = L.VALUES + 16 * i
    if s.kind is StoreKind.SETCC:
        return "", f"set{s.cc} {dest}"
    if s.kind is StoreKind.MOV:
        return f"mov rax, qword ptr {absm(value)}", f"mov {dest}, {_RAX_PART[s.size]}"
    return f"movdqu xmm0, xmmword ptr {absm(value)}", f"{s.kind.value} {dest}, xmm0"


def _read_back(i: int, s: Store) -> tuple[str, str]:
    src = f"{_SIZE_PTR[s.size]} ptr [rax - {s.offset}]"
    dest = L.SCRATCH + L.BLOCK_READS + 16 * i
    if s.size == 16:
        return f"movdqu xmm0, {src}", f"movdqu xmmword ptr {absm(dest)}, xmm0"
    load = {1: f"movzx ecx, {src}", 2: f"movzx ecx, {src}", 4: f"mov ecx, {src}", 8: f"mov rcx, {src}"}[s.size]
    return load, f"mov qword ptr {absm(dest)}, rcx"


def _pieces(texts: tuple[str, str]) -> bytes:
    return b"".join(snippet(t) for t in texts if t)


STASH_RSP = f"mov qword ptr {absm(L.STASH)}, rsp"
RELOAD_RAX = f"mov rax, qword ptr {absm(L.REGS_TABLE)}"  # the site sees the case's rax
DUMP = "\n".join(
    [f"mov qword ptr {absm(L.SCRATCH + L.BLOCK_REGS + 8 * i)}, {reg64(r)}" for i, r in enumerate(CASE_REGS)]
    + ["lahf", "seto al", f"mov word ptr {absm(L.SCRATCH + L.BLOCK_FLAGS)}, ax", "mov rax, rsp",
       f"sub rax, qword ptr {absm(L.STASH)}", f"mov qword ptr {absm(L.SCRATCH + L.BLOCK_SP_DELTA)}, rax",
       f"mov rax, qword ptr {absm(L.STASH)}"]
)
RETURN = f"mov rsp, qword ptr {absm(L.STASH)}\nret"


def function(case: Case) -> tuple[bytes, int, int, int]:
    """The leaf function's code at FUNC; the site address, its length and the redirect target."""
    form = site_form(case.site)
    head = entry_code(case.entry) + snippet(STASH_RSP)
    head += b"".join(_pieces(_store(i, s)) for i, s in enumerate(case.stores)) + snippet(RELOAD_RAX)
    site = L.FUNC + len(head)
    after_skip = site + len(form.code) + len(snippet(SKIPPED))
    tail = snippet(DUMP) + b"".join(
        _pieces(_read_back(i, s)) for i, s in enumerate(case.stores)) + snippet(RETURN)
    return head + form.code + snippet(SKIPPED) + tail, site, len(form.code), after_skip


def data(case: Case) -> bytes:
    out = bytearray(L.DATA_SIZE)
    struct.pack_into("<15Q", out, L.REGS_TABLE - L.DATA_BASE, *case.regs)
    struct.pack_into("<Q", out, L.FLAGS_SLOT - L.DATA_BASE, case.flags)
    for i, store in enumerate(case.stores):
        off = L.VALUES - L.DATA_BASE + 16 * i
        out[off : off + 16] = store.value.to_bytes(16, "little")
    return bytes(out)


def program(case: Case) -> Program:
    func, site, site_len, after_skip = function(case)
    code = driver().ljust(L.FUNC - L.CODE_BASE, b"\xcc") + func
    return Program(code, data(case), site, site_len, after_skip)
