"""What instruction counting costs (``run --json`` and ``--max-insns``), as a ratio to the same run
without it, measured in one process (no assertions).

    python3 benchmarks/icount.py [--reps R] [--no-python-guest] [--json FILE]
    UPROBE_EMU_PURE_PYTHON=1 python3 benchmarks/icount.py     # the pure-Python counter

For each CPU-bound guest, ``Machine.run()`` (after an untimed warm-up) with counting off, with
``count_insns`` (what ``run --json`` does) and with ``max_insns`` set past the end (what
``--max-insns`` does), interleaved, median of ``--reps``; a primed Unicorn engine stays alive for the
whole run (the first engine of a process runs hot code 2-3x slower: docs/unicorn.md section 1).
The guests: a two-instruction loop (``dec rcx; jnz``, the worst case: one block every two
instructions), elf_samples/cpu_bound (a C loop) and python3.11 running a loop. The target is
counting at most 1.3x of the run without it ("met" compares the medians; "best" is the ratio of the
fastest runs, count/max-insns, steadier on a loaded machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from emu import hotpath  # noqa: E402
from emu.cpu import Cpu  # noqa: E402
from emu.fuzz.elfwriter import write_elf  # noqa: E402
from emu.guestio import GuestIO  # noqa: E402
from emu.machine import Machine, RunOptions  # noqa: E402

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
PYTHON = "/usr/bin/python3.11"
TARGET = 1.3
MODES = {"off": RunOptions(), "count": RunOptions(count_insns=True), "max-insns": RunOptions(max_insns=1 << 62)}


def loop_code(n: int) -> bytes:
    """mov rcx, n; 1: dec rcx; jnz 1b; exit_group(0): 2n + 4 instructions."""
    return (b"\x48\xc7\xc1" + struct.pack("<i", n) + b"\x48\xff\xc9\x75\xfb"
            + b"\xb8\xe7\x00\x00\x00\x31\xff\x0f\x05")


def _timed(argv: list[str], options: RunOptions) -> tuple[float, int | None]:
    machine = Machine(argv[0], argv, {"PATH": "/usr/bin", "LANG": "C"}, options, GuestIO.captured())
    start = time.perf_counter()
    result = machine.run()
    return time.perf_counter() - start, result.insns


def measure(argv: list[str], reps: int) -> dict[str, object]:
    for options in MODES.values():
        _timed(argv, options)  # warm-up: page cache, capstone, imports
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    insns = None
    for rep in range(reps):
        order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
        for mode in order:
            seconds, counted = _timed(argv, MODES[mode])
            samples[mode].append(seconds)
            insns = counted if counted is not None else insns
    medians = {mode: statistics.median(times) for mode, times in samples.items()}
    best = {mode: min(times) for mode, times in samples.items()}
    return {"guest": " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv)), "insns": insns,
            "seconds": medians, "samples": samples,
            "ratios": {mode: medians[mode] / medians["off"] for mode in MODES if mode != "off"},
            "best_ratios": {mode: best[mode] / best["off"] for mode in MODES if mode != "off"}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--loop", type=int, default=20_000_000, help="iterations of the two-instruction loop")
    p.add_argument("--no-python-guest", action="store_true", help="leave out the python3.11 loop (the slowest row)")
    p.add_argument("--json", metavar="FILE", help="also write the rows and every sample")
    args = p.parse_args()
    primer = Cpu()  # kept alive to the end (see the docstring)
    with tempfile.TemporaryDirectory() as tmp:
        loop = os.path.join(tmp, "loop")
        write_elf(loop, loop_code(args.loop), b"")
        guests = [[loop], [str(SAMPLES / "cpu_bound"), "30000000"]]
        if not args.no_python_guest:
            guests.append([PYTHON, "-c", "s = 0\nfor i in range(300000): s += i"])
        rows = [measure(argv, args.reps) for argv in guests]
    print(hotpath.implementation())
    print(f"{'guest':36s} {'insns':>12s} {'off s':>8s} {'count s':>8s} {'ratio':>6s} {'max s':>8s} {'ratio':>6s} "
          f"{'best':>11s} met")
    for row in rows:
        s, r, b = row["seconds"], row["ratios"], row["best_ratios"]
        assert isinstance(s, dict) and isinstance(r, dict) and isinstance(b, dict)
        met = "yes" if max(r.values()) <= TARGET else "no"
        guest = str(row["guest"]).replace("\n", "\\n")[:36]
        print(f"{guest:36s} {row['insns']:>12,} {s['off']:8.3f} {s['count']:8.3f} {r['count']:6.2f} "
              f"{s['max-insns']:8.3f} {r['max-insns']:6.2f} {b['count']:5.2f}/{b['max-insns']:5.2f} {met}")
    if args.json:
        Path(args.json).write_text(json.dumps({"implementation": hotpath.implementation(), "rows": rows}, indent=1))
    del primer
    return 0


if __name__ == "__main__":
    sys.exit(main())
