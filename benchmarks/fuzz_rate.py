"""Fuzz cases per second with 1 and 2 worker processes, in one run, and their ratio.

    python3 benchmarks/fuzz_rate.py [--cases N] [--kernel D] [--repeat R] [--json FILE]

Each row runs a campaign of N cases (seed 0) through emu.fuzz.campaign.run_campaign, the
same code `uprobe-emu fuzz` runs, and reports cases/s (wall) plus CPU-seconds per case of
the main process for --jobs 1 (the per-core rate). Runs alternate between jobs 1 and 2 and
the median of --repeat is kept. No assertions: the numbers go into the README and the notes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from emu.fuzz.campaign import CampaignConfig, Stats, run_campaign  # noqa: E402


def one_run(design: str, cases: int, jobs: int, out: str) -> tuple[float, float]:
    """(cases/s wall, cases per CPU-second of this process; meaningful for jobs 1)."""
    cpu = time.process_time()
    stats = run_campaign(CampaignConfig((design,), seed=0, cases=cases, jobs=jobs, out=out), lambda _s: None)
    used = time.process_time() - cpu
    assert isinstance(stats, Stats) and stats.cases == cases
    return stats.rate, cases / used if used > 0 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--kernel", default="jmp-slots", help="design (default jmp-slots: no findings, no shrinking)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    rates: dict[int, list[float]] = {1: [], 2: []}
    per_cpu: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        for _ in range(a.repeat):
            for jobs in (1, 2):
                wall, cpu = one_run(a.kernel, a.cases, jobs, out)
                rates[jobs].append(wall)
                if jobs == 1:
                    per_cpu.append(cpu)
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    rows = {"design": a.kernel, "cases": a.cases, "cpus": os.cpu_count(), "jobs1_cases_per_s": round(one, 1),
            "jobs1_cases_per_cpu_s": round(statistics.median(per_cpu), 1), "jobs2_cases_per_s": round(two, 1),
            "jobs2_over_jobs1": round(two / one, 2), "samples": {str(k): v for k, v in rates.items()},
            "loadavg_after": os.getloadavg()}
    print(f"{a.kernel}, {a.cases} cases, median of {a.repeat}: jobs 1: {one:.0f} cases/s "
          f"({rows['jobs1_cases_per_cpu_s']:.0f} per CPU-second); jobs 2: {two:.0f} cases/s; ratio {two / one:.2f}x "
          f"(load average after: {rows['loadavg_after'][0]:.2f})")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
