"""strace-style lines: checked on real runs, against real strace where it can run, and call by call."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
from conftest import DEFAULT_ENV, REPO, GuestKernel, run_emulated, sample

from emu import abi
from emu.kernel.strace import format_call

AT_FDCWD = abi.AT_FDCWD & 0xFFFFFFFF
HEX = r"0x[0-9a-f]+"


def traced(argv: list[str], **opts: Any) -> list[str]:
    lines: list[str] = []
    run_emulated(argv, cwd=REPO, strace=lines.append, **opts)
    return lines


@pytest.fixture(scope="module")
def hello_lines() -> list[str]:
    return traced([sample("hello_dynamic")])


def test_openat_without_o_creat_shows_no_mode(hello_lines: list[str]) -> None:
    assert 'openat(AT_FDCWD, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3' in hello_lines
    assert 'openat(AT_FDCWD, "/lib/x86_64-linux-gnu/libc.so.6", O_RDONLY|O_CLOEXEC) = 3' in hello_lines


def test_fstat_through_newfstatat_names_its_flag(hello_lines: list[str]) -> None:
    assert any(re.fullmatch(rf'newfstatat\(3, "", {HEX}, AT_EMPTY_PATH\) = 0', line) for line in hello_lines)


def test_named_arguments(hello_lines: list[str]) -> None:
    assert 'access("/etc/ld.so.preload", R_OK) = -1 ENOENT (No such file or directory)' in hello_lines
    assert any(re.fullmatch(rf"arch_prctl\(ARCH_SET_FS, {HEX}\) = 0", line) for line in hello_lines)
    assert any(re.fullmatch(rf"prlimit64\(0, RLIMIT_STACK, NULL, {HEX}\) = 0", line) for line in hello_lines)
    assert any(re.fullmatch(rf"getrandom\({HEX}, 8, GRND_NONBLOCK\) = 8", line) for line in hello_lines)
    assert any(re.fullmatch(rf"mmap\(NULL, \d+, PROT_READ, MAP_PRIVATE, 3, 0x0\) = {HEX}", line)
               for line in hello_lines)


def test_write_and_exit_group(hello_lines: list[str]) -> None:
    assert 'write(1, "hello, world\\n", 13) = 13' in hello_lines
    assert hello_lines[-1] == "exit_group(0) = ?"


def test_exit_status_is_shown() -> None:
    assert traced([sample("exit_code"), "7"])[-1] == "exit_group(7) = ?"


def test_a_killed_guest_ends_with_the_signal() -> None:
    lines = traced([sample("crash"), "segv"])
    assert 'write(2, "crash: segv\\n", 12) = 12' in lines
    assert lines[-1] == "+++ killed by SIGSEGV +++"


@pytest.mark.skipif(not shutil.which("ls"), reason="/bin/ls absent")
def test_statx_and_xattr_lines_of_ls() -> None:
    lines = traced(["/bin/ls", "-l", "fixtures/hello.c"])
    assert any(re.fullmatch(
        r'statx\(AT_FDCWD, "fixtures/hello.c", AT_STATX_SYNC_AS_STAT\|AT_SYMLINK_NOFOLLOW\|AT_NO_AUTOMOUNT, '
        rf"STATX_MODE\|STATX_NLINK\|STATX_UID\|STATX_GID\|STATX_MTIME\|STATX_SIZE, {HEX}\) = 0", line)
        for line in lines), "\n".join(lines)
    assert any(line.startswith('lgetxattr("fixtures/hello.c", "security.selinux", ') for line in lines)
    assert any(re.fullmatch(rf"ioctl\(1, TCGETS, {HEX}\) = -1 ENOTTY \(Inappropriate ioctl for device\)", line)
               for line in lines)


def test_unknown_syscalls_print_as_numbers() -> None:
    lines = traced(["/usr/bin/ionice"])  # ioprio_get (252) is not emulated
    assert any(re.fullmatch(rf"syscall_0xfc\(({HEX}, ){{5}}{HEX}\) = -1 ENOSYS \(Function not implemented\)", line)
               for line in lines)


# ------------------------------------------------------------------------------------ against strace
def _strace_works() -> bool:
    """strace is installed and may ptrace here (a container can forbid it)."""
    strace = shutil.which("strace")
    if strace is None:
        return False
    proc = subprocess.run([strace, "-qq", "-e", "trace=exit_group", "/bin/true"], capture_output=True, text=True,
                          timeout=60, check=False)
    return proc.returncode == 0 and "ptrace" not in proc.stderr


needs_strace = pytest.mark.skipif(not _strace_works(), reason="strace is not installed or cannot ptrace on this host")


def _real_strace(argv: list[str], syscalls: str) -> list[str]:
    strace = shutil.which("strace") or "strace"
    proc = subprocess.run([strace, "-qq", "-e", f"trace={syscalls}", "-o", "/dev/stderr", *argv], cwd=REPO,
                          env=DEFAULT_ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-400:]
    return [re.sub(r"\s+= ", " = ", line) for line in proc.stderr.splitlines()]


@needs_strace
def test_open_lines_match_real_strace() -> None:
    """Same calls, same flags spelling, same order, same results as strace 6 prints for the native run."""
    argv = [sample("hello_dynamic")]
    native = _real_strace(argv, "openat,access,close,exit_group")
    ours = [line for line in traced(argv) if line.split("(", 1)[0] in ("openat", "access", "close", "exit_group")]
    assert ours == native


@needs_strace
def test_statx_flags_match_real_strace() -> None:
    argv = ["/bin/ls", "-l", "fixtures/hello.c"]
    native = [line.rsplit(", {", 1)[0] for line in _real_strace(argv, "statx") if line.startswith("statx(")]
    ours = [line.rsplit(", 0x", 1)[0] for line in traced(argv) if line.startswith("statx(")]
    assert ours == native and ours


# --------------------------------------------------------------------------------------- call by call
@pytest.fixture(scope="module")
def g() -> GuestKernel:
    return GuestKernel()


def _line(g: GuestKernel, name: str, args: tuple[int, ...], ret: int = 3) -> str:
    row = g.kernel.table[g.nr(name)]
    return format_call(name, row.args, args + (0,) * (6 - len(args)), ret, g.mem)


def test_mode_only_with_o_creat_or_o_tmpfile(g: GuestKernel) -> None:
    path = g.cstr("/tmp/x")
    creat = abi.O_WRONLY | abi.O_CREAT | abi.O_TRUNC
    assert _line(g, "openat", (AT_FDCWD, path, creat, 0o644)) == \
        'openat(AT_FDCWD, "/tmp/x", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3'
    assert _line(g, "openat", (AT_FDCWD, path, abi.O_RDWR | abi.O_TMPFILE, 0o600)) == \
        'openat(AT_FDCWD, "/tmp/x", O_RDWR|O_TMPFILE, 0600) = 3'
    assert _line(g, "openat", (AT_FDCWD, path, abi.O_RDONLY, 0o777)) == 'openat(AT_FDCWD, "/tmp/x", O_RDONLY) = 3'
    assert _line(g, "open", (path, abi.O_CREAT, 0)) == 'open("/tmp/x", O_RDONLY|O_CREAT, 000) = 3'
    assert _line(g, "open", (path, abi.O_RDONLY | abi.O_DIRECTORY | abi.O_CLOEXEC | abi.O_NONBLOCK, 0)) == \
        'open("/tmp/x", O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_DIRECTORY) = 3'


def test_at_flags_by_name(g: GuestKernel) -> None:
    path = g.cstr("f")
    assert _line(g, "newfstatat", (AT_FDCWD, path, 0x1000, abi.AT_SYMLINK_NOFOLLOW), 0) == \
        'newfstatat(AT_FDCWD, "f", 0x1000, AT_SYMLINK_NOFOLLOW) = 0'
    assert _line(g, "newfstatat", (AT_FDCWD, path, 0x1000, 0), 0) == 'newfstatat(AT_FDCWD, "f", 0x1000, 0) = 0'
    assert _line(g, "newfstatat", (AT_FDCWD, path, 0x1000, 0x1100), -2) == \
        'newfstatat(AT_FDCWD, "f", 0x1000, AT_SYMLINK_NOFOLLOW|AT_EMPTY_PATH) = -1 ENOENT (No such file or directory)'
    assert _line(g, "statx", (5, g.cstr(""), abi.AT_EMPTY_PATH, 0xFFF, 0x2000), 0) == \
        'statx(5, "", AT_STATX_SYNC_AS_STAT|AT_EMPTY_PATH, STATX_BASIC_STATS|STATX_BTIME, 0x2000) = 0'
    assert _line(g, "unlinkat", (AT_FDCWD, path, abi.AT_REMOVEDIR), -30) == \
        'unlinkat(AT_FDCWD, "f", AT_REMOVEDIR) = -1 EROFS (Read-only file system)'
