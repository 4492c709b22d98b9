"""Signals inside hits (emu/race/signals.py): elf_samples/sig_race given SIGUSR1 at every
instruction boundary of its second hit (site, trampoline or slot, XOL step, after the uprobe syscall,
the return trampoline), under each handler: one that uses the stack and clobbers every caller-saved
register, the same on a sigaltstack, and one that siglongjmps out."""

from __future__ import annotations

import json
from pathlib import Path

import browser
import pytest
from conftest import run_native, sample, symbol_file_offset
from test_report_pages import loaded, needs_chromium

from emu import cli
from emu.designs import DESIGNS, Design, get_design
from emu.designs.file import load_design_file
from emu.disasm import cs64
from emu.native import NativeProbe, available
from emu.native import run_native as run_probed
from emu.race.boundaries import Role
from emu.race.outcome import CLEAN
from emu.race.signal_report import SAME, SignalReport
from emu.race.signals import Handler, Target, explore_signal_designs, explore_signals, hit_boundaries

SIG_RACE = sample("sig_race")
ALL = tuple(Handler)
SIX18 = DESIGNS["linux-6.18"]
UNSAFE = str(Path(__file__).resolve().parent.parent / "examples" / "designs" / "signal_unsafe.py")
# linux-6.18 whose trampoline keeps rdx 256 bytes below rsp across its syscall without moving rsp over it
(STASH_BELOW,) = load_design_file(UNSAFE)


def executed(code: bytes) -> int:
    """Instructions a straight-line trampoline runs: up to its ret, or to its end (a slot's syscall)."""
    count = 0
    for _addr, _size, mnemonic, _ops in cs64().disasm_lite(code, 0):
        count += 1
        if mnemonic == "ret":
            break
    return count


def entry_insns(design: Design) -> int:
    assert design.patch is not None and design.trampoline is not None
    site = (executed(design.patch.prefix_bytes) if design.patch.prefix_bytes else 0) + 1  # the prefix, the branch
    return site + executed(design.trampoline.code_bytes)


@pytest.mark.parametrize(("design", "spec", "expected"), [
    ("linux-6.18", "uprobe:fn_nop5", lambda d: entry_insns(d) + 1),  # call, 9 in the trampoline, resumed
    ("jmp-slots", "uprobe:fn_nop5", lambda d: entry_insns(d) + 1),  # jmp, 6 in the slot, resumed
    ("nop10", "uprobe:fn_nop10", lambda d: entry_insns(d) + 1),  # lea and call, 9, resumed
    ("int3", "uprobe:fn_nop5", lambda d: 2),  # int3 (the NOP emulated), resumed
    ("int3", "uprobe:fn_xol", lambda d: 3),  # int3, the lea stepped in its XOL slot, resumed
    ("linux-6.18", "uretprobe:fn_nop5",
     lambda d: entry_insns(d) + 1 + executed(d.uretprobe.code_bytes) + 1),  # and the return trampoline, returned
])
def test_every_boundary_of_the_hit_is_explored(design: str, spec: str, expected: object) -> None:
    chosen = get_design(design)
    _site, _describe, boundaries = hit_boundaries(Target(SIG_RACE, spec), chosen)
    assert callable(expected)
    assert len(boundaries) == expected(chosen)
    assert [b.index for b in boundaries] == list(range(len(boundaries)))
    assert boundaries[0].role is Role.SITE and boundaries[-1].role in (Role.RESUMED, Role.RETURNED)
    kernel_entries = [b.after for b in boundaries if b.after is not None]  # "on the return from the syscall"
    assert kernel_entries == (["int3"] if chosen.trampoline is None else ["syscall"]) * (2 if "uret" in spec else 1)


@pytest.fixture(scope="module")
def stack_grids() -> dict[str, SignalReport]:
    designs = ("linux-6.18", "jmp-slots", "int3")
    reports = explore_signal_designs(Target(SIG_RACE, "uprobe:fn_nop5"), designs, (Handler.STACK,))
    xol = explore_signals(Target(SIG_RACE, "uprobe:fn_xol"), "int3", (Handler.STACK,))
    return {**{r.design: r for r in reports}, "int3-xol": xol}


def test_a_signal_anywhere_in_a_hit_changes_nothing_under_the_built_in_designs(
        stack_grids: dict[str, SignalReport]) -> None:
    for name, report in stack_grids.items():
        assert report.runs == len(report.boundaries)
        for (index, _handler), outcome in report.cells.items():
            assert outcome.output == SAME, (name, index, outcome.explain())
            assert outcome.signal_only == {}, (name, index, outcome.explain())  # nothing the hit alone lacks
    six18 = stack_grids["linux-6.18"]
    assert six18.baseline is not None and set(six18.baseline.verdicts) == {"redzone"}  # its pushes, signal or not
    assert stack_grids["jmp-slots"].clean and stack_grids["int3"].clean and stack_grids["int3-xol"].clean


def test_the_signal_lands_at_its_boundary_but_after_an_xol_step(stack_grids: dict[str, SignalReport]) -> None:
    """spec 4.4: the kernel holds a signal back during the single step and delivers it at the fixed-up ip."""
    for name, report in stack_grids.items():
        for b in report.boundaries:
            delivered = report.cells[b.index, "stack"].delivered_at
            assert delivered == ("fn_xol+7" if b.role is Role.XOL_STEP else b.at), (name, b.text())
    roles = [b.role for b in stack_grids["int3-xol"].boundaries]
    assert roles == [Role.SITE, Role.XOL_STEP, Role.RESUMED]
    assert [b.after for b in stack_grids["jmp-slots"].boundaries][-1] == "syscall"  # IRET straight to fn_nop5+5


def test_altstack_and_longjmp_handlers_keep_the_output_of_the_unprobed_run() -> None:
    reports = explore_signal_designs(Target(SIG_RACE, "uprobe:fn_nop5"), ("linux-6.18", "jmp-slots", "int3"),
                                     (Handler.ALTSTACK, Handler.LONGJMP))
    for report in reports:
        assert {o.output for o in report.cells.values()} == {SAME}, report.render()
        longjmp = [o for (_, h), o in report.cells.items() if h == "longjmp"]
        assert all(o.signal_only == {} for o in longjmp), report.render()  # an abandoned hit gets no verdict


def test_a_frame_on_the_alternate_stack_is_not_the_hits_store() -> None:
    report = explore_signals(Target(SIG_RACE, "uprobe:fn_nop5"), "jmp-slots", (Handler.ALTSTACK,))
    assert report.clean, report.render()


def test_a_signal_between_the_lea_and_the_call_of_a_nop10_site_gets_no_verdict() -> None:
    report = explore_signals(Target(SIG_RACE, "uprobe:fn_nop10"), "nop10", (Handler.STACK,))
    assert {o.output for o in report.cells.values()} == {SAME}  # the program cannot tell
    assert report.clean, report.render()


def test_a_trampoline_that_stashes_below_the_red_zone_is_caught_between_stash_and_unstash() -> None:
    """The negative control: only a signal frame reaches rsp-256, so only boundaries after the stash and up to
    the unstash lose rdx; the regs verifier names it and the output differs there, nowhere else."""
    report = explore_signals(Target(SIG_RACE, "uprobe:fn_nop5"), STASH_BELOW, (Handler.STACK,))
    trampoline = [b.index for b in report.boundaries if b.role is Role.TRAMPOLINE]
    between = set(trampoline[1:-1])  # after the stash (the first), up to the unstash (before the ret, the last)
    flagged = {i for (i, _), o in report.cells.items() if "regs" in o.signal_only}
    assert flagged == between and len(between) == executed(STASH_BELOW.trampoline.code_bytes) - 2  # type: ignore[union-attr]
    for (i, _), outcome in report.cells.items():
        assert (outcome.output == "differs") is (i in between)
        if i in between:
            assert any(s.startswith("rdx expected") for s in outcome.signal_only["regs"])


@pytest.mark.slow
def test_the_return_path_of_a_uretprobe_is_explored_and_clean_with_a_handler_that_returns() -> None:
    report = explore_signals(Target(SIG_RACE, "uretprobe:fn_nop5"), "linux-6.18", (Handler.STACK,))
    roles = [b.role for b in report.boundaries]
    assert roles.count(Role.RETURN_TRAMPOLINE) == executed(SIX18.uretprobe.code_bytes) and roles[-1] is Role.RETURNED
    assert [b.at for b in report.boundaries if b.after == "syscall"][-1].startswith("[uprobes]+")
    assert all(o.output == SAME and o.signal_only == {} for o in report.cells.values()), report.render()


@pytest.mark.slow
def test_a_siglongjmp_out_of_the_return_trampoline_gets_no_verdict() -> None:
    report = explore_signals(Target(SIG_RACE, "uretprobe:fn_nop5"), "int3", (Handler.LONGJMP,))
    assert report.clean, report.render()


# ------------------------------------------------------------------------------------------------ the CLI
def test_cli_text_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, page = tmp_path / "signals.json", tmp_path / "signals.html"
    rc = cli.main(["race", "--clear-env", "--signals", "-p", "uprobe:fn_xol", "--handler", "stack,longjmp",
                   "--kernel", "int3,nop10", "--json", str(out), "--html", str(page), SIG_RACE])
    assert rc == 0
    text = capsys.readouterr().out
    assert "int3: SIGUSR1 at each of the 3 boundaries of hit 2 of uprobe:fn_xol" in text
    assert "XOL step [uprobes]+0x80, on the return from its int3 (delivered at fn_xol+7)" in text
    assert "outcomes: clean 6" in text
    payload = json.loads(out.read_text())["designs"]
    assert set(payload) == {"int3", "nop10"}
    int3 = payload["int3"]
    assert int3["handlers"] == ["stack", "longjmp"] and len(int3["boundaries"]) == 3
    assert len(int3["cells"]) == 6 and int3["outcomes"] == {CLEAN: 6} and int3["baseline"]["outcome"] == CLEAN
    assert [b["role"] for b in int3["boundaries"]] == ["site", "XOL step", "resumed"]
    if browser.available():
        _check_page(page)


@needs_chromium
def test_cli_html_grid_shows_the_negative_control(tmp_path: Path) -> None:
    page = tmp_path / "signals.html"
    assert cli.main(["race", "--clear-env", "--signals", "-p", "uprobe:fn_nop5", "--handler", "stack",
                     "--design-file", UNSAFE, "--kernel", "6.18-stash-below", "--html", str(page), SIG_RACE]) == 0
    _, dom = loaded(page)
    cells = [e.attrs for e in dom.inside("race-signals-grid", design="6.18-stash-below") if "data-outcome" in e.attrs]
    differs = {int(c["data-boundary"]) for c in cells if c["data-outcome"].startswith("differs")}
    assert len(cells) == 13 and differs == set(range(2, 11))


def _check_page(path: Path) -> None:
    _, dom = loaded(path)
    assert [f.attrs["data-design"] for f in dom.figures()] == ["int3", "nop10"]
    cells = [e.attrs for e in dom.inside("race-signals-grid", design="int3") if "data-outcome" in e.attrs]
    assert len(cells) == 6 and {c["data-outcome"] for c in cells} == {CLEAN}
    assert {c["data-role"] for c in cells} == {"site", "XOL step", "resumed"}
    assert [c for c in cells if c.get("data-example")]


@pytest.mark.parametrize(("argv", "message"), [
    (["-p", "uprobe:fn_nop5", "--event", "attach"], "drop --event"),
    (["-p", "uprobe:fn_nop5", "-p", "uprobe:fn_xol"], "takes one -p"),
    (["-p", "uprobe:fn_nop5", "--handler", "sideways"], "unknown handler"),
    (["-p", "uprobe:fn_nop5", "--handler", ","], "at least one of"),
    (["-p", "uprobe:fn_nop5", "--hit", "99", "--kernel", "int3"], "never reaching hit 99"),
    (["-p", "uprobe:fn_nop5", "--hit", "0"], "--hit"),
    (["-p", "uprobe:no_such_function"], "no symbol 'no_such_function'"),
    (["--handler", "stack"], "race needs a probe"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["race", "--clear-env", "--signals", *argv, SIG_RACE]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_handler_and_hit_go_with_signals(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["race", "-p", "uprobe:fn_nop5", "--hit", "3", SIG_RACE]) == 2
    assert "go with --signals" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ native
NATIVE_ROUNDS, INTERVAL_US = "100000", "50"  # ~4000 SIGALRMs over 100000 hits; 5 us livelocks this VM


@pytest.mark.skipif(not available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
@pytest.mark.parametrize("handler", [h.value for h in ALL])
def test_native_618_signals_at_random_points_of_real_hits_keep_the_output(handler: str) -> None:
    """The real kernel cannot stop at a chosen boundary: a 50 us ITIMER_REAL sends SIGALRM wherever the loop is,
    thousands of times, inside hits too. On fn_nop5 (no red zone) the sums are the unprobed run's, as the
    emulated grid says for every boundary; on rz_nop5_site the real 6.18 gives other sums, signal or not:
    its trampoline's pushes land in the red zone (the redzone verdict of the grid's baseline)."""
    argv = [SIG_RACE, handler, NATIVE_ROUNDS, INTERVAL_US]
    unprobed = run_native(argv, env={}, no_aslr=True).out.splitlines()[0]
    clean = run_probed(argv, [NativeProbe(SIG_RACE, symbol_file_offset(SIG_RACE, "fn_nop5"))], env={}, no_aslr=True)
    assert clean.returncode == 0 and clean.counts[0] >= int(NATIVE_ROUNDS)
    sums, counts = clean.stdout.splitlines()
    assert sums == unprobed and int(counts.split(b"handled=")[1].split()[0]) > 100
    red = run_probed(argv, [NativeProbe(SIG_RACE, symbol_file_offset(SIG_RACE, "rz_nop5_site"))], env={}, no_aslr=True)
    assert red.returncode == 0 and red.stdout.splitlines()[0] != unprobed
