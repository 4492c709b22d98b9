"""A hazard the survey finds in Debian's node, and the real Linux 6.18 kernel agrees.

node's ICU keeps values in rsp-32..rsp-1 across a 5-byte NOP in offsetTOCLookupFn (+0x13b), which it
runs when a script first looks up locale data. linux-6.18's optimized probe (its second hit there)
pushes over them: on this machine's kernel a uprobe at that site kills node with SIGSEGV, and so it
does in the emulation; under jmp-slots (the negative control) node prints what it prints unprobed.
fixtures/node_corpus.toml probes all 37 sites of node the static survey calls linux-6.18 hazards.
"""

from __future__ import annotations

import os

import pytest
from conftest import symbol_file_offset

from emu.check import CheckRequest, run_check
from emu.machine import RunOptions
from emu.native import NativeProbe, available, run_native

NODE = "/usr/bin/node"
ARGV = [NODE, "-e", 'console.log(new Intl.NumberFormat("de-DE").format(1234567.891))']
FUNCTION, SITE_OFFSET = "offsetTOCLookupFn", 0x13B

pytestmark = [pytest.mark.skipif(not os.path.exists(NODE), reason="needs Debian's nodejs"), pytest.mark.slow]


def _site() -> tuple[int, int]:
    """(link-time address, file offset) of the site: node is not PIE, its text starts at file offset 0."""
    from elftools.elf.elffile import ELFFile

    offset = symbol_file_offset(NODE, FUNCTION) + SITE_OFFSET
    with open(NODE, "rb") as fh:
        text = next(s for s in ELFFile(fh).iter_segments() if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1)
        return offset - text["p_offset"] + text["p_vaddr"], offset


def test_linux_6_18_crashes_node_in_icu_and_jmp_slots_does_not() -> None:
    address, _ = _site()
    reports = run_check(CheckRequest(NODE, ARGV, {}, specs=(f"uprobe:{address:#x}",), designs=("linux-6.18", "jmp-slots"),
                                     options=RunOptions(timeout_s=600)))
    linux, slots = reports
    assert linux.result is not None and slots.result is not None
    assert linux.result.signal is not None and linux.result.signal.name == "SIGSEGV" and not linux.same_output
    assert linux.hits == 2 and linux.violations.total > 0
    assert slots.result.signal is None and slots.same_output and slots.violations.total == 0 and slots.hits > 1000


@pytest.mark.skipif(not available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
def test_the_real_kernel_crashes_node_with_the_same_uprobe() -> None:
    _, offset = _site()
    probed = run_native(ARGV, [NativeProbe(NODE, offset)], env={}, no_aslr=True)
    plain = run_native(ARGV, [], env={}, no_aslr=True)
    assert plain.returncode == 0 and plain.stdout == b"1.234.567,891\n"
    assert probed.returncode == -11 and probed.counts == (2,)
