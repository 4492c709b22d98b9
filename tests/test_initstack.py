"""emu.process.initstack: the initial stack, parsed back word by word."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emu.abi import STACK_TOP, AuxType
from emu.errors import UsageError
from emu.process.initstack import MAX_ARG_STRLEN, PLATFORM, InitialStack, build_stack

REPO = Path(__file__).resolve().parent.parent
RANDOM = bytes(range(0xA0, 0xB0))
AUX = [(AuxType.AT_PHDR, 0x400040), (AuxType.AT_PAGESZ, 4096), (AuxType.AT_ENTRY, 0x401000)]


def word(stack: InitialStack, addr: int) -> int:
    off = addr - stack.sp
    return int(struct.unpack_from("<Q", stack.data, off)[0])


def cstring(stack: InitialStack, addr: int) -> bytes:
    off = addr - stack.sp
    return stack.data[off : stack.data.index(b"\0", off)]


def parse(stack: InitialStack) -> tuple[list[bytes], list[bytes], list[tuple[int, int]]]:
    """Walk the stack as a libc _start does: argc, argv[], NULL, envp[], NULL, auxv to AT_NULL."""
    addr = stack.sp
    argc = word(stack, addr)
    argv = [cstring(stack, word(stack, addr + 8 * (1 + i))) for i in range(argc)]
    addr += 8 * (1 + argc)
    assert word(stack, addr) == 0
    addr += 8
    envp = []
    while (ptr := word(stack, addr)) != 0:
        envp.append(cstring(stack, ptr))
        addr += 8
    addr += 8
    aux = []
    while True:
        key, value = word(stack, addr), word(stack, addr + 8)
        aux.append((key, value))
        addr += 16
        if key == AuxType.AT_NULL:
            return argv, envp, aux


def build(argv: list[bytes], envp: list[bytes], execfn: bytes = b"/bin/prog") -> InitialStack:
    return build_stack(STACK_TOP, argv, envp, execfn, list(AUX), RANDOM)


def test_initstack_does_not_import_unicorn() -> None:
    code = "import sys, emu.process.initstack; assert 'unicorn' not in sys.modules, 'unicorn imported'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_layout() -> None:
    s = build([b"prog", b"-x", b""], [b"A=1", b"HOME=/root"], execfn=b"/usr/bin/prog")
    assert s.sp % 16 == 0
    assert s.sp + len(s.data) == STACK_TOP
    argv, envp, aux = parse(s)
    assert argv == [b"prog", b"-x", b""]
    assert envp == [b"A=1", b"HOME=/root"]
    keys = [k for k, _ in aux]
    # The caller's entries in order, then the three that point into the stack, then AT_NULL.
    assert keys == [*(int(k) for k, _ in AUX), AuxType.AT_RANDOM, AuxType.AT_EXECFN, AuxType.AT_PLATFORM, 0]
    assert aux[:3] == [(int(k), v) for k, v in AUX]
    assert s.auxv == tuple(aux)
    values = dict(aux)
    off = values[AuxType.AT_RANDOM] - s.sp
    assert s.data[off : off + 16] == RANDOM
    assert cstring(s, values[AuxType.AT_EXECFN]) == b"/usr/bin/prog"
    assert cstring(s, values[AuxType.AT_PLATFORM]) == PLATFORM == b"x86_64"
    # The very top: the execfn string, then one zero word up to STACK_TOP.
    assert s.data[-8:] == bytes(8)
    assert values[AuxType.AT_EXECFN] == STACK_TOP - 8 - len(b"/usr/bin/prog\0")


def test_string_areas_order_and_bounds() -> None:
    """Linux copies execfn, then envp, then argv downwards: argv strings below env strings below execfn."""
    s = build([b"a", b"bc"], [b"X=1"])
    off = s.argv_start - s.sp
    assert s.data[off : s.argv_end - s.sp] == b"a\0bc\0"  # /proc/self/cmdline
    assert s.data[s.env_start - s.sp : s.env_end - s.sp] == b"X=1\0"  # /proc/self/environ
    assert s.argv_end == s.env_start
    values = dict(s.auxv)
    assert values[AuxType.AT_EXECFN] == s.env_end
    # Below argv: alignment to 16, the platform string, then the 16 random bytes right under it.
    assert values[AuxType.AT_PLATFORM] == (s.argv_start & ~15) - len(PLATFORM) - 1
    assert values[AuxType.AT_RANDOM] == values[AuxType.AT_PLATFORM] - 16


def test_empty_argv_and_env() -> None:
    s = build([], [])
    argv, envp, aux = parse(s)
    assert (argv, envp) == ([], [])
    assert s.sp % 16 == 0 and aux[-1] == (0, 0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=40).filter(lambda b: b"\0" not in b), max_size=8),
    st.lists(st.binary(max_size=40).filter(lambda b: b"\0" not in b), max_size=8),
    st.binary(min_size=0, max_size=30).filter(lambda b: b"\0" not in b),
)
def test_any_strings_round_trip_with_an_aligned_sp(argv: list[bytes], envp: list[bytes], execfn: bytes) -> None:
    s = build(argv, envp, execfn)
    assert s.sp % 16 == 0
    got_argv, got_envp, aux = parse(s)
    assert (got_argv, got_envp) == (argv, envp)
    values = dict(aux)
    assert cstring(s, values[AuxType.AT_EXECFN]) == execfn
    assert (values[AuxType.AT_PLATFORM] + len(PLATFORM) + 1) % 16 == 0  # arch_align_stack() above it
    # The pointer table sits right above sp, below every string and the random bytes.
    table_end = s.sp + 8 * (1 + len(argv) + 1 + len(envp) + 1) + 16 * len(aux)
    assert table_end <= values[AuxType.AT_RANDOM] < table_end + 16


def test_many_strings() -> None:
    """Linux's limit is in bytes, not in count: 100000 arguments are fine (and must build in linear time)."""
    argv = [b"%d" % i for i in range(100_000)]
    s = build(argv, [b"A=1"])
    got_argv, envp, _ = parse(s)
    assert got_argv == argv and envp == [b"A=1"]


def test_refusals() -> None:
    with pytest.raises(UsageError, match=r"argv\[1\] contains a NUL"):
        build([b"prog", b"a\0b"], [])
    with pytest.raises(UsageError, match=r"environment\[0\] is too long"):
        build([b"prog"], [b"A=" + b"x" * MAX_ARG_STRLEN])
    with pytest.raises(UsageError, match="argument list too long"):
        build_stack(STACK_TOP, [b"x" * 1000] * 10, [], b"/p", [], RANDOM, max_bytes=5000)
    with pytest.raises(ValueError, match="16 bytes"):
        build_stack(STACK_TOP, [], [], b"/p", [], b"short")
