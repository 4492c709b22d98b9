"""The kernel's usdt selftest, user side (spec 6, U1 basic and U4 optimized_red_zone)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from conftest import attach_exe

from emu.designs import DESIGNS
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Hit
from emu.machine import Attachment, Machine, RunOptions

ARGS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "usdt_args")
ST_X = 101


def machine(design: str, *argv: str) -> tuple[Machine, GuestIO]:
    io = GuestIO.captured()
    return Machine(ARGS, [ARGS, *argv], {}, RunOptions(design=design), io), io


def recorder(att: Attachment, sink: list[list[int]]) -> None:
    note = att.resolved.usdt
    assert note is not None

    def record(hit: Hit) -> None:
        sink.append([arg.read(hit.regs, hit.read) for arg in note.args])

    att.consumer.handler = record


def semaphore(m: Machine, att: Attachment) -> int:
    assert att.resolved.semaphore is not None
    return int(struct.unpack("<H", m.mem.read(att.resolved.semaphore, 2))[0])


@pytest.mark.parametrize("design", list(DESIGNS))
def test_basic_counts_values_and_sizes(design: str) -> None:
    m, io = machine(design, "basic", "2")
    seen: dict[str, list[list[int]]] = {"usdt0": [], "usdt3": [], "usdt12": []}
    atts = {name: attach_exe(m, f"usdt:test:{name}") for name in seen}
    for name, att in atts.items():
        recorder(att, seen[name])
        assert semaphore(m, att) == 1
    result = m.run()
    assert (result.exit_status, bytes(io.out)) == (0, b"called=2\n")
    assert seen["usdt0"] == [[], []]
    assert [v[:2] for v in seen["usdt3"]] == [[1, 42], [2, 42]]
    assert seen["usdt3"][0][2] == seen["usdt3"][1][2] != 0  # &bla, the same both times
    for x, values in zip((1, 2), seen["usdt12"], strict=True):
        assert values[:6] == [x, x + 1, 42, x + 42, 5, 6]
        assert values[6] == seen["usdt3"][0][2]  # &bla again
        assert values[8:] == [ST_X, -1, 0, ord("c")]  # st.x (a sym(%rip) operand), nums[2], nums[3], chars[2]
    usdt12 = atts["usdt12"].resolved.usdt
    assert usdt12 is not None
    assert [abs(a.size) for a in usdt12.args] == [4, 4, 8, 8, 4, 8, 8, 8, 4, 2, 2, 1]


@pytest.mark.parametrize("design", list(DESIGNS))
def test_reattach_fires_again_and_semaphores_drop_to_zero(design: str) -> None:
    m, _ = machine(design, "basic", "3")
    first = m.attach("usdt:test:usdt3")
    assert isinstance(first, Attachment)
    first.detach()
    assert semaphore(m, first) == 0
    second = m.attach("usdt:test:usdt3")
    assert isinstance(second, Attachment)
    m.run()
    assert (first.consumer.hits, second.consumer.hits) == (0, 3)
    second.detach()
    assert semaphore(m, second) == 0


@pytest.mark.parametrize("design", list(DESIGNS))
def test_optimized_red_zone_args_stay_intact(design: str) -> None:
    m, io = machine(design, "red_zone", "10")
    att = m.attach("usdt:test:usdt_red_zone")
    assert isinstance(att, Attachment)
    seen: list[list[int]] = []
    recorder(att, seen)
    m.run()
    assert bytes(io.out) == b"intact=10/10\n"
    assert seen == [[0xDEADBEEF, 0xCAFEBABE, 0xFEEDFACE]] * 10  # arg_total 10, arg_bad 0
    pc = att.resolved.address
    if design == "nop10":  # the nop1+nop10 combo: the probe moves to +1 and is optimized (U3/U4)
        assert att.address == pc + 1
        assert m.mem.read(pc, 7) == bytes.fromhex("90488d642480e8")
    else:  # the kernel refuses the cs-prefixed nop10 (or never optimizes): the probe stays on the 90
        assert att.address == pc and m.mem.read(pc, 1) == b"\xcc"
