"""Bad binaries: exactly one line on stderr naming the file and the problem, exit status 2, no traceback.

The bad files are copies of elf_samples/hello_asm (or hello_dynamic, for the interpreter)
damaged with struct in tmp_path. The last test mutates hello_asm at random with hypothesis:
every mutant must end in a one-line EmuError or a clean guest ending, never anything else.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emu.cli import main
from emu.errors import EXIT_HARNESS_ERROR, EmuError
from emu.guestio import GuestIO
from emu.machine import Ending, Machine, RunOptions

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "elf_samples"
HELLO_ASM = (SAMPLES / "hello_asm").read_bytes()
HELLO_DYNAMIC = (SAMPLES / "hello_dynamic").read_bytes()
PHOFF, PHENT = 64, 56
PT_NULL, PT_LOAD, PT_INTERP = 0, 1, 3


# --------------------------------------------------------------------------- building bad files
def write_program(path: Path, data: bytes) -> Path:
    """``data`` as a program file: with its execute bits, so that the run gets past execve's permission check."""
    path.write_bytes(data)
    path.chmod(0o755)
    return path


def phdrs(data: bytes | bytearray) -> list[int]:
    """File offsets of the program headers."""
    phoff, = struct.unpack_from("<Q", data, 32)
    phnum, = struct.unpack_from("<H", data, 56)
    return [phoff + PHENT * i for i in range(phnum)]


def load_headers(data: bytes) -> list[int]:
    return [off for off in phdrs(data) if struct.unpack_from("<I", data, off)[0] == PT_LOAD]


def patched(base: bytes, *edits: tuple[int, str, int]) -> bytes:
    data = bytearray(base)
    for offset, fmt, value in edits:
        struct.pack_into(fmt, data, offset, value)
    return bytes(data)


def with_interp(interp: bytes, base: bytes = HELLO_DYNAMIC) -> bytes:
    """hello_dynamic whose PT_INTERP names ``interp`` (appended to the file, NUL-terminated)."""
    data = bytearray(base)
    at = len(data)
    data += interp + b"\0"
    for off in phdrs(data):
        if struct.unpack_from("<I", data, off)[0] == PT_INTERP:
            struct.pack_into("<QQQQQ", data, off + 8, at, 0x318, 0x318, len(interp) + 1, len(interp) + 1)
    return bytes(data)


LOADS = load_headers(HELLO_ASM)
TEXT = LOADS[1]  # the r-x PT_LOAD: offset 0x1000, vaddr 0x401000, 0x22 bytes

# (name, file bytes, expected problem)
BAD_FILES: list[tuple[str, bytes, str]] = [
    ("text", b"echo hi\n", "not an ELF file"),
    ("script_without_interpreter", b"#!\necho hi\n", "a script execve would refuse (ENOEXEC)"),
    ("empty", b"", "not an ELF file"),
    ("truncated_header", HELLO_ASM[:40], "truncated ELF header"),
    ("truncated_phdrs", HELLO_ASM[: PHOFF + PHENT + 10], "truncated program headers"),
    ("elf32", patched(HELLO_ASM, (4, "B", 1)), "32-bit ELF (ELFCLASS32) is not supported"),
    ("big_endian", patched(HELLO_ASM, (5, "B", 2)), "not a little-endian ELF"),
    ("aarch64", patched(HELLO_ASM, (18, "<H", 183)), "not an x86-64 ELF (e_machine 183: AArch64)"),
    ("i386", patched(HELLO_ASM, (18, "<H", 3)), "not an x86-64 ELF (e_machine 3: i386)"),
    ("object", patched(HELLO_ASM, (16, "<H", 1)), "not an executable or shared object (a relocatable object"),
    ("no_phdrs", patched(HELLO_ASM, (56, "<H", 0)), "no program headers"),
    ("bad_phentsize", patched(HELLO_ASM, (54, "<H", 64)), "bad program header size 64"),
    ("no_pt_load", patched(HELLO_ASM, *[(off, "<I", PT_NULL) for off in LOADS]), "no PT_LOAD segment"),
    ("past_eof", patched(HELLO_ASM, (TEXT + 8, "<Q", 0x10000)), "segment at 0x401000 extends past the end of the file"),
    ("past_eof_truncated", HELLO_ASM[:0x1010], "segment at 0x401000 extends past the end of the file"),
    ("memsz_huge", patched(HELLO_ASM, (TEXT + 40, "<Q", 1 << 62)), "beyond the user address space"),
    ("memsz_absurd", patched(HELLO_ASM, (TEXT + 40, "<Q", 1 << 44)), "has an absurd size (0x100000000000 bytes)"),
    ("filesz_gt_memsz", patched(HELLO_ASM, (TEXT + 40, "<Q", 0x10)), "has p_filesz 0x22 > p_memsz 0x10"),
    ("vaddr_kernel", patched(HELLO_ASM, (TEXT + 16, "<Q", 0xFFFFFFFF81000000)), "beyond the user address space"),
    ("incongruent", patched(HELLO_ASM, (TEXT + 16, "<Q", 0x401800)), "not page-congruent"),
    ("at_zero", patched(HELLO_ASM, (LOADS[0] + 16, "<Q", 0)), "outside the user address space"),
    ("interp_not_terminated", patched(HELLO_DYNAMIC, (0x318 + 0x1B, "B", ord("x"))), "bad PT_INTERP (not NUL-terminated)"),
    ("missing_interp", with_interp(b"/nonexistent/ld-linux-x86-64.so.2"),
     "interpreter /nonexistent/ld-linux-x86-64.so.2 not found under /"),
]


def run_cli(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    status = main(["run", "--clear-env", *argv])
    out, err = capfd.readouterr()
    return status, out, err.splitlines()


def assert_one_error_line(status: int, out: str, err: list[str], *needles: str) -> str:
    assert status == EXIT_HARNESS_ERROR, err
    assert out == ""
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("uprobe-emu: ") and "Traceback" not in line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@pytest.mark.parametrize("name,data,problem", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_file(capfd: pytest.CaptureFixture[str], tmp_path: Path, name: str, data: bytes, problem: str) -> None:
    path = write_program(tmp_path / name, data)
    status, out, err = run_cli(capfd, str(path))
    line = assert_one_error_line(status, out, err, problem)
    assert line.startswith(f"uprobe-emu: {path}: ")


# --------------------------------------------------------------------------- files that cannot be read
def _directory(tmp: Path) -> Path:
    return tmp


def _missing(tmp: Path) -> Path:
    return tmp / "missing"


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")  # opening it would block forever: it must be refused before that
    return tmp / "fifo"


def _parent_not_a_directory(tmp: Path) -> Path:
    write_program(tmp / "file", HELLO_ASM)
    return tmp / "file" / "hello_asm"


def _dev_null(_tmp: Path) -> Path:
    return Path("/dev/null")


def _name_too_long(tmp: Path) -> Path:
    return tmp / ("x" * 300)


UNREADABLE: list[tuple[str, Callable[[Path], Path], str]] = [
    ("directory", _directory, "is a directory"),
    ("missing", _missing, "no such file"),
    ("fifo", _fifo, "not a regular file"),
    ("parent_is_a_file", _parent_not_a_directory, "Not a directory"),
    ("device", _dev_null, "not a regular file"),
    ("name_too_long", _name_too_long, "File name too long"),
]


@pytest.mark.parametrize("name,make,problem", UNREADABLE, ids=[u[0] for u in UNREADABLE])
def test_unreadable(capfd: pytest.CaptureFixture[str], tmp_path: Path, name: str,
                    make: Callable[[Path], Path], problem: str) -> None:
    path = make(tmp_path)
    status, out, err = run_cli(capfd, str(path))
    line = assert_one_error_line(status, out, err, problem)
    assert line.startswith(f"uprobe-emu: {path}: ")


def test_a_program_without_an_execute_bit_is_refused_as_execve_would(capfd: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    """Root included: execve needs some execute bit on a regular file (EACCES), and so does the run."""
    path = tmp_path / "not_executable"
    path.write_bytes(HELLO_ASM)
    path.chmod(0o644)
    status, out, err = run_cli(capfd, str(path))
    assert_one_error_line(status, out, err, str(path), "permission denied", "EACCES")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file anyway (the FIFO and ENOTDIR cases cover it)")
def test_chmod_000(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(HELLO_ASM)
    path.chmod(0)
    status, out, err = run_cli(capfd, str(path))
    assert_one_error_line(status, out, err, str(path), "cannot read: Permission denied")


# --------------------------------------------------------------------------- interpreters
def test_interpreter_that_is_not_an_elf(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "lib64").mkdir(parents=True)
    (root / "lib64" / "ld-linux-x86-64.so.2").write_text("not a loader\n")
    status, out, err = run_cli(capfd, "--rootfs", str(root), str(SAMPLES / "hello_dynamic"))
    assert_one_error_line(status, out, err, str(root / "lib64" / "ld-linux-x86-64.so.2"), "not an ELF file")


def test_interpreter_that_is_a_directory(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_program(tmp_path / "prog", with_interp(b"/tmp"))
    status, out, err = run_cli(capfd, str(path))
    assert_one_error_line(status, out, err, "is a directory")


def test_interpreter_name_with_a_newline_stays_on_one_line(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_program(tmp_path / "prog", with_interp(b"/no\nsuch/ld.so"))
    status, out, err = run_cli(capfd, str(path))
    assert_one_error_line(status, out, err, str(path), "interpreter /no\\nsuch/ld.so not found")


def test_interpreter_with_an_overlong_component(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_program(tmp_path / "prog", with_interp(b"/" + b"a" * 300))
    status, out, err = run_cli(capfd, str(path))
    assert_one_error_line(status, out, err, str(path), "not found")


# --------------------------------------------------------------------------- real processes
def _emu(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "emu", "run", "--clear-env", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_subprocess_not_an_elf(tmp_path: Path) -> None:
    path = write_program(tmp_path / "script", b"echo hi\n")  # ("#!/bin/sh" would run: tests/test_scripts.py)
    proc = _emu(str(path))
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"uprobe-emu: {path}: not an ELF file\n")


def test_subprocess_missing_interpreter_and_unreadable(tmp_path: Path) -> None:
    prog = write_program(tmp_path / "prog", with_interp(b"/nonexistent/ld.so"))
    proc = _emu(str(prog))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"uprobe-emu: {prog}: interpreter /nonexistent/ld.so not found under /\n"
    os.mkfifo(tmp_path / "fifo")
    proc = _emu(str(tmp_path / "fifo"))
    assert (proc.returncode, proc.stderr) == (2, f"uprobe-emu: {tmp_path / 'fifo'}: not a regular file\n")


# --------------------------------------------------------------------------- random mutants
# Fields worth hitting with special values: (offset in the ELF header, struct format).
EHDR_FIELDS = [(16, "<H"), (18, "<H"), (24, "<Q"), (32, "<Q"), (40, "<Q"), (54, "<H"), (56, "<H"), (58, "<H"),
               (60, "<H"), (62, "<H")]
# Fields of one program header: p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align.
PHDR_FIELDS = [(0, "<I"), (4, "<I"), (8, "<Q"), (16, "<Q"), (24, "<Q"), (32, "<Q"), (40, "<Q"), (48, "<Q")]
SPECIAL = [0, 1, 2, 3, 6, 7, 0x40, 0xFFF, 0x1000, 0x1001, 0x2000, 0x400000, 0x401000, 0x402000, 0x7FFFFFFFE000,
           0x7FFFFFFFF000, 1 << 36, 1 << 40, 1 << 47, 1 << 63, (1 << 64) - 1, 0x6474E551]
REGIONS = [(0, 64), (64, 64 + 4 * PHENT), (0x1000, 0x1022), (0x2000, 0x2003), (0, len(HELLO_ASM))]


def _value(fmt: str) -> st.SearchStrategy[int]:
    bits = struct.calcsize(fmt) * 8
    return st.one_of(st.sampled_from([v for v in SPECIAL if v < 1 << bits]), st.integers(0, (1 << bits) - 1))


@st.composite
def mutants(draw: st.DrawFn) -> bytes:
    data = bytearray(HELLO_ASM)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["byte", "byte", "ehdr", "phdr", "phdr", "truncate"]))
        if kind == "byte":
            lo, hi = draw(st.sampled_from(REGIONS))
            at = draw(st.integers(lo, hi - 1))
            if at < len(data):
                data[at] = draw(st.integers(0, 255))
        elif kind == "ehdr":
            offset, fmt = draw(st.sampled_from(EHDR_FIELDS))
            value = draw(_value(fmt))
            if offset + struct.calcsize(fmt) <= len(data):
                struct.pack_into(fmt, data, offset, value)
        elif kind == "phdr":
            field, fmt = draw(st.sampled_from(PHDR_FIELDS))
            offset = PHOFF + PHENT * draw(st.integers(0, 3)) + field
            value = draw(_value(fmt))
            if offset + struct.calcsize(fmt) <= len(data):
                struct.pack_into(fmt, data, offset, value)
        else:
            del data[draw(st.integers(0, len(data))) :]
    return bytes(data)


@pytest.fixture(scope="module")
def mutant_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mutants") / "mutant"


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=mutants())
def test_mutated_hello_asm_fails_cleanly_or_runs(mutant_path: Path, data: bytes) -> None:
    path = str(write_program(mutant_path, data))
    try:
        machine = Machine(path, [path], {}, RunOptions(max_insns=100_000, timeout_s=2), GuestIO.captured())
        result = machine.run()
    except EmuError as exc:
        text = str(exc)
        assert text and "\n" not in text and exc.exit_status == EXIT_HARNESS_ERROR
        return
    assert result.ending in (Ending.EXITED, Ending.KILLED, Ending.INSN_LIMIT, Ending.TIMEOUT, Ending.BLOCKED)
    if result.ending is Ending.KILLED:
        assert result.signal is not None and result.exit_status == 128 + result.signal
    elif result.ending is Ending.EXITED:
        assert 0 <= result.exit_status <= 255 and result.signal is None
    assert result.message is None or "\n" not in result.message


def test_garbage_section_headers_do_not_matter(tmp_path: Path) -> None:
    """Linux ignores section headers when it executes a file; so must the harness."""
    path = write_program(tmp_path / "prog", patched(HELLO_ASM, (40, "<Q", 1 << 40)))  # e_shoff far past the end
    io = GuestIO.captured()
    result = Machine(str(path), [str(path)], {}, RunOptions(max_insns=100_000), io).run()
    assert (result.exit_status, bytes(io.out)) == (0, b"hi\n")
