"""benchmarks/sparse_hits.py measures what it says: R hits in either mode, for every probe kind."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "sparse_hits.py"
_spec = importlib.util.spec_from_file_location("sparse_hits", _PATH)
assert _spec is not None and _spec.loader is not None
sparse_hits = importlib.util.module_from_spec(_spec)
sys.modules["sparse_hits"] = sparse_hits
_spec.loader.exec_module(sparse_hits)

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
