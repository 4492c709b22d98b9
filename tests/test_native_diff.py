"""The same binary under the real Linux 6.18 kernel on this machine and under the emulated
linux-6.18 design: the red-zone corruption must be identical, byte for byte in the output.

The native side attaches through perf_event_open on the uprobe PMU (needs root and the PMU;
skipped, never failed, without them).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from conftest import link_file_offset, symbol_file_offset
from elftools.elf.elffile import ELFFile

from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.native import NativeProbe, run_native
from emu.native import available as native_available
from emu.probes import usdt_notes

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
REDZONE = str(SAMPLES / "redzone_probe")
TARGETS = str(SAMPLES / "probe_targets")


pytestmark = pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")


def _elf(path: str) -> ELFFile:
    return ELFFile(io.BytesIO(Path(path).read_bytes()))


def _emulated(path: str, argv: list[str], specs: list[str]) -> tuple[bytes, int, list[int]]:
    io_ = GuestIO.captured()
    m = Machine(path, argv, {}, RunOptions(design="linux-6.18"), io_)
    atts = [m.attach(s) for s in specs]
    result = m.run()
    return bytes(io_.out), result.exit_status, [a.consumer.hits for a in atts]


def test_red_zone_corruption_is_identical_natively_and_emulated() -> None:
    elf = _elf(REDZONE)
    site = symbol_file_offset(REDZONE, "rz_nop5_site")
    usdt = next(n for n in usdt_notes(elf) if n.name == "site")
    # libbpf's combo rule on this kernel: the probe goes on the nop5 after the 90
    probes = [NativeProbe(REDZONE, site), NativeProbe(REDZONE, link_file_offset(REDZONE, usdt.pc + 1))]
    native = run_native([REDZONE, "5"], probes, env={})
    out, status, hits = _emulated(REDZONE, [REDZONE, "5"], ["uprobe:rz_nop5_site", "usdt:redzone:site"])
    assert b"MISMATCH rz_nop5 i=1" in native.stdout  # the real kernel clobbers from the second hit on
    assert (native.stdout, native.returncode) == (out, status)
    assert list(native.counts) == hits == [5, 5]


@pytest.mark.parametrize("name", ["f_nop5", "f_nop5_66", "f_nop1", "f_nopl5_reg1", "t_ret", "t_push", "t_callrax",
                                  "t_riprel", "t_popf_site", "mc_add"])
def test_probe_targets_agree(name: str) -> None:
    native = run_native([TARGETS, "4"], [NativeProbe(TARGETS, symbol_file_offset(TARGETS, name))], env={})
    out, status, hits = _emulated(TARGETS, [TARGETS, "4"], [f"uprobe:{name}"])
    assert (native.stdout, native.returncode, list(native.counts)) == (out, status, hits)


@pytest.mark.parametrize("name", ["t_push", "t_nop5", "mc_mul"])
def test_uretprobe_counts_agree(name: str) -> None:
    native = run_native([TARGETS, "3"], [NativeProbe(TARGETS, symbol_file_offset(TARGETS, name), retprobe=True)], env={})
    out, status, hits = _emulated(TARGETS, [TARGETS, "3"], [f"uretprobe:{name}"])
    assert (native.stdout, native.returncode, list(native.counts)) == (out, status, hits)


SYSCALLS = str(SAMPLES / "uprobe_syscall")
HELLO_DYNAMIC = str(SAMPLES / "hello_dynamic")
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def _run_native_plain(argv: list[str]) -> tuple[bytes, int]:
    import subprocess

    done = subprocess.run(argv, capture_output=True, env={}, timeout=60)
    return done.stdout, 128 - done.returncode if done.returncode < 0 else done.returncode


@pytest.mark.parametrize("args", [["error"], ["syscall_call", "335"]])
def test_uprobe_syscalls_called_directly(args: list[str]) -> None:
    """336 from ordinary code is -ENXIO; 335 from outside the trampoline is SIGILL."""
    native = _run_native_plain([SYSCALLS, *args])
    out, status, _ = _emulated(SYSCALLS, [SYSCALLS, *args], [])
    assert native == (out, status)


def test_red_zone_test_of_the_nop10_series_agrees_for_nop5() -> None:
    site = symbol_file_offset(SYSCALLS, "uprobe_red_zone_site_nop5")
    native = run_native([SYSCALLS, "redzone", "nop5", "6"], [NativeProbe(SYSCALLS, site)], env={})
    out, status, hits = _emulated(SYSCALLS, [SYSCALLS, "redzone", "nop5", "6"], ["uprobe:uprobe_red_zone_site_nop5"])
    assert (native.stdout, native.returncode, list(native.counts)) == (out, status, hits)


@pytest.mark.skipif(not Path(LIBC).exists(), reason=f"{LIBC} absent")
def test_probe_inside_libc_counts_agree() -> None:
    native = run_native([HELLO_DYNAMIC], [NativeProbe(os.path.realpath(LIBC), symbol_file_offset(LIBC, "fwrite"))], env={})
    out, status, hits = _emulated(HELLO_DYNAMIC, [HELLO_DYNAMIC], [f"uprobe:{LIBC}:fwrite"])
    assert (native.stdout, native.returncode, list(native.counts)) == (out, status, hits) == (b"hello, world\n", 0, [1])


def _regs_words(out: bytes) -> tuple[list[str], list[str]]:
    lines = dict(line.split("=", 1) for line in out.decode().splitlines() if "=" in line)
    return lines["before"].split(), lines["after"].split()


@pytest.mark.parametrize("retprobe", [False, True])
def test_every_register_survives_the_site_natively_and_emulated(retprobe: bool) -> None:
    """uprobe_regs (spec 6 #1 and #10): all pt_regs words equal before and after the probed call, but rax."""
    trigger = symbol_file_offset(SYSCALLS, "uprobe_regs_trigger")
    argv = [SYSCALLS, "regs", "2"]  # the first call optimizes the entry probe
    native = run_native(argv, [NativeProbe(SYSCALLS, trigger, retprobe=retprobe)], env={})
    out, status, hits = _emulated(SYSCALLS, argv, [f"{'uretprobe' if retprobe else 'uprobe'}:uprobe_regs_trigger"])
    for text, count in ((native.stdout, native.counts[0]), (out, hits[0])):
        before, after = _regs_words(text)
        assert after[10] == "0xdeadbeef" and after[:10] + after[11:] == before[:10] + before[11:]
        assert count == 3
    assert (native.returncode, status) == (0, 0)


def test_live_state_sees_the_real_kernel_s_red_zone_clobber_and_nothing_else() -> None:
    """The mutation fixture against the real 6.18: only its red-zone bit (4) is set, as emulated;
    unprobed it is clean."""
    live = str(SAMPLES / "live_state")
    assert run_native([live, "3"], [], env={}).returncode == 0
    native = run_native([live, "3"], [NativeProbe(live, symbol_file_offset(live, "nop5_site"))], env={})
    out, status, hits = _emulated(live, [live, "3"], ["uprobe:nop5_site"])
    assert native.stdout == b"live_state errors=0x04\n" and native.returncode == 4
    assert (native.stdout, native.returncode) == (out, status)
    assert list(native.counts) == hits == [3]
