"""How much slower the parity battery runs under emulation than natively, and where the time goes.

    python3 benchmarks/parity_slowdown.py [--reps N] [--only SUBSTRING] [--json FILE]

For every command line of tests/test_parity_battery.py, in a fresh directory prepared as the test
does: the native run (a subprocess) and the emulated run (``python3 -m emu run``, a subprocess,
the tool's own start-up included), interleaved, median of ``--reps``. Then one in-process emulated
run split into start-up (building the machine: loading, mapping, the stack), time inside the fake
kernel's syscall entry, and the rest (guest code under Unicorn: translation, execution, hooks).
Prints one line per command and the medians. Nothing asserts on a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from test_parity_battery import BATTERY, prepare  # noqa: E402

from emu.guestio import GuestIO  # noqa: E402
from emu.kernel.dispatch import Kernel, KernelConfig  # noqa: E402
from emu.machine import Machine, RunOptions  # noqa: E402


def _wall(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - start


def _split(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    """One in-process emulated run: start-up, syscalls, the rest."""
    spent = [0.0]
    original = Kernel.on_syscall

    def timed(self: Kernel) -> None:
        start = time.perf_counter()
        try:
            original(self)
        finally:
            spent[0] += time.perf_counter() - start

    Kernel.on_syscall = timed  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        options = RunOptions(kernel=KernelConfig(cwd=str(cwd)), timeout_s=600)
        machine = Machine(argv[0], list(argv), env, options, GuestIO.captured())
        t1 = time.perf_counter()
        machine.run()
        t2 = time.perf_counter()
    finally:
        Kernel.on_syscall = original  # type: ignore[method-assign]
    return {"startup": t1 - t0, "syscalls": spent[0], "guest": t2 - t1 - spent[0]}


def measure(argv: list[str], reps: int) -> dict[str, Any]:
    natives, emulated = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(reps):
            for side in ("native", "emu"):
                run_dir = Path(tempfile.mkdtemp(dir=tmp))
                work, env = prepare(run_dir)
                if side == "native":
                    natives.append(_wall(argv, env, work))
                else:
                    cmd = [sys.executable, "-m", "emu", "run", "--", *argv]
                    emulated.append(_wall(cmd, {**env, "PYTHONPATH": str(REPO)}, work))
        work, env = prepare(Path(tempfile.mkdtemp(dir=tmp)))
        split = _split(argv, env, work)
    native, emu = statistics.median(natives), statistics.median(emulated)
    return {"argv": argv, "native_s": native, "emulated_s": emu, "ratio": emu / native, **split}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", default="", help="only command lines containing this text")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    rows = []
    for argv in BATTERY:
        if args.only not in " ".join(argv):
            continue
        row = measure(argv, args.reps)
        rows.append(row)
        shown = argv[2].replace("\n", "; ")[:50]
        print(f"{row['ratio']:7.1f}x  native {row['native_s']:6.3f}s  emulated {row['emulated_s']:6.2f}s  "
              f"start-up {row['startup']:5.2f}s  syscalls {row['syscalls']:5.2f}s  guest {row['guest']:6.2f}s  "
              f"{os.path.basename(argv[0])} {shown}", flush=True)
    if not rows:
        return 1
    med = {k: statistics.median(r[k] for r in rows) for k in ("ratio", "native_s", "emulated_s", "startup",
                                                               "syscalls", "guest")}
    total = sum(r["startup"] + r["syscalls"] + r["guest"] for r in rows)
    shares = {k: sum(r[k] for r in rows) / total for k in ("startup", "syscalls", "guest")}
    print(f"median over {len(rows)} command lines: {med['ratio']:.1f}x slower (native {med['native_s']:.3f}s, "
          f"emulated {med['emulated_s']:.2f}s)")
    print("in-process time, all command lines: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "median": med, "shares": shares}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
