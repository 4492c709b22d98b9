"""The counting-only fast path of the optimized syscalls behaves exactly like the full path."""

from __future__ import annotations

from pathlib import Path

import pytest

from emu.guestio import GuestIO
from emu.kernel.uprobes import syscalls
from emu.kernel.uprobes.consumers import Consumer
from emu.machine import Machine, RunOptions

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
REDZONE = str(SAMPLES / "redzone_probe")
SITES = {"linux-6.18": "uprobe:rz_nop5_site", "jmp-slots": "uprobe:rz_nop5_site", "nop10": "uprobe:rz_nop10_site"}


def run(design: str, consumer: Consumer) -> tuple[bytes, int, dict[str, int], int]:
    io = GuestIO.captured()
    m = Machine(REDZONE, [REDZONE, "6"], {}, RunOptions(design=design), io)
    m.attach(SITES[design], consumer)
    m.attach("usdt:redzone:site", Consumer(handler=None))
    result = m.run()
    return bytes(io.out), result.exit_status, result.exits, consumer.hits


@pytest.mark.parametrize("design", list(SITES))
def test_fast_and_full_paths_agree(design: str) -> None:
    fast = run(design, Consumer())
    full = run(design, Consumer(handler=lambda hit: None))  # a handler forces the pt_regs round trip
    assert fast == full
    assert fast[3] == 6


@pytest.mark.parametrize("design", list(SITES))
def test_counting_consumers_take_the_fast_path(design: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_full_path(*_: object) -> None:
        raise AssertionError("the full sys_uprobe path ran")

    monkeypatch.setattr(syscalls, "syscall_entry_regs", no_full_path)
    out, status, exits, hits = run(design, Consumer())
    optimized_probes = 1 if design == "nop10" else 2  # under nop10 the usdt's nop1+nop5 stays on INT3
    assert hits == 6 and sum(exits.values()) == 5 * optimized_probes  # the first hit of each is INT3
    with pytest.raises(AssertionError, match="full sys_uprobe path"):
        run(design, Consumer(handler=lambda hit: None))
