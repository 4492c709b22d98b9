"""Every user-visible rflags bit, writes outside the red zone and the scratch (the `memory` kind),
and the fallbacks when a fast path is unavailable: each must give the verdicts of the full check."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from emu import cli
from emu.designs import DESIGNS, Design, Trampoline
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.mutation import global_address
from emu.pytest_plugin import assert_no_violations
from emu.verify.checks.regs import FLAG_BITS, flag_changes
from emu.verify.session import VerifySession
from emu.violations import Check, Violation

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
REDZONE = str(SAMPLES / "redzone_probe")
SLOT = "lea -128(%rsp),%rsp; {}; push %rcx; push %r11; push %rax; mov $336,%eax; syscall"


def slot_variant(name: str, extra: str, before_lea: str = "") -> Design:
    """jmp-slots with ``extra`` right after the slot steps over the red zone (``before_lea``: before it)."""
    code = (before_lea + "; " if before_lea else "") + SLOT.format(extra)
    return replace(DESIGNS["jmp-slots"], name=name, trampoline=Trampoline(code, layout="slots", slot_size=64))


ID_TOGGLE = slot_variant("id-toggle", "pushf; xorl $0x200000,(%rsp); popf")
FRAME_STORE = slot_variant("frame-store", "nop", before_lea="movq $0, 8(%rsp)")
LIVE = str(SAMPLES / "live_state")
LIVE_GLOBAL = global_address(LIVE)  # live_state's live_global
GLOBAL_STORE = slot_variant("global-store", f"push %rax; mov ${LIVE_GLOBAL:#x}, %eax; movq $0x5a, (%rax); pop %rax")


def violations(design: str | Design, path: str = REDZONE, *args: str) -> list[Violation]:
    m = Machine(path, [path, *(args or ("3",))], {}, RunOptions(design=design), GuestIO.captured())
    for spec in ("uprobe:rz_nop5_site", "usdt:redzone:site") if path == REDZONE else ("uprobe:nop5_site",):
        m.attach(spec)
    session = VerifySession(m)
    m.run()
    return list(session.violations)


def verdicts(found: list[Violation]) -> list[tuple[str, str, int, str]]:
    return sorted((v.kind.value, v.probe, v.hit, v.summary) for v in found)


def test_flag_changes_names_each_bit() -> None:
    assert flag_changes(0x202, 0x200602) == "DF=1 ID=1"
    assert flag_changes(0x202, 0x2) == "IF=0"
    assert set(FLAG_BITS) == {"CF", "bit1", "PF", "AF", "ZF", "SF", "TF", "IF", "DF", "OF", "AC", "ID"}


def test_a_slot_toggling_id_is_a_regs_violation_naming_the_bit() -> None:
    found = violations(ID_TOGGLE)
    assert found and {v.kind for v in found} == {Check.REGS}
    assert all(set(v.detail["registers"]) == {"rflags"} and "(ID=" in v.summary for v in found)
    assert violations("jmp-slots") == []  # the control: the unmutated slot


@pytest.mark.parametrize("flag_code, bit", [("std", "DF"), ("pushf; orl $0x40000,(%rsp); popf", "AC"),
                                            ("stc", "CF")])
def test_a_slot_setting_any_user_flag_is_caught(flag_code: str, bit: str) -> None:
    found = violations(slot_variant("sets-flag", flag_code))
    assert found and all(v.kind is Check.REGS and f"{bit}=" in v.summary for v in found)


@pytest.mark.parametrize("code, registers", [("fldz", {"fpsw", "fptag", "st0", "st1"}), ("fninit", {"fpsw", "fptag"}),
                                             ("pxor %xmm3, %xmm3", {"xmm3"})])
def test_a_slot_changing_x87_or_sse_state_is_a_regs_violation_naming_it(code: str, registers: set[str]) -> None:
    found = violations(slot_variant("vector", code), LIVE)
    assert found and all(v.kind is Check.REGS for v in found)
    assert all(registers <= set(v.detail["registers"]) for v in found), [v.detail["registers"] for v in found]


def test_a_store_into_the_interrupted_frame_is_a_memory_violation() -> None:
    found = violations(FRAME_STORE)
    assert found and {v.kind for v in found} == {Check.MEMORY}
    first = found[0]
    assert first.hit == 2  # hit 1 is the INT3 that optimizes the site: clean
    assert first.detail["size"] == 8 and first.detail["new"] == "00" * 8 and first.detail["old"] != "00" * 8
    assert "mov qword ptr [rsp + 8], 0" in first.detail["writer"]
    assert first.summary.startswith("rsp+8 (8 bytes at ")


def test_a_store_into_a_global_is_a_memory_violation() -> None:
    found = violations(GLOBAL_STORE, LIVE)
    assert found and {v.kind for v in found} == {Check.MEMORY}
    assert all(v.detail["address"] == hex(LIVE_GLOBAL) and v.detail["new"] == "5a" + "00" * 7 for v in found)


def test_stores_into_the_scratch_below_the_red_zone_are_the_design_s_right() -> None:
    deep = slot_variant("deep-scratch", "movq $1, -5000(%rsp); movq $2, -16(%rsp)")  # past SCRATCH, and in it
    assert violations(deep) == []


def test_memory_violations_in_the_table_json_details_and_plugin(tmp_path: Path, design_file: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "check.json"
    assert cli.main(["check", "--design-file", str(design_file), "--kernel", "frame-store", "--details",
                     "--json", str(out), REDZONE, "3"]) == 0
    text = capsys.readouterr().out
    header, row = text.splitlines()[0].split(), text.splitlines()[1].split()
    assert row[header.index("memory")] == "4"
    assert "memory: uprobe:rz_nop5_site" in text and "    writer: guest code at" in text
    data = json.loads(out.read_text())["designs"]["frame-store"]
    assert data["violations"]["memory"] == 4
    assert {d["kind"] for d in data["details"]} == {"memory"}
    with pytest.raises(pytest.fail.Exception, match=r"\(memory\)"):
        assert_no_violations(violations(FRAME_STORE))


@pytest.fixture
def design_file(tmp_path: Path) -> Path:
    path = tmp_path / "frame_store.py"
    path.write_text("from dataclasses import replace\nfrom emu.designs import DESIGNS, Trampoline\n"
                    f"frame_store = replace(DESIGNS['jmp-slots'], name='frame-store', trampoline=Trampoline("
                    f"{FRAME_STORE.trampoline.code!r}, layout='slots', slot_size=32))\n")  # type: ignore[union-attr]
    return path


# ----------------------------------------------------------------------------------- fallbacks


FALLBACK_DESIGNS: list[str | Design] = [FRAME_STORE, ID_TOGGLE, GLOBAL_STORE, "linux-6.18", "jmp-slots", "int3"]


@pytest.fixture(scope="module")
def fast_verdicts() -> dict[str, list[tuple[str, str, int, str]]]:
    return {_name(d): verdicts(violations(d, *_where(d))) for d in FALLBACK_DESIGNS}


def _name(design: str | Design) -> str:
    return design if isinstance(design, str) else design.name


def _where(design: str | Design) -> tuple[str, ...]:
    return (LIVE,) if design is GLOBAL_STORE else ()


@pytest.mark.parametrize("fallback", ["python_hot_path"])
def test_each_fallback_gives_the_full_check_s_verdicts(fallback: str, request: pytest.FixtureRequest,
                                                      fast_verdicts: dict[str, list[tuple[str, str, int, str]]]) -> None:
    request.getfixturevalue(fallback)
    for design in FALLBACK_DESIGNS:
        m = Machine(REDZONE, [REDZONE, "3"], {}, RunOptions(design=design), GuestIO.captured())
        session = VerifySession(m)
        assert session.tracker.edges is None
        got = verdicts(violations(design, *_where(design)))
        assert got == fast_verdicts[_name(design)], _name(design)
    assert fast_verdicts["frame-store"] and fast_verdicts["id-toggle"] and fast_verdicts["linux-6.18"]


@pytest.mark.usefixtures("python_hot_path")
def test_the_python_hooks_still_see_a_thread_stack_clobber() -> None:
    """The Python write hook over everything, not only [stack]: a clobber of a thread's red zone is still seen."""
    threads = str(SAMPLES / "threads")
    m = Machine(threads, [threads, "3", "20"], {}, RunOptions(design="linux-6.18"), GuestIO.captured())
    m.attach("uprobe:probed")
    session = VerifySession(m)
    m.run()
    assert session.tracker.edges is None
    assert any(v.kind is Check.REDZONE for v in session.violations)


# ------------------------------------------------------------------------ hits that go wrong otherwise
def _live_session(design: Design, handler: bool = False) -> tuple[VerifySession, int]:
    from emu.kernel.uprobes.consumers import Consumer

    m = Machine(LIVE, [LIVE, "3"], {}, RunOptions(design=design), GuestIO.captured())
    m.attach("uprobe:nop5_site", Consumer(handler=lambda _hit: None) if handler else None)
    session = VerifySession(m)
    result = m.run()
    session.finish(result.message or result.ending.value, killed=result.signal is not None)
    return session, result.exit_status


def test_a_trampoline_that_traps_never_resumes_and_says_so() -> None:
    session, status = _live_session(slot_variant("traps", "int3"))
    assert status == 128 + 5  # SIGTRAP
    assert [(v.kind, v.hit) for v in session.violations] == [(Check.RESUME, 2)]
    assert "never resumed" in session.violations[0].summary


def test_a_hit_whose_probe_never_fires_is_a_resume_violation() -> None:
    """linux-6.18 with the saved words read 8 bytes off: sys_uprobe does not find the probe, the
    trampoline's pops put everything back, and the hit is lost without a trace in the output."""
    base = DESIGNS["linux-6.18"]
    assert base.handler is not None
    lost = replace(base, name="lost", handler=replace(base.handler, saved_offset=8))
    session, status = _live_session(lost)
    assert status == 4  # only the red zone clobber 6.18 always has
    fired = [v for v in session.violations if v.kind is Check.RESUME]
    assert [v.hit for v in fired] == [2, 3] and all("without the probe firing" in v.summary for v in fired)
    clean, _ = _live_session(base)
    assert not [v for v in clean.violations if v.kind is Check.RESUME]


def test_the_registers_a_handler_is_given_are_checked() -> None:
    base = DESIGNS["jmp-slots"]
    assert base.handler is not None
    swapped = replace(base, name="swapped", handler=replace(base.handler, saved=("r11", "ax", "cx")))
    session, _ = _live_session(swapped, handler=True)
    seen = [v for v in session.violations if "consumer_view" in v.detail]
    assert seen and all(set(v.detail["consumer_view"]) == {"ax", "r11"} for v in seen)
    assert _live_session(base, handler=True)[0].violations == []
