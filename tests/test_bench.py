"""`uprobe-emu bench`: exact per-hit accounting per design, and the kernel bench's output format."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from emu import cli
from emu.bench.workloads import WORKLOADS, account, supported


@pytest.mark.parametrize(
    ("design", "workload", "expected"),
    [
        # 6.18: call into the trampoline, push x3, mov, syscall (SYSRET), pop x3, ret; 32 bytes in, 32 out
        ("linux-6.18", "uprobe-nop5", dict(traps=0, syscalls=1, sysret=1, iret=0, kernel_page_insns=9, calls=1,
                                           rets=1, copied=64, rsb_mispredicts=0, mmap_locks=1)),
        # jmp-slots: jmp, lea, push x3, mov, syscall; IRET straight back; 24 bytes read
        # the slot is found by its index (RCU), not by a VMA lookup under mmap_lock
        ("jmp-slots", "uprobe-nop5", dict(traps=0, syscalls=1, sysret=0, iret=1, kernel_page_insns=6, calls=0,
                                          rets=0, copied=24, mmap_locks=0)),
        ("nop10", "uprobe-nop10", dict(traps=0, syscalls=1, sysret=1, iret=0, kernel_page_insns=9, calls=1,
                                       rets=1, copied=64)),
        ("int3", "uprobe-nop5", dict(traps=1, syscalls=0, sysret=0, iret=0, kernel_page_insns=0, copied=0)),
        ("int3", "uprobe-ret", dict(traps=1, syscalls=0, kernel_page_insns=1, single_steps=1)),  # ret stepped in [uprobes]
        ("int3", "uretprobe-nop", dict(traps=2, syscalls=0, uret_returns=1, mmap_locks=0)),  # entry + return trampoline
        ("uretprobe-rfc", "uretprobe-nop", dict(traps=1, syscalls=1, iret=1, sysret=0, rsb_mispredicts=1)),
        # the 335 trampoline's own ret shifts the return stack buffer: two mispredicts a hit
        ("linux-6.18", "uretprobe-nop5", dict(syscalls=2, sysret=2, rsb_mispredicts=2, copied=128, mmap_locks=1)),
    ],
)
def test_per_hit_accounting(design: str, workload: str, expected: dict[str, float]) -> None:
    acc = account(design, WORKLOADS[workload], iterations=100)
    assert {k: getattr(acc, k) for k in expected} == expected


def test_unsupported_workloads_are_skipped_not_faked() -> None:
    assert not supported("linux-6.18", WORKLOADS["uprobe-nop10"])  # the kernel refuses the cs-prefixed nop10
    assert supported("nop10", WORKLOADS["uprobe-nop10"])


def test_cli_prints_kernel_bench_lines_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "b.json"
    status = cli.main(["bench", "--kernel", "linux-6.18", "--workload", "uprobe-nop5", "--duration", "0.05",
                       "--runs", "2", "--json", str(out_json)])
    assert status == 0
    out = capsys.readouterr().out
    assert re.search(r"^  uprobe-nop5    : +\d+\.\d{3} ± \d+\.\d{3}M/s$", out, re.M), out
    data = json.loads(out_json.read_text())["results"]["linux-6.18/uprobe-nop5"]
    assert len(data["rates_mps"]) == 2 and data["accounting_per_hit"]["syscalls"] == 1.0
    assert data["accounting_per_hit"]["mmap-locks"] == 1.0


def test_native_usdt_probe_lands_on_the_nop5_as_libbpf_puts_it() -> None:
    from emu.bench.native import NATIVE_DESIGN, _probes
    from emu.bench.workloads import TRIG, _machine
    from emu.diff import native_probe

    with open(TRIG, "rb") as fh:
        data = fh.read()
    (probe,) = _probes(WORKLOADS["usdt-nop5"])
    assert data[probe.offset - 1:probe.offset + 5] == b"\x90\x0f\x1f\x44\x00\x00"  # the nop5 after the nop1
    attached, _ = _machine(NATIVE_DESIGN, WORKLOADS["usdt-nop5"], 1)  # negative control: its INT3 hides the combo
    assert native_probe(attached, "usdt:trig:usdt_2").offset == probe.offset - 1
