"""Capstone, loaded on first use (importing it costs ~35 ms, which a plain `run` should not pay)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the Protocol is for the type checker only: making its class costs start-up time)
    from typing import Protocol

    import capstone

    class Readable(Protocol):
        def read(self, addr: int, size: int, /) -> bytes: ...


STRAIGHT_LINE_SCAN = 256  # bytes enough for any kernel-side code to reach its end
# Instructions after which execution need not continue with the next one (besides jumps, loops and ret).
_BRANCHES = frozenset({"call", "syscall", "sysenter", "int", "int1", "int3", "into", "iret", "iretd", "iretq",
                       "sysret", "sysretq", "retf", "retfq", "hlt", "ud0", "ud1", "ud2"})


@functools.cache
def cs64(detail: bool = False) -> capstone.Cs:
    import capstone

    cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    cs.detail = detail
    return cs


@functools.lru_cache(maxsize=4096)
def insn_text(code: bytes, address: int) -> str | None:
    """Intel-syntax text of the first instruction in ``code``; None if it does not decode (kept:
    the verifiers name the same few writers on every hit, and capstone's Python side is slow)."""
    for _addr, _size, mnemonic, op_str in cs64().disasm_lite(code, address, 1):
        return f"{mnemonic} {op_str}".strip()
    return None


def describe_insn(mem: Readable, address: int) -> str:
    """The instruction at ``address`` for a message: its text, or why there is none."""
    try:
        code = mem.read(address, 16)
    except Exception:
        return "<unmapped>"
    return insn_text(code, address) or f"<undecodable {code[:4].hex()}>"


def straight_line_end(code: bytes, address: int) -> tuple[int, int, str, str] | None:
    """The first instruction of ``code`` (at ``address``) that may not fall through to the next, as
    (pc, size, mnemonic without prefixes, operands); None if ``code`` has none."""
    for pc, size, mnemonic, op_str in cs64().disasm_lite(code, address):
        word = mnemonic.split()[-1]  # "repz ret", "bnd jmp"
        if word in _BRANCHES or word == "ret" or word.startswith(("j", "loop")):
            return pc, size, word, op_str
    return None
