"""Verifiers: each must stay silent on clean runs and catch a deliberately broken design."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from emu import cli
from emu.check import CheckRequest, run_check
from emu.cpu.scratch import ScratchCpu
from emu.cpu.state import decode_state, encode_state
from emu.designs import DESIGNS, Design, Handler, Trampoline
from emu.guestio import GuestIO
from emu.kernel.uprobes import consumers, syscalls
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.regs import PtRegs
from emu.machine import Machine, RunOptions
from emu.verify import resume
from emu.verify.session import VerifySession
from emu.violations import Check

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
REDZONE = str(SAMPLES / "redzone_probe")
TARGETS = str(SAMPLES / "probe_targets")
XOL_AND_EMULATED = ["t_ret", "t_riprel", "t_callrax", "t_jne", "t_pushrsp", "t_popf_site", "t_push", "t_nop1"]


def verified_run(path: str, specs: list[str], design: str | Design, *args: str) -> tuple[VerifySession, Machine]:
    m = Machine(path, [path, *args], {}, RunOptions(design=design), GuestIO.captured())
    for spec in specs:
        m.attach(spec)
    session = VerifySession(m)
    m.run()
    return session, m


@pytest.mark.parametrize("design", ["int3", "uretprobe-rfc", "linux-6.18", "jmp-slots", "nop10"])
def test_clean_designs_are_silent_on_int3_and_xol_paths(design: str) -> None:
    session, _ = verified_run(TARGETS, [f"uprobe:{s}" for s in XOL_AND_EMULATED], design)
    assert session.transactions == 24 + 3  # t_jne runs twice per iteration
    assert session.violations == []


def test_redzone_catches_linux_618_exactly() -> None:
    session, m = verified_run(TARGETS, ["uprobe:t_nop5"], "linux-6.18")
    site = m.resolver.symbols["t_nop5"][0]
    hit2 = [v for v in session.violations if v.hit == 2]
    assert {v.kind for v in session.violations} == {Check.REDZONE}
    assert all(v.hit >= 2 for v in session.violations)  # hit 1 is INT3: clean
    by_offset = {v.detail["offset"]: v for v in hit2}
    assert set(by_offset) == {-32, -24, -16, -8}
    assert by_offset[-8].detail["new"] == (site + 5).to_bytes(8, "little").hex()
    assert "call" in by_offset[-8].detail["writer"]
    assert "push rcx" in by_offset[-16].detail["writer"]
    assert "push r11" in by_offset[-24].detail["writer"]
    assert "push rax" in by_offset[-32].detail["writer"]


@pytest.mark.parametrize("design", ["jmp-slots", "nop10"])
def test_redzone_fixes_are_clean(design: str) -> None:
    site = "uprobe:t_nop10" if design == "nop10" else "uprobe:t_nop5"
    session, _ = verified_run(TARGETS, [site], design)
    assert session.transactions == 3 and session.violations == []


def test_negative_control_trampoline_forgetting_pop_r11() -> None:
    # pop %rax; lea 8(%rsp),%rsp (skips the saved r11 without touching flags); pop %rcx; ret
    broken = replace(DESIGNS["linux-6.18"], name="forgets-pop-r11", trampoline=Trampoline(
        "push %rcx; push %r11; push %rax; movq $336,%rax; syscall; pop %rax; lea 8(%rsp),%rsp; pop %rcx; ret; int3"))
    session, _ = verified_run(TARGETS, ["uprobe:t_nop5"], broken)
    regs = [v for v in session.violations if v.kind is Check.REGS]
    assert regs and all(set(v.detail["registers"]) == {"r11"} for v in regs)


def test_negative_control_handler_not_restoring_rcx() -> None:
    base = DESIGNS["jmp-slots"]
    assert base.handler is not None
    # the slot still pushes rcx, but the handler takes that word for a scratch register and leaves rcx as is
    forgetful = replace(base, name="keeps-syscall-rcx", handler=replace(base.handler, saved=("ax", "r11", "r10")))
    session, _ = verified_run(TARGETS, ["uprobe:t_nop5"], forgetful)
    regs = [v for v in session.violations if v.kind is Check.REGS]
    assert len(regs) == 2 and all("rcx" in v.detail["registers"] for v in regs)


def test_negative_control_resume_at_plus_4(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Uprobes.handle_syscall_uprobe

    def short(up: Uprobes, regs: PtRegs, vaddr: int, path: consumers.EntryPath) -> None:
        original(up, regs, vaddr, path)
        regs.ip = vaddr + 4  # jmp-slots resumes at regs.ip: one byte short of the nop5's end

    monkeypatch.setattr(Uprobes, "handle_syscall_uprobe", short)
    m = Machine(TARGETS, [TARGETS, "3"], {}, RunOptions(design="jmp-slots", max_insns=2_000_000), GuestIO.captured())
    m.attach("uprobe:f_nop5", Consumer(handler=lambda hit: None))  # a handler: the full sys_uprobe path runs
    session = VerifySession(m)
    m.run()
    resume = [v for v in session.violations if v.kind is Check.RESUME]
    assert resume and "inside the probed instruction, +4" in resume[0].summary


def test_negative_control_slot_pushing_into_the_red_zone() -> None:
    # the flawed jmp slot: pushes first, moves rsp below the red zone afterwards; its handler reads the words
    # where they now are, 128 bytes up
    base = DESIGNS["jmp-slots"]
    flawed = replace(base, name="pushes-first",
                     trampoline=Trampoline(bytes.fromhex("51415350488d642480b8500100000f05"), layout="slots"),
                     handler=Handler(probe_from="slot", saved_offset=128, exit="iret"))
    session, _ = verified_run(TARGETS, ["uprobe:t_nop5"], flawed)
    offsets = {v.detail["offset"] for v in session.violations if v.kind is Check.REDZONE}
    assert offsets & {-8, -16, -24}


@pytest.mark.parametrize("design", ["int3", "jmp-slots"])
def test_consumer_changes_are_expected_not_violations(design: str) -> None:
    def change(hit: Hit) -> None:
        hit.regs.cx = 0x87654321FEEBDAED

    m = Machine(TARGETS, [TARGETS], {}, RunOptions(design=design), GuestIO.captured())
    m.attach("uprobe:t_nop5", Consumer(handler=change))
    session = VerifySession(m)
    m.run()
    assert session.transactions == 3 and session.violations == []


def test_check_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "check.json"
    status = cli.main(["check", "--json", str(out), REDZONE, "3"])
    assert status == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["design", "hits", "redzone", "regs", "resume", "memory", "same",
                                             "output", "sysret", "iret", "refused"]
    data = json.loads(out.read_text())["designs"]
    assert set(data) == {"int3", "uretprobe-rfc", "linux-6.18", "jmp-slots", "nop10"}
    assert data["linux-6.18"]["violations"]["redzone"] > 0 and data["linux-6.18"]["same_output"] is False
    for name in ("int3", "uretprobe-rfc", "jmp-slots", "nop10"):
        assert data[name]["violations"] == {"redzone": 0, "regs": 0, "resume": 0, "memory": 0}, name
        assert data[name]["same_output"] is True
        assert data[name]["hits"] > 0
    assert cli.main(["check", "--strict", "--kernel", "jmp-slots,nop10", REDZONE, "3"]) == 0
    assert cli.main(["check", "--strict", "--kernel", "linux-6.18", REDZONE, "3"]) == 1


def test_lockstep_reports_first_divergence() -> None:
    reports = run_check(CheckRequest(REDZONE, [REDZONE, "3"], {}, specs=("uprobe:rz_nop5_site",),
                                     designs=("linux-6.18", "jmp-slots")))
    bad, good = reports
    assert bad.divergence is not None and "write" in bad.divergence
    assert good.divergence is None and good.same_output


def test_negative_control_handler_clobbering_xmm0(monkeypatch: pytest.MonkeyPatch) -> None:
    original = syscalls.sys_uprobe

    def clobbering(up: Uprobes, nr: int, state: list[int] | None = None) -> None:
        original(up, nr, state)
        up.cpu.write_xmm(0, 0xDEADBEEF)  # as if the kernel used SSE without saving the user's state

    monkeypatch.setattr(syscalls, "sys_uprobe", clobbering)
    session, _ = verified_run(TARGETS, ["uprobe:t_nop5"], "jmp-slots")
    regs = [v for v in session.violations if v.kind is Check.REGS]
    assert regs and all("xmm0" in v.detail["registers"] for v in regs)
    assert "found 0xdeadbeef" in regs[0].detail["registers"]["xmm0"]


def test_resume_watch_falls_back_to_blocks_for_branching_trampoline_code() -> None:
    # after the syscall: pop rax; pop r11; pop rcx; jmp +0; ret -- not straight-line to the ret
    branching = replace(DESIGNS["linux-6.18"], name="branching", trampoline=Trampoline(
        "push %rcx; push %r11; push %rax; movq $336,%rax; syscall; pop %rax; pop %r11; pop %rcx; jmp next; next: ret"))
    session, _ = verified_run(TARGETS, ["uprobe:t_nop5"], branching)
    assert session.tracker.resume.watching_blocks
    assert session.transactions == 3
    hit2 = {v.detail["offset"]: v.detail["writer"] for v in session.violations if v.hit == 2}
    assert set(hit2) == {-32, -24, -16, -8} and "push rcx" in hit2[-16]  # as with the straight-line trampoline


def test_straight_line_trampolines_need_no_block_hook() -> None:
    for design, site in (("linux-6.18", "uprobe:t_nop5"), ("nop10", "uprobe:t_nop10"), ("jmp-slots", "uprobe:t_nop5")):
        session, _ = verified_run(TARGETS, [site], design)
        assert session.transactions == 3 and not session.tracker.resume.watching_blocks, design


def test_redzone_catches_a_kernel_write_on_a_clean_design() -> None:
    def scribble(hit: Hit) -> None:
        hit.write(hit.regs.sp - 64, b"\xee" * 8)  # copy_to_user below the probed frame's rsp

    m = Machine(TARGETS, [TARGETS], {}, RunOptions(design="jmp-slots"), GuestIO.captured())
    m.attach("uprobe:t_nop5", Consumer(handler=scribble))
    session = VerifySession(m)
    m.run()
    found = [v for v in session.violations if v.kind is Check.REDZONE]
    assert found and all(v.detail["offset"] == -64 and v.detail["new"] == "ee" * 8 for v in found)
    assert all(v.detail["writer"] == "the fake kernel (copy_to_user)" for v in found)


def test_scratch_cpu_sees_guest_memory_as_it_is_now() -> None:
    m = Machine(TARGETS, [TARGETS], {}, RunOptions(design="int3"), GuestIO.captured())
    scratch = ScratchCpu(m.mem)
    sp = m.entry_sp
    state = [0] * 18
    state[7], state[16] = sp, m.exe.entry  # rsp; rip at any executable address
    load = bytes.fromhex("488b0424")  # mov rax, [rsp]
    ext = (0, 0, bytes(256), 0x1F80, bytes(152))  # x87: control, status, tag words and st0-7
    for value in (0x1111, 0x2222):  # the page stays mapped on the scratch CPU: it must be copied again
        m.mem.write(sp, value.to_bytes(8, "little"))
        ref = scratch.execute(m.exe.entry, load, encode_state(state, ext))
        after = decode_state(ref.raw)
        assert after[0] == value and after[16] == m.exe.entry + len(load) and not ref.faulted


def test_a_resume_the_hooks_miss_switches_to_watching_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    original = resume.ResumeWatch._after_syscall
    missed: list[bool] = []

    def miss_first(self: resume.ResumeWatch) -> None:
        if not missed and self.tracker.opened() is not None:
            missed.append(True)  # as if the kernel's exit went unseen
            return
        original(self)

    monkeypatch.setattr(resume.ResumeWatch, "_after_syscall", miss_first)
    session, _ = verified_run(TARGETS, ["uprobe:t_nop5"], "jmp-slots")
    assert missed and session.tracker.resume.watching_blocks
    assert session.transactions == 2 and session.violations == []  # the lost hit has no verdict; the others do


RMW = str(SAMPLES / "rmw_sites")
RMW_SITES = ["uprobe:add_site", "uprobe:inc_site", "uprobe:xadd_site"]


@pytest.mark.parametrize("design", ["int3", "linux-6.18", "jmp-slots", "nop10", "uretprobe-rfc"])
def test_an_instruction_that_loads_what_it_stores_is_checked_against_memory_before_the_hit(design: str) -> None:
    m = Machine(RMW, [RMW], {}, RunOptions(design=design), GuestIO.captured())
    for spec in RMW_SITES:
        m.attach(spec)
    session = VerifySession(m)
    assert m.run().exit_status == 0  # the counters came out right
    assert session.transactions == 18 and session.violations == []


def test_a_reference_taken_after_the_hit_would_see_the_instruction_s_own_store() -> None:
    """The control for the test above: rmw_sites does exercise it (flags computed from the stored
    value differ from the hit's)."""
    m = Machine(RMW, [RMW], {}, RunOptions(design="int3"), GuestIO.captured())
    for spec in RMW_SITES:
        m.attach(spec)
    session = VerifySession(m)
    session.tracker.prepare = None  # the reference is taken when the hit is checked, after it ran
    m.run()
    # the flags, and the stored value the memory check compares with the reference's, come out wrong
    assert Check.REGS in {v.kind for v in session.violations} <= {Check.REGS, Check.MEMORY}
    assert {v.probe for v in session.violations} >= {"uprobe:add_site", "uprobe:inc_site"}
