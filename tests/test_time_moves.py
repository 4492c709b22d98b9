"""Time moves in a busy process: the virtual clock advances with the instructions run and the kernel
entries made (emu/kernel/clock.py), so clocks, CPU clocks, interval and POSIX timers, alarm and timerfd
see time pass in a process that never sleeps, and a timer's signal comes where Linux delivers it: on a
return to user mode, inside a uprobe trampoline included. Each check runs natively and emulated."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import symbol_file_offset

from emu import hotpath
from emu.guestio import GuestIO
from emu.kernel import clock
from emu.machine import Machine, RunOptions
from emu.native import NativeProbe, run_native
from emu.native import available as native_available

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
TIME_MOVES, TIMER_SIGNALS = str(SAMPLES / "time_moves"), str(SAMPLES / "timer_signals")
EXPECTED = {
    "interleave": "interleave increasing",
    "cputime": "cputime moves",
    "real": "itimer 5 signals",
    "virtual": "itimer 5 signals",
    "prof": "itimer 5 signals",
    "alarm": "alarm runs down",
    "posix": "posix 5 signals",
    "posix-cpu": "posix 5 signals",
    "overrun": "overrun 1 signal, 8 or more overruns",
    "timerfd": "timerfd 8 or more expirations",
}
DEC_JNZ_INSNS = 2 * 10_000_000  # the `rate` check's loop, by default
TIMER_ARGV = [TIMER_SIGNALS, "20", "50"]  # 20 ms of a 50 us ITIMER_REAL: 400 SIGALRMs
needs_native_uprobes = pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")


def emulated(argv: list[str], probes: tuple[str, ...] = (), design: str = "linux-6.18") -> tuple[str, int]:
    io = GuestIO.captured()
    machine = Machine(argv[0], argv, {}, RunOptions(design=design), io)
    for spec in probes:
        machine.attach(spec)
    result = machine.run()
    return bytes(io.out).decode(), result.exit_status


def native(argv: list[str]) -> tuple[str, int]:
    done = subprocess.run(argv, capture_output=True, env={}, timeout=60)
    return done.stdout.decode(), done.returncode


@pytest.mark.parametrize("check", list(EXPECTED))
def test_a_busy_process_sees_time_pass_as_natively(check: str) -> None:
    expected = (EXPECTED[check] + "\n", 0)
    assert native([TIME_MOVES, check]) == expected
    assert emulated([TIME_MOVES, check]) == expected


def _rate() -> int:
    out, status = emulated([TIME_MOVES, "rate"])
    assert status == 0, out
    return int(out.split()[1])


def test_the_clock_runs_at_the_documented_rate_and_the_same_in_every_run() -> None:
    ns = _rate()
    if hotpath.native is None:  # a Python block counter would cost too much: a reading starts no count
        assert ns == clock.UNCOUNTED_TICK_NS
    else:
        assert ns == pytest.approx(clock.work_ns(DEC_JNZ_INSNS), abs=2_000)
    assert _rate() == ns  # virtual time: deterministic


def test_negative_control_a_clock_that_ignores_instructions_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Time moved only by readings and waits: the checks see it stand."""
    monkeypatch.setattr(clock, "NS_PER_KILO_INSNS", 0)
    assert emulated([TIME_MOVES, "cputime"])[0].startswith("cputime stands")
    assert _rate() <= clock.UNCOUNTED_TICK_NS


def test_an_exec_reads_the_same_clock_through_its_new_vdso() -> None:
    """The vDSO's reading hook follows an exec: the second date never reads an earlier time."""
    out, status = emulated(["/bin/bash", "-c", "date +%s%N; exec date +%s%N"])
    first, second = (int(line) for line in out.split())
    assert status == 0 and second > first


# ----------------------------------------------- where the timer's signals land, against the real kernel
def _classes(out: str) -> dict[str, int]:
    return {name: int(count) for name, count in (line.split() for line in out.splitlines())}


def _timer_signals_native(probed: bool) -> dict[str, int]:
    probes = [NativeProbe(TIMER_SIGNALS, symbol_file_offset(TIMER_SIGNALS, "probed"))] if probed else []
    done = run_native(TIMER_ARGV, probes, env={}, no_aslr=True)
    assert done.returncode == 0, done.stderr
    return _classes(done.stdout.decode())


def _timer_signals_emulated(probed: bool) -> dict[str, int]:
    out, status = emulated(TIMER_ARGV, ("uprobe:probed",) if probed else ())
    assert status == 0, out
    return _classes(out)


def _inside_the_trampoline(got: dict[str, int]) -> float:
    return got["trampoline-syscall"] / got["signals"]


def test_an_interval_timer_interrupts_a_busy_loop_every_period() -> None:
    """Every period gives a signal; none lands in a trampoline when nothing is probed."""
    got = _timer_signals_emulated(probed=False)
    assert got["signals"] == 400 and got["trampoline-syscall"] == got["trampoline-other"] == 0
    assert got["probed"] + got["program"] == 400


def test_timer_signals_land_inside_the_trampoline_after_its_syscall_and_elsewhere() -> None:
    """The expiry falls in sys_uprobe most often (a kernel entry costs more than the loop's instructions):
    the signal comes on that syscall's return, rip just after it; the others land in the loop."""
    got = _timer_signals_emulated(probed=True)
    assert got["signals"] == 400 and _inside_the_trampoline(got) > 0.8
    assert got["probed"] + got["program"] + got["trampoline-other"] > 0


@needs_native_uprobes
def test_timer_signals_land_where_the_real_kernel_delivers_them() -> None:
    native_got, emulated_got = _timer_signals_native(probed=True), _timer_signals_emulated(probed=True)
    assert native_got["signals"] > 50  # enough for a share (a loaded machine merges periods: one SIGALRM pending at a time)
    for got in (native_got, emulated_got):
        assert _inside_the_trampoline(got) > 0.8 and got["elsewhere"] == 0
        assert got["probed"] + got["program"] + got["trampoline-other"] > 0
    assert abs(_inside_the_trampoline(native_got) - _inside_the_trampoline(emulated_got)) < 0.1
    unprobed = _timer_signals_native(probed=False)  # the control: no trampoline, no signal in one
    assert unprobed["trampoline-syscall"] == unprobed["trampoline-other"] == 0
