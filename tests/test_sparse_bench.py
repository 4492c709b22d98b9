"""benchmarks/sparse_hits.py measures what it says: R hits in either mode, for every probe kind; its
instruction counts are callgrind's, taken inside the emulation, and the per-hit figure is the probed
run's growth over the unprobed one's."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import benchmark_script

from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions

sparse_hits = benchmark_script("sparse_hits")
callgrind = sys.modules["callgrind"]  # sparse_hits put benchmarks/ on sys.path and imported it

ROUNDS = 7


def hits(binary: str, design: str, mode: str, probe: str) -> int:
    m = Machine(binary, [binary, mode, str(ROUNDS)], {}, RunOptions(design=design), GuestIO.captured())
    attachment = m.attach(probe)
    assert m.run().exit_status == 0
    return attachment.consumer.hits


@pytest.mark.parametrize("kind", sorted(sparse_hits.SPEC_OF_KIND))
@pytest.mark.parametrize("design", ["linux-6.18", "nop10"])
def test_each_mode_hits_the_probe_once_a_round(kind: str, design: str, tmp_path: Path) -> None:
    binary = sparse_hits.build(5, sparse_hits.SITE_OF_DESIGN[design], kind, str(tmp_path))
    probe = sparse_hits.SPEC_OF_KIND[kind]
    assert hits(binary, design, "tight", probe) == ROUNDS
    assert hits(binary, design, "sparse", probe) == ROUNDS


def test_the_sparse_mode_calls_every_function_and_the_tight_one_only_the_first(tmp_path: Path) -> None:
    binary = sparse_hits.build(5, sparse_hits.NOP5, "uprobe", str(tmp_path))
    assert hits(binary, "linux-6.18", "sparse", "uprobe:f4") == ROUNDS
    assert hits(binary, "linux-6.18", "tight", "uprobe:f4") == 0


def test_a_profile_s_totals_are_read_by_event_name() -> None:
    text = "# callgrind format\nevents: Ir I1mr D1mr\nsummary: 900 7 3\nfn=(1) f\n0 900 7 3\ntotals: 900 7 3\n"
    assert callgrind.totals(text) == {"Ir": 900, "I1mr": 7, "D1mr": 3}
    with pytest.raises(ValueError, match="not a callgrind profile"):
        callgrind.totals("events: Ir\n")


needs_valgrind = pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")


@needs_valgrind
def test_callgrind_counts_repeat_and_collect_only_inside_the_named_function(tmp_path: Path) -> None:
    true = shutil.which("true")
    assert true is not None
    first, second = (callgrind.profile([true], tmp_path / f"{n}.out")["Ir"] for n in (1, 2))
    assert first == second > 10_000
    assert callgrind.profile([true], tmp_path / "3.out", collect=callgrind.EMULATION)["Ir"] == 0


def test_a_counted_hit_is_the_probed_run_s_growth_per_round_over_the_unprobed_one_s(tmp_path: Path) -> None:
    counted = sparse_hits.Counted(rounds=10, cache_sim=False, workdir=str(tmp_path))
    first, last = sparse_hits.Counted.FIRST, sparse_hits.Counted.FIRST + 10
    growth = {("uprobe:f0", first): 5_000, ("uprobe:f0", last): 5_000 + 10 * 1_700,
              ("", first): 4_000, ("", last): 4_000 + 10 * 500}
    mapped: set[tuple[str, str]] = set()

    def run(binary: str, design: str, mode: str, rounds: int, probe: str, verify: bool, pages: str = "") -> dict[str, Any]:
        mapped.add((probe, pages))
        return {"Ir": growth[(probe, rounds)], "I1mr": 3 * rounds if probe else rounds}

    counted._run = run
    page = "0x3ff000,0x1000,5"
    assert counted.per_hit("b", "int3", "tight", "uprobe:f0", False, page) == {sparse_hits.COST: 1_200.0, "I1mr": 2.0}
    assert mapped == {("uprobe:f0", ""), ("", page)}  # only the unprobed runs map the probed run's page


def test_same_pages_finds_the_trampoline_page_a_design_maps_and_maps_it_in_the_unprobed_run(tmp_path: Path) -> None:
    binary = sparse_hits.build(5, sparse_hits.NOP5, "uprobe", str(tmp_path))
    pages = sparse_hits.extra_pages(binary, "linux-6.18", "uprobe:f0")
    assert pages == "0x3ff000,0x1000,5"  # r-x, next to the text, as the kernel places it
    assert sparse_hits.extra_pages(binary, "int3", "uprobe:f0") == ""  # int3 maps nothing
    m = Machine(binary, [binary, "tight", "1"], {}, RunOptions(design="linux-6.18"), GuestIO.captured())
    prepare = sparse_hits.map_pages(pages)
    assert prepare is not None and sparse_hits.map_pages("") is None
    prepare(m)
    assert m.run().exit_status == 0
    vma = m.mem.find(0x3FF000)
    assert vma is not None and (vma.start, vma.end) == (0x3FF000, 0x400000)
