"""The initial process stack as Linux's create_elf_tables() lays it out.

From the top: AT_EXECFN string, environment strings, argument strings, the
platform string, 16 AT_RANDOM bytes, then (16-byte aligned at argc)
argc, argv[], NULL, envp[], NULL, auxv pairs ending in AT_NULL.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from emu.abi import AuxType

PLATFORM = b"x86_64"


@dataclass(frozen=True, slots=True)
class InitialStack:
    sp: int
    data: bytes  # the bytes at [sp, top)
    auxv: tuple[tuple[int, int], ...]
    argv_start: int
    argv_end: int
    env_start: int
    env_end: int


def build_stack(
    top: int,
    argv: list[bytes],
    envp: list[bytes],
    execfn: bytes,
    aux: list[tuple[AuxType, int]],
    random16: bytes,
) -> InitialStack:
    """``aux`` holds every entry except AT_EXECFN, AT_PLATFORM, AT_RANDOM, which point into the stack."""
    blob = bytearray()

    def push(data: bytes) -> int:
        blob[:0] = data
        return top - len(blob)

    push(b"\0" * 8)  # end marker, as Linux leaves one word below STACK_TOP
    execfn_at = push(execfn + b"\0")
    env_end = top - len(blob)
    env_ptrs = [push(s + b"\0") for s in reversed(envp)][::-1]
    env_start = top - len(blob)
    argv_end = env_start
    argv_ptrs = [push(s + b"\0") for s in reversed(argv)][::-1]
    argv_start = top - len(blob)
    platform_at = push(PLATFORM + b"\0")
    random_at = push(random16)
    full_aux = list(aux) + [
        (AuxType.AT_RANDOM, random_at),
        (AuxType.AT_EXECFN, execfn_at),
        (AuxType.AT_PLATFORM, platform_at),
        (AuxType.AT_NULL, 0),
    ]
    words = [len(argv), *argv_ptrs, 0, *env_ptrs, 0]
    for key, value in full_aux:
        words += [int(key), value]
    table = struct.pack(f"<{len(words)}Q", *words)
    sp = (top - len(blob) - len(table)) & ~0xF
    pad = (top - len(blob)) - (sp + len(table))
    push(b"\0" * pad)
    push(table)
    assert top - len(blob) == sp
    return InitialStack(
        sp=sp,
        data=bytes(blob),
        auxv=tuple((int(k), v) for k, v in full_aux),
        argv_start=argv_start,
        argv_end=argv_end,
        env_start=env_start,
        env_end=env_end,
    )
