"""The fuzzer's generator, code generator and ELF writer: deterministic, valid, runnable natively."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emu.fuzz import layout as L
from emu.fuzz.case import Case, Store, StoreKind
from emu.fuzz.codegen import program
from emu.fuzz.elfwriter import write_elf
from emu.fuzz.generator import generate
from emu.fuzz.oracle import reference_outcome
from emu.fuzz.sites import SITES
from emu.kernel.uprobes.insn import analyze
from emu.kernel.uprobes.sites import is_nop5


def test_same_seed_and_index_give_the_same_case_in_another_process() -> None:
    here = [generate(7, i).to_json() for i in range(5)]
    code = "import json; from emu.fuzz.generator import generate; print(json.dumps([generate(7, i).to_json() for i in range(5)]))"
    there = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True).stdout)
    assert here == there
    assert program(generate(7, 3)).code == program(generate(7, 3)).code


def test_seeds_and_indices_differ() -> None:
    assert len({json.dumps(generate(s, i).to_json()) for s in range(3) for i in range(20)}) == 60


def test_generated_cases_cover_every_site_and_store_kind_and_fit_the_layout() -> None:
    cases = [generate(0, i) for i in range(400)]
    assert {c.site for c in cases} == set(SITES)
    assert {s.kind for c in cases for s in c.stores} == set(StoreKind)
    assert {s.size for c in cases for s in c.stores} == {1, 2, 4, 8, 16}
    assert any(c.action for c in cases) and any(c.uretprobe for c in cases)
    from emu.fuzz.codegen import driver

    assert len(driver()) <= L.FUNC - L.CODE_BASE
    for case in cases:
        assert len(program(case).code) <= L.CODE_SIZE
        assert Case.from_json(json.loads(json.dumps(case.to_json()))) == case


def test_site_forms_are_what_the_kernel_accepts() -> None:
    for form in SITES.values():
        raw = form.code[1:] if form.usdt_combo else form.code
        analyze(raw, L.FUNC, accept_nop10=True)  # raises if the kernel refuses it
        assert is_nop5(raw) == form.name.startswith("nop5"), form.name


def test_a_store_outside_the_red_zone_or_a_misaligned_movaps_is_refused() -> None:
    from emu.errors import UsageError

    with pytest.raises(UsageError):
        Store(129, 1, StoreKind.MOV, 0)
    with pytest.raises(UsageError):
        Store(4, 8, StoreKind.MOV, 0)
    with pytest.raises(UsageError):
        Store(32, 16, StoreKind.MOVAPS, 0)


@pytest.mark.parametrize("index", range(12))
def test_the_elf_runs_natively_with_the_emulated_unprobed_result(tmp_path: Path, index: int) -> None:
    case = generate(3, index).with_(action=None)  # natively nothing plays the consumer
    prog = program(case)
    path = tmp_path / "case.elf"
    write_elf(str(path), prog.code, prog.data)
    native = subprocess.run([str(path)], capture_output=True, timeout=10)
    emulated = reference_outcome(case, "int3")
    assert native.returncode == 0 == emulated.status
    assert native.stdout == emulated.results


def _call1(case: Case) -> dict[str, object]:
    from emu.fuzz.oracle import decode

    call: dict[str, object] = decode(reference_outcome(case, "int3"), case)["calls"][0]
    return call


def test_the_unprobed_reference_plays_the_consumer_action_at_the_site() -> None:
    from emu.fuzz.case import Action, ActionKind

    base = Case(0, 0, "nop5", "nop1", (), tuple(range(1, 16)), 0x202)
    plain = _call1(base)
    assert plain["rdx"] == hex(~4 & (2**64 - 1))  # the instruction after the site inverts rdx
    assert _call1(base.with_(action=Action(ActionKind.REDIRECT)))["rdx"] == hex(4)  # ... skipped
    assert _call1(base.with_(action=Action(ActionKind.SET_REG, "r9", 0x99)))["r9"] == hex(0x99)
    assert _call1(base.with_(action=Action(ActionKind.MOVE_SP, "", 16)))["sp_delta"] == 16
    assert plain["sp_delta"] == 0
