"""Instructions per probe_hits iteration, plain and verified, and the Unicorn work behind the difference.

    python3 benchmarks/hit_instructions.py [--rows int3,linux-6.18/nop5,...] [--json FILE]

Timed ratios on a shared machine move by a tenth and more between runs; instruction counts do not.
Each row of benchmarks/probe_hits.py (and the unprobed loop, with the verifiers on and no probe)
runs under ``valgrind --tool=callgrind --smc-check=all`` at 2,000 and 12,000 iterations, plain and
verified; a figure is the difference between the two lengths over 10,000, so start-up cancels.
Besides the total, it reports what three Unicorn functions and everything they call cost per
iteration: cpu_restore_state (the guest state restored before each memory-write hook runs),
load_helper (loads sent through the slow path once any memory hook exists) and uc_context_save (the
verifiers' CPU snapshots), and the ratio a verifier whose own logic cost nothing would reach:
plain / (plain + the growth of those three). Needs valgrind; about a minute per run (four a row).
No assertions: the numbers go into the README.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # probe_hits, for its rows and its run

import callgrind  # noqa: E402
import probe_hits  # noqa: E402

SHORT, LONG = 2_000, 12_000
UNICORN_WORK = ("cpu_restore_state_x86_64", "load_helper", "uc_context_save")
LOOP = ("linux-6.18", None, "nop")  # the unprobed loop


def _child(design: str, spec: str, workload: str, n: int, verify: bool) -> None:
    probe_hits.cpu_seconds([probe_hits.TRIG, workload, str(n)], design, spec or None, verify)


def _profile(row: tuple[str, str | None, str], n: int, verify: bool, out: Path) -> dict[str, int]:
    """Total instructions and the inclusive cost of UNICORN_WORK in one run of ``n`` iterations."""
    design, spec, workload = row
    argv = [sys.executable, __file__, "--child", design, spec or "", workload, str(n), "1" if verify else "0"]
    return {"total": callgrind.profile(argv, out)["Ir"], **callgrind.inclusive(out, UNICORN_WORK)}


def per_iteration(row: tuple[str, str | None, str], verify: bool, tmp: Path) -> dict[str, float]:
    short, long = (_profile(row, n, verify, tmp / f"{n}.out") for n in (SHORT, LONG))
    return {k: (long.get(k, 0) - short.get(k, 0)) / (LONG - SHORT) for k in ("total", *UNICORN_WORK)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", help="comma-separated DESIGN or DESIGN/WORKLOAD (default: every probe_hits row)")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        design, spec, workload, n, verify = args.child
        _child(design, spec, workload, int(n), verify == "1")
        return
    callgrind.require("hit_instructions")
    rows = [LOOP] + [(d, s, w) for d, s, w, _path, _scale in probe_hits.ROWS]
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r[0] in wanted or f"{r[0]}/{r[2]}" in wanted or f"{r[0]}/{r[1]}" in wanted]
    print(f"{'design':<14} {'probe':<30} {'plain':>7} {'verified':>9} {'restore':>15} {'loads':>13} "
          f"{'snapshots':>15} {'ceiling':>8}")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            plain, verified = (per_iteration(row, v, Path(tmp)) for v in (False, True))
            growth = sum(verified[k] - plain[k] for k in UNICORN_WORK)
            ceiling = plain["total"] / (plain["total"] + growth) if row[1] else None
            cells = [f"{round(plain[k]):,} -> {round(verified[k]):,}" for k in UNICORN_WORK]
            print(f"{row[0]:<14} {row[1] or '(no probe)':<30} {plain['total']:>7,.0f} {verified['total']:>9,.0f} "
                  f"{cells[0]:>15} {cells[1]:>13} {cells[2]:>15} {'-' if ceiling is None else f'{ceiling:.2f}':>8}",
                  flush=True)
            out.append({"design": row[0], "probe": row[1], "workload": row[2], "plain": plain, "verified": verified,
                        "ceiling": ceiling})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
