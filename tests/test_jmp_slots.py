"""jmp-slots: slot ownership is forever, 256 slots a page, INT3 when no slot can be had (DESIGN.md)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from emu.designs import DESIGNS
from emu.guestio import GuestIO
from emu.kernel.uprobes import sites
from emu.machine import Attachment, Machine, RunOptions

SLOTS = DESIGNS["jmp-slots"].trampoline
assert SLOTS is not None
JMP_SLOT, SLOTS_PER_PAGE = SLOTS.code_bytes, SLOTS.slots_per_page
TARGETS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "probe_targets")


def machine() -> Machine:
    return Machine(TARGETS, [TARGETS, "2"], {}, RunOptions(design="jmp-slots"), GuestIO.captured())


def slot_of(m: Machine, att: Attachment) -> int:
    code = m.mem.read(att.address, 5)
    assert code[0] == 0xE9
    return att.address + 5 + int(struct.unpack("<i", code[1:])[0])


def test_a_slot_stays_with_its_first_probe_address() -> None:
    m = machine()
    a = m.attach("uprobe:t_nop5")
    b = m.attach("uprobe:f_nop5")
    assert isinstance(a, Attachment) and isinstance(b, Attachment)
    m.run()
    slot_a, slot_b = slot_of(m, a), slot_of(m, b)
    assert slot_a != slot_b and m.mem.read(slot_a, 16) == JMP_SLOT
    a.detach()
    assert m.mem.read(a.address, 5) == bytes.fromhex("0f1f440000")
    c = m.attach("uprobe:f_nop5_66")  # a new address never gets the detached slot
    m.uprobes.optimize_now(c.uprobe)  # type: ignore[union-attr]
    assert isinstance(c, Attachment) and slot_of(m, c) not in (slot_a, slot_b)
    again = m.attach("uprobe:t_nop5")  # re-attaching reuses the old slot
    assert isinstance(again, Attachment)
    m.uprobes.optimize_now(again.uprobe)
    assert slot_of(m, again) == slot_a
    assert m.uprobes.sites.probe_of_slot(slot_a + 16) == a.address


def test_256_slots_a_page_then_a_new_page() -> None:
    m = machine()
    patcher = m.uprobes.sites
    base = m.resolver.symbols["t_nop5"][0]
    slots = [patcher._slot_for(base + 8 * i) for i in range(SLOTS_PER_PAGE + 1)]  # addresses only: no code written
    assert SLOTS_PER_PAGE == 256 and len(set(slots)) == 257
    assert len(patcher.slot_pages) == 2
    first = patcher.slot_pages[0].start
    assert slots[:256] == [first + 16 * i for i in range(256)]
    assert m.mem.read(first, 4096) == JMP_SLOT * 256


def test_no_reachable_slot_page_leaves_the_probe_on_int3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sites, "nearest_page", lambda mem, call_end: None)
    m = machine()
    att = m.attach("uprobe:t_nop5")
    assert isinstance(att, Attachment)
    result = m.run()
    assert result.exit_status == 0 and att.consumer.paths == {"int3": 2}  # every hit traps
    assert att.uprobe.optimize_failed and m.mem.read(att.address, 1) == b"\xcc"
