"""`uprobe-emu patch`: the exact writes the emulated kernel makes, in order (spec 1.1, 3.5, 3.8)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from emu.cli import main
from emu.patchview import ATTACH, DETACH, OPTIMIZE, SiteHistory, record_patches

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
TARGETS = str(SAMPLES / "probe_targets")
REDZONE = str(SAMPLES / "redzone_probe")
NOP5 = bytes.fromhex("0f1f440000")
NOP10 = bytes.fromhex("662e0f1f840000000000")


def steps(hist: SiteHistory) -> list[tuple[str, int, str, str, str]]:
    return [(s.phase, s.offset, s.expect.hex(), s.new.hex(), s.after.hex()) for s in hist.steps]


def test_linux_618_nop5_write_order_after_a_real_hit() -> None:
    report = record_patches(TARGETS, ["uprobe:f_nop5"], "linux-6.18", argv=[TARGETS, "2"])
    (hist,) = report.sites
    assert hist.hits == 2 and not hist.triggered  # optimized by the first hit of the run
    assert hist.mapped is not None
    target = hist.mapped.target
    assert target == 0x3FF000 and "[uprobes-trampoline]" in hist.mapped.vma and "r-xp" in hist.mapped.vma
    assert hist.mapped.code == bytes.fromhex("5141535048c7c0500100000f0558415b59c3cc")  # spec 1.3
    rel = struct.pack("<i", target - (0x4030D0 + 5)).hex()
    assert steps(hist) == [
        (ATTACH, 0, "0f", "cc", "cc1f440000"),
        (OPTIMIZE, 1, "1f440000", rel, "cc" + rel),  # spec 3.5: rel32 first, expecting CC
        (OPTIMIZE, 0, "cc", "e8", "e8" + rel),
        (DETACH, 0, "e8", "cc", "cc" + rel),  # unoptimize: CC, original 1..4, original byte 0
        (DETACH, 1, rel, "1f440000", "cc1f440000"),
        (DETACH, 0, "cc", "0f", "0f1f440000"),
    ]
    assert hist.steps[0].before == NOP5


def test_jmp_slots_rel32_then_e9_into_the_slot() -> None:
    report = record_patches(TARGETS, ["uprobe:f_nop5", "uprobe:mc_add"], "jmp-slots", run=False)
    first, second = report.sites
    assert first.triggered and second.triggered
    assert first.mapped is not None and second.mapped is not None
    assert first.mapped.code == bytes.fromhex("488d64248051415350b8500100000f05") == second.mapped.code
    assert second.mapped.target == first.mapped.target + 16  # one slot each
    rel = struct.pack("<i", first.mapped.target - (0x4030D0 + 5)).hex()
    assert [s[:4] for s in steps(first)] == [
        (ATTACH, 0, "0f", "cc"), (OPTIMIZE, 1, "1f440000", rel), (OPTIMIZE, 0, "cc", "e9"),
        (DETACH, 0, "e9", "cc"), (DETACH, 1, rel, "1f440000"), (DETACH, 0, "cc", "0f"),
    ]


def test_nop10_bytes_1_to_9_then_byte_0_and_eb08_on_detach() -> None:
    report = record_patches(REDZONE, ["uprobe:rz_nop10_site"], "nop10", argv=[REDZONE, "2"])
    (hist,) = report.sites
    assert hist.original == NOP10 and hist.length == 10 and hist.hits == 2
    assert hist.mapped is not None and hist.mapped.code == bytes.fromhex("5141535048c7c0500100000f0558415b59c28000cc")  # spec 1.5
    rel = struct.pack("<i", hist.mapped.target - (0x4019EF + 10)).hex()
    lea_call = "488d642480e8" + rel
    assert steps(hist) == [
        (ATTACH, 0, "66", "cc", "cc2e0f1f840000000000"),
        (OPTIMIZE, 1, "2e0f1f840000000000", "8d642480e8" + rel, "cc" + lea_call[2:]),  # spec 3.8
        (OPTIMIZE, 0, "cc", "48", lea_call),
        (DETACH, 0, "48", "cc", "cc" + lea_call[2:]),
        (DETACH, 1, "8d", "08", "cc08" + lea_call[4:]),
        (DETACH, 0, "cc", "eb", "eb08" + lea_call[4:]),  # `eb 08` over the stale tail
    ]


@pytest.mark.parametrize("design", ["int3", "uretprobe-rfc"])
def test_designs_that_never_optimize_show_the_int3_step_only(design: str) -> None:
    report = record_patches(TARGETS, ["uprobe:f_nop5"], design, run=False)
    (hist,) = report.sites
    assert steps(hist) == [(ATTACH, 0, "0f", "cc", "cc1f440000"), (DETACH, 0, "cc", "0f", "0f1f440000")]
    assert hist.mapped is None and any("never optimizes" in n for n in hist.notes)


def test_unoptimizable_and_refused_sites() -> None:
    report = record_patches(TARGETS, ["uprobe:f_nop5_xpage", "uprobe:t_nop10", "uprobe:f_nopl5_reg1"], "linux-6.18",
                            run=False)
    xpage, nop10, reg1 = report.sites
    assert [s[:4] for s in steps(xpage)] == [(ATTACH, 0, "0f", "cc"), (DETACH, 0, "cc", "0f")]
    assert any("crosses a page" in n for n in xpage.notes)
    assert nop10.refused is not None and "ENOTSUPP" in nop10.refused and not nop10.steps
    assert len(reg1.steps) == 2 and reg1.mapped is None


def test_cli_renders_each_step_with_disassembly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "steps.json"
    assert main(["patch", "--kernel", "nop10", "--no-run", "--json", str(out), "-p", "uprobe:rz_nop10_site",
                 REDZONE]) == 0
    text = capsys.readouterr().out
    assert "cc 2e 0f 1f 84 00 00 00 00 00" in text
    assert "leaq -0x80(%rsp), %rsp; callq" in text
    assert "retq $0x80" in text  # the trampoline listing
    assert "eb 08 64 24 80 e8" in text
    data = json.loads(out.read_text())
    assert [s["new"] for s in data["sites"][0]["steps"]][-3:] == ["cc", "08", "eb"]
    assert main(["patch", "--kernel", "bogus", "-p", "uprobe:f_nop5", TARGETS]) == 2


def test_a_spec_that_resolves_to_nothing_is_an_error_not_a_row(capfd: pytest.CaptureFixture[str]) -> None:
    """A probe the kernel refuses is a verdict on the design (a row, status 0, as above); a spec naming
    no symbol is a mistake: one line on stderr, status 2."""
    assert main(["patch", "--no-run", "-p", "uprobe:nosuchsym", TARGETS]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and "nosuchsym" in err
    assert main(["patch", "--no-run", "--kernel", "int3", "-p", "uprobe:t_nop10", TARGETS]) == 0
    assert "refused" in capfd.readouterr().out
