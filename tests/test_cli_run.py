"""`uprobe-emu run`: exit statuses, the crash line, --json, --max-insns, --timeout, bad options.

Through ``emu.cli.main`` with capfd (the guest writes to fds 1 and 2 directly), and a
few through a real ``python3 -m emu`` subprocess.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emu.cli import main
from emu.errors import EXIT_INSN_LIMIT, EXIT_TIMEOUT

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "elf_samples"
CRASH_LINE = re.compile(r"^uprobe-emu: killed by (SIG[A-Z]+) at 0x[0-9a-f]+: (.+) \((.+)\)$")


def sample(name: str) -> str:
    return str(SAMPLES / name)


def run_cli(capfd: pytest.CaptureFixture[str], *argv: str, verbose: bool = False) -> tuple[int, str, list[str]]:
    status = main([*(["-v"] if verbose else []), "run", "--clear-env", *argv])
    out, err = capfd.readouterr()
    return status, out, err.splitlines()


def one_error_line(lines: list[str]) -> str:
    assert len(lines) == 1, lines
    assert lines[0].startswith("uprobe-emu: ") and "Traceback" not in lines[0]
    return lines[0]


# --------------------------------------------------------------------------- exit statuses
def test_exit_status_is_the_guests(capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capfd, sample("exit_code"), "42") == (42, "", [])
    assert run_cli(capfd, sample("exit_code"))[0] == 3
    assert run_cli(capfd, sample("exit_code"), "0")[0] == 0


def test_hello(capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capfd, sample("hello_asm")) == (0, "hi\n", [])
    assert run_cli(capfd, sample("hello_static")) == (0, "hello, world\n", [])


@pytest.mark.parametrize("kind,signo,name,insn,detail", [
    ("segv", 11, "SIGSEGV", r"mov dword ptr \[rax\], 0x2a", "write to unmapped 0x0"),
    ("ill", 4, "SIGILL", "ud2", "invalid opcode"),
    ("trap", 5, "SIGTRAP", "int3", "breakpoint"),
    ("fpe", 8, "SIGFPE", "idiv .+", "divide error"),
])
def test_crash_is_death_by_the_signal_and_the_reason_only_with_verbose(
        capfd: pytest.CaptureFixture[str], kind: str, signo: int, name: str, insn: str, detail: str) -> None:
    status, out, err = run_cli(capfd, sample("crash"), kind)
    assert (status, err) == (-signo, [f"crash: {kind}"])  # main() says -N: the program then dies of N
    status, out, err = run_cli(capfd, sample("crash"), kind, verbose=True)
    assert status == -signo
    assert err[0] == f"crash: {kind}"  # the guest's own stderr line
    m = CRASH_LINE.match(one_error_line(err[1:]))
    assert m is not None, err
    assert m.group(1) == name and re.fullmatch(insn, m.group(2)) and m.group(3) == detail


def test_abort_is_sigabrt(capfd: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(capfd, sample("crash"), "abort", verbose=True)
    assert status == -6
    assert one_error_line(err[1:]).startswith("uprobe-emu: killed by SIGABRT")


def test_segv_exact_line(capfd: pytest.CaptureFixture[str]) -> None:
    _, _, err = run_cli(capfd, sample("crash"), "segv", verbose=True)
    assert err[1] == "uprobe-emu: killed by SIGSEGV at 0x401593: mov dword ptr [rax], 0x2a (write to unmapped 0x0)"


# --------------------------------------------------------------------------- --json
def test_json_of_a_clean_exit(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    status, out, err = run_cli(capfd, "--json", str(report), sample("hello_asm"))
    assert (status, out, err) == (0, "hi\n", [])
    doc = json.loads(report.read_text())
    assert doc["exit_status"] == 0 and doc["signal"] is None
    assert doc["insns"] == 8  # mov, mov, lea, mov, syscall, mov, xor, syscall
    assert doc["syscalls"] == {"write": 1, "exit_group": 1}
    assert doc["unknown_syscalls"] == {}


def test_json_of_a_crash(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    status, _, err = run_cli(capfd, "--json", str(report), sample("crash"), "segv")
    doc = json.loads(report.read_text())
    assert (status, doc["exit_status"]) == (-11, 139)
    assert err[1].startswith("uprobe-emu: killed by SIGSEGV")  # --json keeps the reason on stderr
    assert doc["signal"] == "SIGSEGV"
    assert isinstance(doc["insns"], int) and doc["insns"] > 1000
    assert doc["syscalls"]["write"] >= 1 and all(isinstance(n, int) and n > 0 for n in doc["syscalls"].values())
    assert "exit_group" not in doc["syscalls"]
    assert doc["unknown_syscalls"] == {}


def test_json_counts_unknown_syscalls(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # hello_asm with "mov $1, %eax" (write) turned into "mov $0x1ff, %eax": -ENOSYS, then exit_group(0).
    data = bytearray((SAMPLES / "hello_asm").read_bytes())
    assert data[0x1000] == 0xB8 and struct.unpack_from("<I", data, 0x1001) == (1,)
    struct.pack_into("<I", data, 0x1001, 0x1FF)
    prog = tmp_path / "unknown_syscall"
    prog.write_bytes(bytes(data))
    prog.chmod(0o755)
    report = tmp_path / "r.json"
    status, out, err = run_cli(capfd, "--json", str(report), str(prog))
    assert (status, out, err) == (0, "", [])
    doc = json.loads(report.read_text())
    assert doc["unknown_syscalls"] == {"syscall_0x1ff": 1}
    assert doc["syscalls"] == {"syscall_0x1ff": 1, "exit_group": 1}


# --------------------------------------------------------------------------- limits
def test_max_insns_stops_with_its_own_status(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    status, out, err = run_cli(capfd, "--max-insns", "1000", "--json", str(report), sample("cpu_bound"))
    assert status == EXIT_INSN_LIMIT and out == ""
    assert EXIT_INSN_LIMIT not in (124, 125, 126, 127)  # GNU timeout's: a wrapper must tell them apart
    line = one_error_line(err)
    assert "1000" in line and "--max-insns" in line
    doc = json.loads(report.read_text())
    assert doc["exit_status"] == EXIT_INSN_LIMIT and doc["signal"] is None and doc["ending"] == "insn-limit"
    assert doc["insns"] == 1000  # exactly: the block that would cross the limit runs one instruction at a time


def test_timeout_stops_with_its_own_status(capfd: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    status, out, err = run_cli(capfd, "--timeout", "0.5", sample("cpu_bound"), "5000000000")  # ~20 s unstopped
    elapsed = time.monotonic() - start
    assert status == EXIT_TIMEOUT and out == ""
    assert EXIT_TIMEOUT not in (124, 125, 126, 127)
    line = one_error_line(err)
    assert "--timeout" in line and "0.5" in line
    assert 0.4 < elapsed < 10


# --------------------------------------------------------------------------- bad options
@pytest.mark.parametrize("argv", [
    ["run", "--max-insns", "abc", sample("hello_asm")],
    ["run", "--timeout", "0", sample("hello_asm")],
    ["run", "--timeout", "-1", sample("hello_asm")],
    ["run", "--timeout", "soon", sample("hello_asm")],
    ["run", "--bogus", sample("hello_asm")],
    ["run", "--env", "NOEQUALS", sample("hello_asm")],
    ["run", "--env", "=x", sample("hello_asm")],
    ["run", "--rootfs", "/nonexistent/dir", sample("hello_asm")],
    ["run", "--exe-base", "zz", sample("hello_asm")],
    ["run"],
    [],
    ["frobnicate"],
])
def test_bad_options_exit_2_with_one_line(capfd: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(argv) == 2
    out, err = capfd.readouterr()
    assert out == ""
    one_error_line(err.splitlines())


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_insns_must_be_positive(capfd: pytest.CaptureFixture[str], value: str) -> None:
    assert main(["run", "--max-insns", value, sample("hello_asm")]) == 2
    one_error_line(capfd.readouterr().err.splitlines())


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_timeout_must_be_finite(capfd: pytest.CaptureFixture[str], value: str) -> None:
    assert main(["run", "--timeout", value, sample("hello_asm")]) == 2
    one_error_line(capfd.readouterr().err.splitlines())


def test_unwritable_json_is_a_harness_error(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run_cli(capfd, "--json", str(tmp_path / "no" / "such" / "dir.json"), sample("hello_asm"))
    assert status == 2
    assert "cannot write" in one_error_line(err)


# --------------------------------------------------------------------------- real processes
def _emu(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    return subprocess.run([sys.executable, "-m", "emu", "run", "--clear-env", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_subprocess_exit_status_and_crash_line() -> None:
    proc = _emu(sample("exit_code"), "42")
    assert (proc.returncode, proc.stdout, proc.stderr) == (42, "", "")
    proc = _emu(sample("crash"), "segv")
    assert (proc.returncode, proc.stderr) == (-signal.SIGSEGV, "crash: segv\n")  # dies of it, as natively
    native = subprocess.run([sample("crash"), "segv"], capture_output=True, text=True, timeout=60)
    assert (native.returncode, native.stderr) == (proc.returncode, proc.stderr)
    proc = _emu(sample("crash"), "abort")
    assert proc.returncode == -signal.SIGABRT


def test_subprocess_death_by_a_signal_dumps_no_core(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    cmd = f"ulimit -c unlimited; exec {sys.executable} -m emu -v run --clear-env {sample('crash')} segv"
    proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGSEGV
    assert proc.stderr.splitlines() == [
        "crash: segv",
        "uprobe-emu: killed by SIGSEGV at 0x401593: mov dword ptr [rax], 0x2a (write to unmapped 0x0)",
    ]
    assert list(tmp_path.iterdir()) == []  # no core file, whatever the caller's limit


def test_subprocess_bad_option() -> None:
    proc = _emu("--max-insns", "lots", sample("hello_asm"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "uprobe-emu: argument --max-insns: not a number: 'lots'\n"


@pytest.mark.parametrize("when, shown", [("2030-05-06", "2030-05-06T00:00:00"), ("2030-05-06T07:08:09", "2030-05-06T07:08:09"),
                                         ("@0", "1970-01-01T00:00:00"), (None, "2026-01-01T00:00:00")])
def test_clock_sets_the_guest_s_wall_clock_at_start(capfd: pytest.CaptureFixture[str], when: str | None,
                                                     shown: str) -> None:
    clock = [] if when is None else ["--clock", when]
    status, out, _ = run_cli(capfd, *clock, "/bin/date", "-u", "+%FT%T")
    assert status == 0 and out == shown + "\n"


def test_clock_now_is_this_host_s_time(capfd: pytest.CaptureFixture[str]) -> None:
    before = int(time.time())
    status, out, _ = run_cli(capfd, "--clock", "now", "/bin/date", "+%s")
    assert status == 0 and before <= int(out) <= int(time.time()) + 1


def test_a_clock_that_is_no_time_is_a_usage_error(capfd: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capfd, "--clock", "tomorrow", "/bin/date")
    assert status == 2 and out == "" and "argument --clock: not now, a date" in one_error_line(err)
