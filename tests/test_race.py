"""The race explorer (emu/race/): a thread stopped at every instruction boundary of a probe site and
its trampoline while the kernel performs each write of a patching event (issue 8 item 4)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from emu import cli
from emu.designs import DESIGNS
from emu.race import explore
from emu.race.outcome import CLEAN, RED_ZONE_WRITE
from emu.race.scenario import Event, build
from emu.race.thread import ThreadRunner

ROOT = Path(__file__).resolve().parent.parent
TARGETS = str(ROOT / "elf_samples" / "probe_targets")
NOP10, SLOTS, SIX18 = DESIGNS["nop10"], DESIGNS["jmp-slots"], DESIGNS["linux-6.18"]
assert NOP10.patch is not None and SLOTS.trampoline is not None and SIX18.patch is not None  # all three optimize
NOP10_RESTORE = replace(NOP10, name="nop10-restore", patch=replace(NOP10.patch, detach="restore"))
SLOTS_REUSE = replace(SLOTS, name="jmp-slots-reuse", trampoline=replace(SLOTS.trampoline, slot_reuse=True))
SIX18_FRONT = replace(SIX18, name="linux-6.18-front-to-back", patch=replace(SIX18.patch, write_order="front-to-back"))
REATTACH = ("uprobe:t_nop5", "uprobe:f_nop5")


def test_nop10_restoring_the_nop_breaks_a_thread_between_the_lea_and_the_call() -> None:
    report = explore(TARGETS, "uprobe:t_nop10", NOP10_RESTORE, "detach")
    broken = report.race_outcomes
    assert broken, report.render()
    for key in broken:  # it resumes mid-NOP: faults on `00 00`, or comes out with rsp 128 lower
        assert key == "SIGSEGV" or "rsp" in key, report.render()
        example = report.examples[key].interleaving
        assert (example.insns, example.preempted_at) == (1, "t_nop10+5")  # after the lea, before the call
        assert "rsp" in report.examples[key].outcome.detail and "-128)" in report.examples[key].outcome.detail


def test_nop10_jump_over_detach_is_clean_at_every_interleaving() -> None:
    report = explore(TARGETS, "uprobe:t_nop10", NOP10, "detach")
    assert [w.new for w in report.writes] == [b"\xcc", b"\x08", b"\xeb"]
    assert report.clean, report.render()
    assert report.interleavings > len(report.writes) + 1  # thread 1 was stopped inside the site and trampoline


def test_reused_slot_sends_a_thread_still_in_it_to_the_other_probe() -> None:
    report = explore(TARGETS, REATTACH, SLOTS_REUSE, "reattach")
    b_addr = int(report.sites[1].rsplit(" ", 1)[1], 16)
    key = "wrong resume at f_nop5+5"
    assert key in report.race_outcomes, report.render()
    example = report.examples[key]
    assert example.interleaving.writes_before == 0 and example.interleaving.insns is not None
    assert example.interleaving.preempted_at is not None and "[uprobes-trampoline]" in example.interleaving.preempted_at
    assert f"{b_addr + 5:#x}" not in key and "f_nop5+5" in example.outcome.detail


def test_permanent_slot_assignment_is_clean_under_reattach() -> None:
    report = explore(TARGETS, REATTACH, SLOTS, "reattach")
    assert report.clean, report.render()
    assert len(report.writes) == 6  # detach A (3), set_swbp B (1), optimize B (2)


def test_front_to_back_writes_expose_a_torn_call() -> None:
    report = explore(TARGETS, "uprobe:t_nop5", SIX18_FRONT, "optimize")
    assert len(report.writes) == 5
    torn = [k for k in report.race_outcomes if k == "SIGSEGV" or k.startswith("wrong resume")]
    assert torn, report.render()
    details = " ".join(report.examples[k].outcome.detail for k in torn)
    assert "(e8 1f 44 00 00)" in details  # E8 followed by the old NOP bytes as rel32


def test_int3_first_order_never_exposes_a_torn_instruction() -> None:
    report = explore(TARGETS, "uprobe:t_nop5", SIX18, "optimize")
    assert report.race_outcomes == [], report.render()
    # 6.18's trampoline clobbers the red zone by design (spec 1.3) once the site is optimized; no race adds to it
    assert set(report.outcomes) <= {CLEAN, RED_ZONE_WRITE}
    assert report.examples[RED_ZONE_WRITE].interleaving.writes_before == len(report.writes)


def test_attach_under_int3_is_clean() -> None:
    report = explore(TARGETS, "uprobe:t_nop5", "int3", "attach")
    assert [w.new for w in report.writes] == [b"\xcc"]
    assert report.clean and report.interleavings == 2


def test_a_run_from_the_saved_state_is_repeatable() -> None:
    scenario = build(TARGETS, [TARGETS], ("uprobe:t_nop10",), NOP10_RESTORE, Event.DETACH)
    with ThreadRunner(scenario) as runner:
        first = runner.run(0, 1, 3)
        runner.run(0)  # a clean run in between changes nothing for the next
        again = runner.run(0, 1, 3)
    assert first == again
    assert first.path[:2] == (scenario.site.vaddr, scenario.site.vaddr + 5)


def test_cli_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "race.json"
    rc = cli.main(["race", TARGETS, "-p", "uprobe:t_nop10", "--event", "detach", "--kernel", "nop10,int3",
                   "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "nop10: detach of uprobe:t_nop10" in text and "clean" in text
    payload = json.loads(out.read_text())
    nop10 = payload["designs"]["nop10"]
    assert nop10["outcomes"] == {"clean": nop10["interleavings"]}
    assert nop10["examples"]["clean"]["writes_before"] == 0
    assert payload["designs"]["int3"]["refused"]  # the int3 design's decoder refuses a nop10 site


def test_cli_design_file(tmp_path: Path) -> None:
    design_file = tmp_path / "variant.py"
    design_file.write_text(
        "from dataclasses import replace\n"
        "from emu.designs import DESIGNS\n"
        "nop10_restore = replace(DESIGNS['nop10'], name='my-nop10-restore',\n"
        "                        patch=replace(DESIGNS['nop10'].patch, detach='restore'))\n")
    out = tmp_path / "race.json"
    rc = cli.main(["race", TARGETS, "-p", "uprobe:t_nop10", "--event", "detach", "--design-file", str(design_file),
                   "--kernel", "my-nop10-restore", "--json", str(out)])
    assert rc == 0
    mine = json.loads(out.read_text())["designs"]["my-nop10-restore"]
    assert mine["race_only"] and mine["interleavings"] == sum(mine["outcomes"].values())


@pytest.mark.parametrize(("argv", "message"), [
    (["-p", "uprobe:t_nop5", "--event", "reattach"], "reattach needs a second probe"),
    (["--event", "detach"], "race needs a probe"),
    (["-p", "uprobe:no_such_function"], "no symbol 'no_such_function'"),
    (["-p", "uprobe:t_nop5", "--kernel", "no-such-design"], "unknown design"),
    (["-p", "uprobe:t_nop5", "--max-insns", "1000"], "never reached"),
    (["-p", "uprobe:t_nop5", "--event", "sideways"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["race", TARGETS, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
