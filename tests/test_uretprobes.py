"""Uretprobe corner cases (spec 5): the depth limit, chained returns, longjmp over probed frames."""

from __future__ import annotations

from pathlib import Path

import pytest

from emu.designs import DESIGNS
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.machine import Machine, RunOptions

EDGE = str(Path(__file__).resolve().parent.parent / "elf_samples" / "uret_edge")


def run(design: str, *args: str, probes: dict[str, list[tuple[str, int]]]) -> tuple[Machine, bytes]:
    io = GuestIO.captured()
    m = Machine(EDGE, [EDGE, *args], {}, RunOptions(design=design), io)
    log: list[tuple[str, int]] = []
    for name, sink in probes.items():
        def on_return(hit: Hit, name: str = name, sink: list[tuple[str, int]] = sink) -> None:
            sink.append((name, hit.regs.ax))
            log.append((name, hit.regs.ax))

        m.attach(f"uretprobe:{name}", Consumer(ret_handler=on_return))
    result = m.run()
    assert result.exit_status == 0, result.message
    return m, bytes(io.out)


@pytest.mark.parametrize("design", list(DESIGNS))
def test_only_64_nested_frames_are_hijacked(design: str) -> None:
    seen: list[tuple[str, int]] = []
    m, out = run(design, "depth", "70", probes={"rec": seen})
    assert out == b"rec=2485\n"
    assert len(seen) == 64  # MAX_URETPROBE_DEPTH; deeper calls return unprobed
    # the 64 outermost frames: rec(70) down to rec(7); their sums are n(n+1)/2
    assert sorted(v for _, v in seen) == sorted(n * (n + 1) // 2 for n in range(7, 71))
    assert m.uprobes.return_instances == []


@pytest.mark.parametrize("design", list(DESIGNS))
def test_tail_call_chains_share_one_trampoline_return(design: str) -> None:
    a: list[tuple[str, int]] = []
    b: list[tuple[str, int]] = []
    m, out = run(design, "chain", "3", probes={"chain_a": a, "chain_b": b})
    assert out == b"chain=36\n"
    assert [v for _, v in a] == [v for _, v in b] == [11, 12, 13]
    trampoline_returns = sum(m.uprobes.stats.exits.values())
    if design in ("linux-6.18", "jmp-slots", "nop10", "uretprobe-rfc"):
        assert trampoline_returns == 3  # one syscall per return, both handlers in it
    assert m.uprobes.stats.ret_hits == 6


@pytest.mark.parametrize("design", list(DESIGNS))
def test_longjmp_drops_skipped_frames_without_their_handlers(design: str) -> None:
    lj: list[tuple[str, int]] = []
    leaf: list[tuple[str, int]] = []
    m, out = run(design, "longjmp", "5", probes={"lj": lj, "leaf": leaf})
    assert out == b"after longjmp 0 leaf=40\nafter longjmp 1 leaf=42\n"
    assert lj == []
    assert [v for _, v in leaf] == [40, 42]
