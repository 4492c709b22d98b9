"""A hazard the survey confirms in Debian's libLLVM-14, and the real Linux 6.18 kernel agrees.

`llc -O2` of fixtures/regalloc_pressure.ll splits the leaf nodes of its register allocator's interval
maps. In IntervalMapImpl::adjustSiblingSizes<LeafNode<SlotIndex, LiveInterval*, 8>> a 5-byte NOP sits
where the function keeps values in rsp-40..rsp-33, rsp-28..rsp-21 and rsp-16..rsp-9: linux-6.18's
optimized probe (call into the trampoline, then push rcx, r11, rax) overwrites them. The survey's
corpus run (fixtures/llvm_corpus.toml) sees them read back; the emulated run of that one site differs
from the unprobed run; and on this machine's kernel, the same uprobe kills llc with SIGSEGV.
"""

from __future__ import annotations

import os

import pytest
from conftest import FIXTURES_DIR, symbol_file_offset

from emu.check import CheckRequest, run_check
from emu.machine import RunOptions
from emu.native import NativeProbe, available, run_native

LLC = "/usr/lib/llvm-14/bin/llc"
LIBLLVM = os.path.realpath("/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1")
FUNCTION = ("_ZN4llvm15IntervalMapImpl18adjustSiblingSizesINS0_8LeafNodeINS_9SlotIndexEPNS_12LiveIntervalELj8ENS_"
            "15IntervalMapInfoIS3_EEEEEEvPPT_jPjPKj")
SITE_OFFSET = 0x1FB  # the NOP's offset in the function (the survey names the site FUNCTION+0x1fb)
INPUT = str(FIXTURES_DIR / "regalloc_pressure.ll")
ARGV = [LLC, "-O2", INPUT, "-o", "-"]

needs_llvm = pytest.mark.skipif(not (os.path.exists(LLC) and os.path.exists(LIBLLVM)), reason="needs Debian's llvm-14")
pytestmark = [needs_llvm, pytest.mark.slow]


def _site() -> int:
    """The site's file offset in this libLLVM (its link-time address too: the text is mapped at offset 0)."""
    return symbol_file_offset(LIBLLVM, FUNCTION) + SITE_OFFSET


def _emulated(design: str) -> tuple[bool, int, str]:
    report = run_check(CheckRequest(LLC, ARGV, {}, specs=(f"uprobe:{LIBLLVM}:{_site():#x}",), designs=(design,),
                                    options=RunOptions(timeout_s=600)))[0]
    assert report.result is not None
    signal = report.result.signal
    return report.same_output, report.violations.total, "exit" if signal is None else signal.name


def test_linux_6_18_clobbers_the_live_red_zone_and_llc_crashes() -> None:
    same, violations, ending = _emulated("linux-6.18")
    assert not same and violations > 0 and ending == "SIGSEGV"


def test_negative_control_jmp_slots_leaves_llc_alone() -> None:
    assert _emulated("jmp-slots") == (True, 0, "exit")


@pytest.mark.skipif(not available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
def test_the_real_kernel_crashes_llc_with_the_same_uprobe() -> None:
    """This machine's Linux 6.18 with a uprobe at the site (hit twice: INT3, then the optimized call):
    llc dies with SIGSEGV in adjustSiblingSizes. Without the probe it compiles the file."""
    probed = run_native(ARGV, [NativeProbe(LIBLLVM, _site())], env={}, no_aslr=True)
    plain = run_native(ARGV, [], env={}, no_aslr=True)
    assert plain.returncode == 0 and b".globl\tf" in plain.stdout
    assert probed.returncode == -11 and probed.counts == (2,), probed.stderr[-400:]
    assert b"adjustSiblingSizes" in probed.stderr
