"""`uprobe-emu scan`: sites and per-design verdicts from the file alone (docs/linux-6.18-observed.md section 8a)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emu.cli import main
from emu.scan import OPTIMIZE, Site, scan_file

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
TARGETS = str(SAMPLES / "probe_targets")
USDT = str(SAMPLES / "usdt_sample")
REDZONE = str(SAMPLES / "redzone_probe")
REFUSED = "refused (-ENOTSUPP)"


@pytest.fixture(scope="module")
def targets() -> dict[str, Site]:
    return {label: s for s in scan_file(TARGETS).sites for label in s.labels}


# Observed on Linux 6.18 (8a): optimized / INT3 only / refused at attach.
OPTIMIZED_618 = ["f_nop5", "f_nop5_disp08", "f_nop5_66", "f_nop5_pfx90", "f_nop5_rexw", "f_nop5_pgend"]
INT3_618 = ["f_nopl5_reg1", "f_nop5_xpage"]


def test_probe_targets_linux_618_matches_the_real_kernel(targets: dict[str, Site]) -> None:
    for name in OPTIMIZED_618:
        assert targets[name].designs["linux-6.18"] == OPTIMIZE, name
        assert targets[name].designs["jmp-slots"] == OPTIMIZE, name
    for name in INT3_618:
        assert targets[name].designs["linux-6.18"] == "int3", name
    assert targets["f_nop5_3e"].designs == dict.fromkeys(targets["f_nop5_3e"].designs, REFUSED)
    # not 5 or 10 bytes, or not a NOP: not a site at all
    for name in ("f_nop1", "f_nop2", "f_nop3", "f_nop4", "f_nop6", "f_nop7", "f_nop8", "f_jmp0_5", "f_lea0_5"):
        assert name not in targets
    assert targets["f_nop5_pfx90"].raw == bytes.fromhex("6666666690")
    assert targets["f_nop5_xpage"].address & 0xFFF == 0xFFD


def test_nop10_and_int3_designs(targets: dict[str, Site]) -> None:
    t_nop10 = targets["t_nop10"]
    assert t_nop10.raw == bytes.fromhex("662e0f1f840000000000")
    assert t_nop10.designs == {"int3": REFUSED, "uretprobe-rfc": REFUSED, "linux-6.18": REFUSED,
                               "jmp-slots": REFUSED, "nop10": OPTIMIZE}
    for name in OPTIMIZED_618:
        assert targets[name].designs["nop10"] == "int3"
        assert targets[name].designs["int3"] == "int3"
        assert targets[name].designs["uretprobe-rfc"] == "int3"


def test_mnop_mcount_entries_and_labelled_inline_sites(targets: dict[str, Site]) -> None:
    for name in ("mc_add", "mc_mul"):
        site = targets[name]
        assert (site.kind, site.raw, site.function, site.offset) == ("entry", bytes.fromhex("0f1f440000"), name, 0)
        assert site.designs["linux-6.18"] == OPTIMIZE
    rz = {label: s for s in scan_file(REDZONE).sites for label in s.labels}
    site = rz["rz_nop5_site"]
    assert (site.kind, site.function, site.offset) == ("label", "rz_nop5", 0xDF)
    assert site.address == 0x40186F
    assert rz["rz_nop10_site"].designs["nop10"] == OPTIMIZE


def test_inline_sweep_finds_nops_inside_functions() -> None:
    sites = scan_file(TARGETS).sites
    inline = [s for s in sites if s.kind == "inline"]
    assert inline and all(s.function is not None and s.offset > 0 for s in inline)
    assert all(len(s.raw) in (5, 10) for s in inline)
    assert not [s for s in scan_file(TARGETS, inline=False).sites if s.kind == "inline"]


def test_usdt_notes_with_semaphore_arguments_and_combo() -> None:
    notes = {s.usdt.name: s for s in scan_file(USDT).sites if s.usdt is not None}
    assert set(notes) == {"start", "tick", "sema", "combo5", "combo10"}
    tick, sema = notes["tick"].usdt, notes["sema"].usdt
    assert tick is not None and sema is not None
    assert (tick.provider, tick.arg_text, tick.semaphore) == ("demo", "-4@%edx -8@%rdi -4@$5", 0)
    assert sema.semaphore != 0 and sema.arg_text == "-4@%edx -4@%eax"
    assert notes["combo5"].raw == bytes.fromhex("900f1f440000")
    assert notes["combo5"].designs["linux-6.18"] == "optimize (+1)"
    assert notes["combo5"].designs["nop10"] == "int3"
    assert notes["combo10"].designs["nop10"] == "optimize (+1)"
    assert notes["combo10"].designs["linux-6.18"] == "int3"  # the `90`: the nop10 after it is refused
    assert notes["start"].designs["linux-6.18"] == "int3"


def test_cli_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sites.json"
    assert main(["scan", "--json", str(out), "--kernel", "linux-6.18,nop10", USDT]) == 0
    text = capsys.readouterr().out
    assert "usdt:demo:combo5" in text and "optimize (+1)" in text and "-4@%edx -8@%rdi -4@$5" in text
    data = json.loads(out.read_text())
    assert isinstance(data, list)
    combo = next(d for d in data if d["kind"] == "usdt" and d["usdt"]["name"] == "combo5")
    assert combo["designs"] == {"linux-6.18": "optimize (+1)", "nop10": "int3"}
    assert combo["usdt"]["args"] == ["-4@%edx"]


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(tmp_path / "missing")]) == 2
    junk = tmp_path / "junk"
    junk.write_bytes(b"not an elf")
    assert main(["scan", str(junk)]) == 2
    assert "cannot scan" in capsys.readouterr().err


def test_static_glibc_binary_is_scanned_whole() -> None:
    # A whole static glibc is decoded (its speed is no unit test's business).
    result = scan_file(str(SAMPLES / "hello_static"))
    assert result.instructions > 50_000 and result.sites
