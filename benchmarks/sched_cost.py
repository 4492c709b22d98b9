"""What threads cost the emulator, measured in one process (ratios, no assertions).

    python3 benchmarks/sched_cost.py [--calls N] [--repeat R]

1. Unicorn 2.1.4 context save/restore (the scheduler's switch): microseconds per call.
2. elf_samples/threads: the same calls by 1 thread (uncounted) and by 4 threads under quanta from
   100 to 100000 instructions: wall time, switches, and the extra time per switch (which includes
   Unicorn's per-instruction counting, the whole extra cost at large quanta).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from emu.cpu import Cpu  # noqa: E402
from emu.guestio import GuestIO  # noqa: E402
from emu.machine import Machine, RunOptions  # noqa: E402

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"


def context_costs(n: int = 100_000) -> dict[str, float]:
    cpu = Cpu()
    ctx = cpu.save_context()
    costs = {}
    for name, fn in (("save (reused)", lambda: cpu.save_context(ctx)), ("restore", lambda: cpu.restore_context(ctx)),
                     ("save (new)", lambda: cpu.save_context())):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        costs[name] = (time.perf_counter() - start) / n * 1e6
    return costs


def _timed(path: str, args: list[str], **opts: object) -> tuple[float, int, bytes]:
    machine = Machine(path, [path, *args], {}, RunOptions(**opts), GuestIO.captured())  # type: ignore[arg-type]
    start = time.perf_counter()
    result = machine.run()
    return time.perf_counter() - start, result.switches, bytes(machine.io.out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20_000, help="calls per thread of the threads sample")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    for name, us in context_costs().items():
        print(f"context {name:14s} {us:6.2f} us")
    threads = str(SAMPLES / "threads")
    single = statistics.median(_timed(threads, ["1", str(4 * args.calls)])[0] for _ in range(args.repeat))
    print(f"threads 1 x {4 * args.calls}: {single:.3f} s (uncounted: one thread never needs a slice)")
    for quantum in (100, 1_000, 10_000, 100_000):
        runs = [_timed(threads, ["4", str(args.calls)], sched_quantum=quantum) for _ in range(args.repeat)]
        wall = statistics.median(r[0] for r in runs)
        switches = runs[0][1]
        print(f"threads 4 x {args.calls}, quantum {quantum:>6}: {wall:.3f} s = {wall / single:5.2f}x, "
              f"{switches} switches, {(wall - single) / max(switches, 1) * 1e6:8.1f} us extra per switch (counting included)")


if __name__ == "__main__":
    main()
