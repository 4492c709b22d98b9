"""Every sample and a few Debian programs: stdout, stderr and exit status under emulation equal native.

Both sides get the same argv, the same (small, fixed) environment, the same cwd and stdin,
and pipes for all three streams. A native death by signal N is compared as 128+N. Each
emulated run must also have hit no unknown syscall (nothing was left to -ENOSYS).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import DEFAULT_ENV, FIXTURES_DIR, REPO, Outcome, run_emulated, run_native, sample

from emu.abi import Signal
from emu.machine import Ending

OLD_TIME = (1583298367, 1583298367)  # 2020-03-04 05:06:07 UTC: "old" for ls -l both natively and for the guest clock


def absent(path: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not os.path.exists(path), reason=f"{path} absent")


def compare(argv: list[str], *, cwd: str | Path = REPO, env: dict[str, str] | None = None, stdin: bytes = b"",
            **opts: Any) -> tuple[Outcome, Outcome]:
    """Run natively and emulated; assert they agree; return both for further checks."""
    native = run_native(argv, env, cwd=cwd, stdin=stdin)
    emulated = run_emulated(argv, env, cwd=cwd, stdin=stdin, **opts)
    assert emulated.observed() == native.observed()
    assert emulated.result is not None
    assert emulated.result.unknown_syscalls == {}
    return native, emulated


# ------------------------------------------------------------------------------------------- samples
SAMPLE_CASES = [
    pytest.param(["hello_static"], id="hello_static"),
    pytest.param(["hello_static_pie"], id="hello_static_pie"),
    pytest.param(["hello_dynamic"], id="hello_dynamic"),
    pytest.param(["argv_env", "one", "two words", ""], id="argv_env"),
    pytest.param(["file_reader", "fixtures/hello.c"], id="file_reader"),
    pytest.param(["file_reader", "fixtures/no-such-file"], id="file_reader-missing"),
    pytest.param(["file_reader"], id="file_reader-usage"),
    pytest.param(["cpu_bound", "10"], id="cpu_bound"),
    pytest.param(["exit_code"], id="exit_code-default"),
    pytest.param(["exit_code", "77"], id="exit_code-77"),
    pytest.param(["crash"], id="crash-usage"),
    pytest.param(["redzone_probe"], id="redzone_probe"),
    pytest.param(["probe_targets"], id="probe_targets"),
    pytest.param(["usdt_sample"], id="usdt_sample"),
    pytest.param(["hello_asm"], id="hello_asm"),
]


@pytest.mark.parametrize("argv", SAMPLE_CASES)
def test_sample_matches_native(argv: list[str]) -> None:
    native, _ = compare([sample(argv[0]), *argv[1:]])
    assert native.out or native.err or native.status  # every case shows something to compare


def test_argv_env_sees_exactly_the_environment_given() -> None:
    env = {**DEFAULT_ENV, "EMU_TEST_VAR": "a=b c", "EMPTY": ""}
    native, emulated = compare([sample("argv_env"), "x"], env=env)
    assert b"env=EMU_TEST_VAR=a=b c\n" in emulated.out
    assert emulated.status == 2


def test_hello_reads_what_is_expected() -> None:
    _, emulated = compare([sample("hello_dynamic")])
    assert emulated.out == b"hello, world\n"
    assert emulated.status == 0


def test_file_reader_copies_the_fixture() -> None:
    _, emulated = compare([sample("file_reader"), "fixtures/hello.c"])
    size = (FIXTURES_DIR / "hello.c").stat().st_size
    assert emulated.out == (FIXTURES_DIR / "hello.c").read_bytes()
    assert f"bytes={size}".encode() in emulated.err


@pytest.mark.parametrize("kind, signo", [
    ("segv", Signal.SIGSEGV), ("ill", Signal.SIGILL), ("trap", Signal.SIGTRAP),
    ("fpe", Signal.SIGFPE), ("abort", Signal.SIGABRT),
])
def test_crash_dies_of_the_same_signal(kind: str, signo: Signal) -> None:
    native, emulated = compare([sample("crash"), kind])
    assert native.status == emulated.status == 128 + signo
    assert emulated.err == f"crash: {kind}\n".encode()
    assert emulated.result is not None
    assert emulated.result.ending is Ending.KILLED
    assert emulated.result.signal is signo
    assert b"uprobe-emu" not in emulated.err  # the harness's own line is the CLI's, not the guest's


def test_getpid_loop_sums_its_own_pid() -> None:
    """The pid differs natively; the output's shape is sum=N*pid on both sides."""
    n = 50
    native = run_native([sample("getpid_loop"), str(n)], cwd=REPO)
    emulated = run_emulated([sample("getpid_loop"), str(n)], cwd=REPO, pid=31337)
    assert native.pid is not None
    assert native.out == f"sum={n * native.pid}\n".encode()
    assert emulated.out == f"sum={n * 31337}\n".encode()
    assert (native.err, native.status) == (emulated.err, emulated.status) == (b"", 0)


# --------------------------------------------------------------------------------------- Debian tools
@absent("/bin/true")
def test_true() -> None:
    native, _ = compare(["/bin/true"])
    assert native.observed() == (b"", b"", 0)


@absent("/bin/echo")
def test_echo() -> None:
    native, _ = compare(["/bin/echo", "a", "b"])
    assert native.out == b"a b\n"


@absent("/bin/ls")
def test_ls_fixtures() -> None:
    native, _ = compare(["/bin/ls", "fixtures"])
    assert b"hello.c\n" in native.out


@absent("/bin/ls")
def test_ls_missing_file_fails_alike() -> None:
    native, _ = compare(["/bin/ls", "fixtures/nope"])
    assert native.status == 2 and b"No such file" in native.err


def _small_tree(tmp_path: Path, stamp: tuple[int, int] | None) -> Path:
    """outer/inner with a file, a bigger file, a symlink, a dangling symlink and a private subdir."""
    outer = tmp_path / "outer"
    inner = outer / "inner"
    (inner / "sub").mkdir(parents=True)
    (inner / "a.txt").write_text("hello\n")
    (inner / "big.bin").write_bytes(b"x" * 5000)
    (inner / "link").symlink_to("a.txt")
    (inner / "dangling").symlink_to("/nonexistent/target")
    (inner / "sub").chmod(0o700)
    if stamp is not None:
        for p in (inner / "link", inner / "dangling"):
            os.utime(p, stamp, follow_symlinks=False)
        for p in (inner / "a.txt", inner / "big.bin", inner / "sub", inner, outer):
            os.utime(p, stamp)
    return outer


@absent("/bin/ls")
@pytest.mark.parametrize("flags", ["-la", "-laiR", "-f", "-la --full-time", "-l --time-style=+%s -S -r"])
def test_ls_long_listing_of_a_small_tree(tmp_path: Path, flags: str) -> None:
    """Sizes, modes, owners, times and inode numbers come from the host's stat: they must match."""
    outer = _small_tree(tmp_path, OLD_TIME)
    native, _ = compare(["/bin/ls", *flags.split(), "inner"], cwd=outer)
    assert native.status == 0
    if "-l" in flags:
        assert b"link -> a.txt" in native.out


@absent("/bin/ls")
def test_ls_recent_files_with_the_guest_clock_set_to_now(tmp_path: Path) -> None:
    """ls prints hh:mm for files younger than six months: that needs the (injectable) clock near now."""
    outer = _small_tree(tmp_path, None)
    native = run_native(["/bin/ls", "-la", "inner"], cwd=outer)
    emulated = run_emulated(["/bin/ls", "-la", "inner"], cwd=outer, realtime_start_ns=time.time_ns())
    assert emulated.observed() == native.observed()
    assert re.search(rb" \d\d:\d\d a\.txt\n", native.out)


# stat without %x: the access time may move between the two runs when other tests read the file.
MORE_TOOLS = [
    "sort fixtures/Makefile", "wc fixtures/hello.c fixtures/crash.c", "head -n 3 fixtures/crash.c",
    "stat -c %n/%s/%b/%i/%h/%u/%g/%A/%F/%y/%z fixtures/hello.c", "md5sum fixtures/hello.c", "readlink -f /bin/sh", "id",
    "stat -f -c %T/%s/%S/%l/%i fixtures", "findmnt -n -o TARGET,SOURCE,FSTYPE -T fixtures",
]


@pytest.mark.parametrize("command", MORE_TOOLS)
def test_more_debian_tools(command: str) -> None:
    argv = command.split()
    argv[0] = f"/usr/bin/{argv[0]}"
    if not os.path.exists(argv[0]):
        pytest.skip(f"{argv[0]} absent")
    native, _ = compare(argv)
    assert native.out


@absent("/bin/cat")
def test_cat_fixture() -> None:
    native, _ = compare(["/bin/cat", "fixtures/hello.c"])
    assert native.out == (FIXTURES_DIR / "hello.c").read_bytes()


@absent("/bin/cat")
def test_cat_stdin_and_files_and_a_missing_one() -> None:
    native, _ = compare(["/bin/cat", "fixtures/exit_code.c", "-", "fixtures/missing", "fixtures/hello.c"],
                        stdin=b"from stdin\n")
    assert b"from stdin\n" in native.out and native.status == 1


@absent("/bin/cat")
def test_cat_proc_self_cmdline() -> None:
    native, _ = compare(["/bin/cat", "/proc/self/cmdline"])
    assert native.out == b"/bin/cat\0/proc/self/cmdline\0"


@absent("/bin/sh")
def test_sh_echo() -> None:
    native, _ = compare(["/bin/sh", "-c", "echo x"])
    assert native.out == b"x\n"


@absent("/bin/sh")
def test_sh_builtins_args_cwd_stdin_and_status() -> None:
    script = 'echo "$0" "$1"; cd fixtures && pwd; echo *.S; read line; echo "got $line" >&2; umask; exit 3'
    native, _ = compare(["/bin/sh", "-c", script, "zero", "one"], stdin=b"a line\n")
    assert native.status == 3 and b"got a line" in native.err


PYTHON = "/usr/bin/python3.11"
# Python's start-up under emulation takes 1-4 s here (about 600 syscalls): slow-marked so a
# quick local run can say -m "not slow"; CI runs them.


@pytest.mark.slow
@absent(PYTHON)
def test_python_prints_42() -> None:
    native, _ = compare([PYTHON, "-c", "print(6*7)"])
    assert native.out == b"42\n"


@pytest.mark.slow
@absent(PYTHON)
def test_python_argv_cwd_listdir_realpath(tmp_path: Path) -> None:
    outer = _small_tree(tmp_path, OLD_TIME)
    code = ("import os, sys; print(sys.argv[1:], os.getcwd(), os.listdir('inner'), os.path.realpath('inner/link'),"
            " os.stat('inner/big.bin').st_size, os.environ['TZ'])")
    native, _ = compare([PYTHON, "-c", code, "arg"], cwd=outer)
    assert native.out.startswith(b"['arg'] ")


@pytest.mark.slow
@absent(PYTHON)
def test_python_stdin_stderr_and_exit_status() -> None:
    code = "import sys; data = sys.stdin.read(); sys.stderr.write('err\\n'); print(data.upper()); sys.exit(5)"
    native, _ = compare([PYTHON, "-c", code], stdin=b"abc\n")
    assert native.observed() == (b"ABC\n\n", b"err\n", 5)


@pytest.mark.slow
@absent(PYTHON)
def test_python_uncaught_exception_traceback() -> None:
    native, _ = compare([PYTHON, "-c", "import json; json.loads('{')"])
    assert native.status == 1 and b"JSONDecodeError" in native.err


@pytest.mark.slow
@absent(PYTHON)
def test_python_stdlib_imports() -> None:
    code = ("import hashlib, re, collections, datetime, locale, time;"
            "print(hashlib.sha256(b'x').hexdigest()[:12], re.sub('a+', '-', 'caaat'), time.tzname,"
            " locale.getpreferredencoding())")
    native, _ = compare([PYTHON, "-c", code])
    assert native.out.startswith(b"2d711642b726 c-t")


@pytest.mark.slow
@absent(PYTHON)
def test_python_killed_by_its_own_signal() -> None:
    native, _ = compare([PYTHON, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert native.status == 128 + Signal.SIGTERM
