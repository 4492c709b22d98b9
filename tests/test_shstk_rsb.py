"""Shadow stack (--shstk) and return stack buffer model (--rsb N): exact counts and negative controls."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from emu import cli
from emu.designs import BUILTIN, Design, Trampoline
from emu.guestio import GuestIO
from emu.kernel.uprobes import syscalls
from emu.kernel.uprobes.core import Uprobes
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession
from emu.violations import Check

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
SHAPES = str(SAMPLES / "rsb_shapes")
TARGETS = str(SAMPLES / "probe_targets")
DESIGNS = ["int3", "uretprobe-rfc", "linux-6.18", "jmp-slots", "nop10"]
XOL_AND_EMULATED = ["t_ret", "t_riprel", "t_callrax", "t_jne", "t_pushrsp", "t_popf_site", "t_push", "t_nop1"]
RETURNS = ["t_push", "call_t_callrax", "t_nop5", "mc_add"]


def session_run(path: str, args: list[str], design: str | Design = "int3", specs: tuple[str, ...] = (),
                shstk: bool = False, rsb: int | None = None) -> tuple[VerifySession, Machine, int]:
    m = Machine(path, [path, *args], {}, RunOptions(design=design), GuestIO.captured())
    for spec in specs:
        m.attach(spec)
    session = VerifySession(m, (), shstk=shstk, rsb=rsb)
    result = m.run()
    return session, m, result.exit_status


def sym(m: Machine, name: str) -> int:
    return m.resolver.symbols[name][0]


# ------------------------------------------------------------------ RSB model


@pytest.mark.parametrize(("shape", "calls", "returns", "mispredicted"), [
    ("n", 5, 5, 0),  # _start -> run_chain -> lvl3 -> lvl2 -> lvl1 -> target: balanced
    ("a", 7, 6, 5),  # add $8,%rsp; ret: the trampoline's ret and every later return up the chain
    ("b", 7, 7, 1),  # the balance patch: only the ret into the stub
    ("c", 6, 6, 0),  # attached with jmp: nothing to skip
])
def test_rsb_bpf_trampoline_shapes(shape: str, calls: int, returns: int, mispredicted: int) -> None:
    session, _, status = session_run(SHAPES, [shape], rsb=16)
    assert status == (6 if shape != "n" else 5)  # the chain ran (+1 for the "fexit program")
    assert session.rsb is not None
    stats = session.rsb.stats
    assert (stats.calls, stats.returns, stats.mispredicted) == (calls, returns, mispredicted)
    assert stats.predicted == returns - mispredicted and stats.underflows == 0


def test_rsb_underflow_is_counted() -> None:
    # five nested frames, two entries: the three outermost returns find the RSB empty
    session, _, _ = session_run(SHAPES, ["n"], rsb=2)
    assert session.rsb is not None
    stats = session.rsb.stats
    assert (stats.returns, stats.predicted, stats.underflows, stats.mispredicted) == (5, 2, 3, 3)


@pytest.mark.parametrize(("design", "shstk", "per_hit"), [
    ("int3", False, 1), ("uretprobe-rfc", False, 1),  # only the hijacked ret itself: the kernel jumps back
    ("linux-6.18", False, 5), ("jmp-slots", False, 5), ("nop10", False, 5),  # the 335 trampoline's extra ret
    ("linux-6.18", True, 1), ("nop10", True, 1),  # shstk on: sys_uretprobe returns by IRET (spec 2.2 step 7)
])
def test_rsb_cost_of_a_uretprobe(design: str, shstk: bool, per_hit: int) -> None:
    specs = ("uretprobe:lvl1", "uprobe:lvl1")  # the entry probe (nop5) costs no mispredict in any design
    session, _, status = session_run(SHAPES, ["n", "3"], design, specs, shstk=shstk, rsb=16)
    assert status == 15 and session.rsb is not None
    assert session.rsb.stats.per_hit == {"uretprobe:lvl1": [per_hit] * 3}
    assert [v for v in session.violations if v.kind is Check.SHSTK] == []


# --------------------------------------------------------------- shadow stack


@pytest.mark.parametrize("design", DESIGNS)
def test_shstk_clean_for_entry_return_xol_and_emulated_probes(design: str) -> None:
    specs = [f"uprobe:{s}" for s in XOL_AND_EMULATED] + ["uprobe:t_nop5"] + [f"uretprobe:{s}" for s in RETURNS]
    if design == "nop10":
        specs.append("uprobe:t_nop10")
    session, m, status = session_run(TARGETS, ["3"], design, tuple(specs), shstk=True)
    assert status == 0
    assert [v.line() for v in session.violations if v.kind is Check.SHSTK] == []
    assert m.uprobes.stats.ret_hits == 12
    sh = session.shadow_stack
    assert sh is not None
    # kernel shstk operations: 3 stepped calls (t_callrax, FIX_CALL), 12 hijacks, and in the call designs
    # a pop and a push per optimized hit: 6.18 t_nop5 and mc_add's mcount nop5 (2 hits each after the
    # first INT3), nop10 t_nop10 only; jmp-slots has no call, so nothing
    assert sh.kernel_ops == 15 + {"linux-6.18": 8, "nop10": 4}.get(design, 0)


@pytest.mark.parametrize("design", ["int3", "linux-6.18"])
def test_emulated_call_pushes_the_shadow_stack_but_not_the_rsb(design: str) -> None:
    # a probe on "call lvl3" (e8): branch_xol_ops emulation in every design (spec 4.2)
    session, m, status = session_run(SHAPES, ["n", "3"], design, ("uprobe:run_chain+4",), shstk=True, rsb=16)
    assert status == 15 and m.uprobes.stats.emulated == 3
    assert session.violations == [] and session.shadow_stack is not None and session.shadow_stack.kernel_ops == 3
    assert session.rsb is not None
    stats = session.rsb.stats
    # the CPU never executed that call: lvl3's ret and run_chain's ret each find the wrong entry
    assert (stats.calls, stats.returns, stats.underflows) == (12, 15, 3)
    assert stats.per_hit == {"uprobe:run_chain+4": [2, 2, 2]}


def test_shstk_off_by_default() -> None:
    session, m, _ = session_run(TARGETS, ["1"], "linux-6.18", ("uprobe:t_nop5",))
    assert session.shadow_stack is None and m.uprobes.shadow_stack is None


def test_shstk_catches_a_frame_skipping_trampoline() -> None:
    session, m, _ = session_run(SHAPES, ["a"], shstk=True)
    (v,) = session.violations
    assert v.kind is Check.SHSTK
    ret_pc = sym(m, "tramp_a") + m.resolver.symbols["tramp_a"][1] - 1  # its last byte: the ret
    assert v.detail["pc"] == hex(ret_pc)
    assert v.detail["expected"] == hex(sym(m, "target_a") + 5)  # the frame its own call made
    assert v.detail["actual"] == hex(sym(m, "lvl1") + 5 + 4 + 3)  # after lvl1's "call *%r12"


def test_shstk_catches_the_double_ret_variant_and_passes_jmp() -> None:
    b, m, _ = session_run(SHAPES, ["b"], shstk=True)
    c, _, _ = session_run(SHAPES, ["c"], shstk=True)
    # the #CP is the trampoline's ret into the stub; the model goes on and flags the stub's ret too
    assert [v.kind for v in b.violations] == [Check.SHSTK, Check.SHSTK]
    first = b.violations[0].detail
    assert first["pc"] == hex(sym(m, "rsb_balance_ret") - 1) and first["actual"] == hex(sym(m, "rsb_balance_ret"))
    assert first["expected"] == hex(sym(m, "target_b") + 5)
    assert c.violations == []


def test_negative_control_trampoline_with_a_call_and_no_ret() -> None:
    # "call 1f; 1: lea 8(%rsp),%rsp" before the pushes: a shadow frame nobody pops
    base = next(d for d in BUILTIN if d.name == "linux-6.18")
    assert base.trampoline is not None
    code = "call over; over: lea 8(%rsp),%rsp; " + str(base.trampoline.code)
    broken = replace(base, name="call-no-ret", trampoline=Trampoline(code))
    session, m, status = session_run(TARGETS, ["3"], broken, ("uprobe:t_nop5",), shstk=True)
    (v,) = session.violations
    assert v.kind is Check.SHSTK and v.summary.startswith("kernel: sys_uprobe: shstk_pop")
    assert v.detail["actual"] == hex(sym(m, "t_nop5") + 5) and v.detail["expected"] != v.detail["actual"]
    assert status == 128 + 4  # the kernel's SIGILL (spec 2.1 step 6)
    # without a shadow stack the same trampoline passes unnoticed
    session, _, status = session_run(TARGETS, ["3"], broken, ("uprobe:t_nop5",))
    assert status == 0 and session.violations == []


def test_negative_control_uretprobe_returning_through_the_trampoline_ret(monkeypatch: pytest.MonkeyPatch) -> None:
    original = syscalls.sys_uretprobe

    def without_step7(up: Uprobes, *args: object) -> None:  # a kernel that forgets the IRET under shstk
        shadow, up.shadow_stack = up.shadow_stack, None
        try:
            original(up, *args)  # type: ignore[arg-type]
        finally:
            up.shadow_stack = shadow

    monkeypatch.setattr(syscalls, "sys_uretprobe", without_step7)
    session, m, _ = session_run(TARGETS, ["3"], "linux-6.18", ("uretprobe:t_push",), shstk=True)
    cps = [v for v in session.violations if v.kind is Check.SHSTK]
    assert len(cps) == 3 and all(v.detail["region"] == "[uprobes]" for v in cps)
    assert all(v.probe == "uretprobe:t_push" for v in cps)


# ------------------------------------------------------------------------ CLI


def test_check_prints_shstk_and_rsb_columns_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "check.json"
    status = cli.main(["check", "--shstk", "--rsb", "16", "--json", str(out), "-p", "uretprobe:lvl1",
                       SHAPES, "n", "3"])
    assert status == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["design", "hits", "redzone", "regs", "resume", "memory", "shstk", "same", "output",
                                "sysret", "iret", "rsb", "miss/hit"]
    rows = {line.split()[0]: line.split() for line in lines[1:6]}
    assert set(rows) == set(DESIGNS) and all(r[5] == "0" and r[-1] == "1.00" for r in rows.values())
    data = json.loads(out.read_text())["designs"]
    for name in DESIGNS:
        assert data[name]["violations"]["shstk"] == 0
        rsb = data[name]["rsb"]
        assert rsb["depth"] == 16 and rsb["reference_mispredicted"] == 0
        assert rsb["extra_mispredicted"] == 3 and rsb["mispredicts_per_hit"] == 1.0
        assert rsb["per_hit"] == {"uretprobe:lvl1": [1, 1, 1]}


def test_run_reports_rsb_and_shstk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    status = cli.main(["run", "--shstk", "--rsb", "16", "--json", str(out), SHAPES, "a"])
    assert status == 6
    err = capsys.readouterr().err
    assert "shstk:" in err and "5 mispredicted" in err
    data = json.loads(out.read_text())
    assert data["rsb"]["mispredicted"] == 5 and [v["kind"] for v in data["violations"]] == ["shstk"]


@pytest.mark.parametrize("mode", ["fixup", "raise", "altstack"])
def test_signal_frames_push_a_token_and_the_restorer(mode: str) -> None:
    # delivery pushes a restore token and the restorer (the handler's ret), rt_sigreturn unwinds to the token;
    # a fault inside a block does not count that block's final call as run
    signals = str(Path(__file__).resolve().parent.parent / "elf_samples" / "signals")
    session, _, status = session_run(signals, [mode], shstk=True)
    assert status == 0 and session.violations == []
