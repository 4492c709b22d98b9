"""Probe hits per second per design and path, in one process, against the unprobed loop.

    python3 benchmarks/probe_hits.py [--iterations N] [--repeat R] [--verify] [--json FILE]

Each row runs elf_samples/trig WORKLOAD N with one probe attached (20 N for the rows the C extension
takes) and reports hits/s
(hits / CPU time of the emulation, median of --repeat runs: the machines these run on are
shared, and CPU time moves far less than wall time when others are busy). --verify also runs
every row with the red-zone, register and resume verifiers on, alternating with the plain
runs, same N, and prints the verified/plain ratio: the median over the pairs of a plain run and
the verified run right after it (the machine's speed drifts, and a pair shares its drift). No
assertions: the numbers go into the README and the issue notes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from emu.guestio import GuestIO  # noqa: E402
from emu.machine import Machine, RunOptions  # noqa: E402
from emu.verify.session import VerifySession  # noqa: E402

TRIG = str(Path(__file__).resolve().parent.parent / "elf_samples" / "trig")
FAST = 20  # the rows whose hits the C extension takes run this many times --iterations (a run's fixed costs
ROWS = [   # would otherwise weigh on a figure of a few tens of milliseconds)
    ("int3", "uprobe:uprobe_target_nop", "nop", "INT3 + emulated nop", FAST),
    ("linux-6.18", "uprobe:uprobe_target_push", "push", "INT3 + emulated push", 1),
    ("linux-6.18", "uprobe:uprobe_target_ret", "ret", "INT3 + XOL step", 1),
    ("linux-6.18", "uprobe:uprobe_target_nop5", "nop5", "optimized: call + syscall 336", FAST),
    ("jmp-slots", "uprobe:uprobe_target_nop5", "nop5", "optimized: jmp slot + syscall 336 (IRET)", FAST),
    ("nop10", "uprobe:uprobe_target_nop10", "nop10", "optimized: lea+call + syscall 336", FAST),
    ("int3", "uretprobe:uprobe_target_nop", "nop", "uretprobe via INT3 trampoline", 1),
    ("uretprobe-rfc", "uretprobe:uprobe_target_nop", "nop", "uretprobe via syscall 462", 1),
    ("linux-6.18", "uretprobe:uprobe_target_nop5", "nop5", "uretprobe: optimized entry + syscall 335", FAST),
]


def cpu_seconds(argv: list[str], design: str, spec: str | None, verify: bool,
                prepare: Callable[[Machine], object] | None = None) -> float:
    """CPU time of one emulated run of ``argv`` under ``design``, with ``spec`` attached, ``prepare`` called
    on the machine and the verifiers on if asked (construction excluded)."""
    m = Machine(argv[0], argv, {}, RunOptions(design=design), GuestIO.captured())
    if spec:
        m.attach(spec)
    if prepare:
        prepare(m)
    if verify:
        VerifySession(m)
    start = time.process_time()
    result = m.run()
    elapsed = time.process_time() - start
    assert result.exit_status == 0, result.message
    return elapsed


def hits_per_second(design: str, spec: str | None, workload: str, n: int, verify: bool) -> float:
    return n / cpu_seconds([TRIG, workload, str(n)], design, spec, verify)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    base = statistics.median(hits_per_second("linux-6.18", None, "nop", args.iterations * 10, False)
                             for _ in range(args.repeat))
    print(f"unprobed loop: {base:,.0f} calls/s\n")
    header = f"{'design':<14} {'probe':<30} {'path':<42} {'hits/s':>10}"
    print(header + ("  verified/s   ratio" if args.verify else ""))
    out = []
    for design, spec, workload, path, scale in ROWS:
        n = args.iterations * scale
        runs = [(hits_per_second(design, spec, workload, n, False),
                 hits_per_second(design, spec, workload, n, True) if args.verify else 0.0)
                for _ in range(args.repeat)]
        off = statistics.median(r[0] for r in runs)
        row = {"design": design, "probe": spec, "path": path, "hits_per_s": off}
        line = f"{design:<14} {spec:<30} {path:<42} {off:>10,.0f}"
        if args.verify:
            on = statistics.median(r[1] for r in runs)
            ratio = statistics.median(r[1] / r[0] for r in runs)  # of each verified run and the plain one just before it
            row |= {"verified_hits_per_s": on, "ratio": ratio}
            line += f"  {on:>10,.0f}   {ratio:.2f}x"
        print(line, flush=True)
        out.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"unprobed_calls_per_s": base, "rows": out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
