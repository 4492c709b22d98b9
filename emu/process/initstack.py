"""The initial process stack as Linux's create_elf_tables() lays it out.

From the top: one zero word, the AT_EXECFN string, environment strings, argument
strings, padding to 16 bytes (arch_align_stack() with ASLR off), the platform
string, 16 AT_RANDOM bytes, then (16-byte aligned at argc) argc, argv[], NULL,
envp[], NULL, auxv pairs ending in AT_NULL.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from emu.abi import STACK_SIZE, AuxType
from emu.errors import UsageError

PLATFORM = b"x86_64"
MAX_ARG_STRLEN = 32 * 4096  # Linux: longest single argument or environment string, NUL included
MAX_ARG_BYTES = STACK_SIZE // 4  # Linux: strings and pointers may use a quarter of RLIMIT_STACK


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
    max_bytes: int = MAX_ARG_BYTES,
    align_pad: int = 0,
) -> InitialStack:
    """``aux`` in the order the kernel writes it; the values of AT_RANDOM, AT_EXECFN and AT_PLATFORM,
    which point into the stack, are filled in here (an entry left out is appended, in that order).

    Refuses (:class:`UsageError`, Linux's E2BIG) strings with a NUL inside, longer than
    MAX_ARG_STRLEN, or more than ``max_bytes`` of strings and pointers in all. ``align_pad``: the bytes
    arch_align_stack takes off below the strings (random with ASLR, 0 without).
    """
    if len(random16) != 16:
        raise ValueError("AT_RANDOM needs exactly 16 bytes")
    if top % 16:
        raise ValueError(f"stack top {top:#x} is not 16-byte aligned")
    _check_strings("argv", argv)
    _check_strings("environment", envp)
    _check_strings("execfn", [execfn])
    total = sum(len(s) + 1 + 8 for s in (*argv, *envp)) + len(execfn) + 1
    if total > max_bytes:
        raise UsageError(f"argument list too long ({total} bytes of arguments and environment, limit {max_bytes})")
    # Addresses first, top down as Linux copies them (copy_strings() takes envp and argv last to
    # first, so element 0 ends up lowest), then one buffer: prepending piece by piece is quadratic.
    execfn_at = top - 8 - (len(execfn) + 1)  # one zero word at the very top
    env_end = execfn_at
    env_start = env_end - sum(len(e) + 1 for e in envp)
    argv_end = env_start
    argv_start = argv_end - sum(len(a) + 1 for a in argv)
    platform_at = ((argv_start - align_pad) & ~0xF) - (len(PLATFORM) + 1)  # arch_align_stack() first
    random_at = platform_at - 16
    env_ptrs = _string_addresses(env_start, envp)
    argv_ptrs = _string_addresses(argv_start, argv)
    placed = {AuxType.AT_RANDOM: random_at, AuxType.AT_EXECFN: execfn_at, AuxType.AT_PLATFORM: platform_at}
    keys = {key for key, _ in aux}
    full_aux = [(key, placed.get(key, value)) for key, value in aux]
    full_aux += [(key, value) for key, value in placed.items() if key not in keys] + [(AuxType.AT_NULL, 0)]
    words = [len(argv), *argv_ptrs, 0, *env_ptrs, 0]
    for key, value in full_aux:
        words += [int(key), value]
    table = struct.pack(f"<{len(words)}Q", *words)
    sp = (random_at - len(table)) & ~0xF  # STACK_ROUND(): argc 16-byte aligned
    blob = bytearray(top - sp)

    def put(addr: int, data: bytes) -> None:
        blob[addr - sp : addr - sp + len(data)] = data

    put(sp, table)
    put(random_at, random16)
    put(platform_at, PLATFORM + b"\0")
    put(argv_start, b"".join(a + b"\0" for a in argv))
    put(env_start, b"".join(e + b"\0" for e in envp))
    put(execfn_at, execfn + b"\0")
    return InitialStack(
        sp=sp,
        data=bytes(blob),
        auxv=tuple((int(k), v) for k, v in full_aux),
        argv_start=argv_start,
        argv_end=argv_end,
        env_start=env_start,
        env_end=env_end,
    )


def _string_addresses(start: int, strings: list[bytes]) -> list[int]:
    out = []
    for s in strings:
        out.append(start)
        start += len(s) + 1
    return out


def _check_strings(what: str, strings: list[bytes]) -> None:
    for i, s in enumerate(strings):
        if b"\0" in s:
            raise UsageError(f"{what}[{i}] contains a NUL byte")
        if len(s) + 1 > MAX_ARG_STRLEN:
            raise UsageError(f"{what}[{i}] is too long ({len(s)} bytes, limit {MAX_ARG_STRLEN - 1})")
