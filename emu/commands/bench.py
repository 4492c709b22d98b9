"""`uprobe-emu bench`: the kernel's trigger benchmarks, emulated, with per-hit accounting."""

from __future__ import annotations

import argparse

from emu.commands.common import (
    add_design_options,
    add_html_option,
    check_writable,
    chosen_designs,
    positive_float,
    positive_int,
    write_json,
)

NAME = "bench"
HELP = "bench_trigger workloads per design: rates and what each hit costs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_design_options(p, "all", "designs (default all: built-in and --design-file ones)")
    p.add_argument("--workload", default="all", metavar="W1,W2", help="workloads (default all)")
    p.add_argument("--duration", type=positive_float, default=0.5, metavar="S", help="seconds per run (default 0.5)")
    p.add_argument("--runs", type=positive_int, default=3, metavar="N", help="runs per workload (default 3)")
    p.add_argument("--json", metavar="FILE", help="write rates and per-hit accounting as JSON")
    p.add_argument("--report", metavar="FILE", help="write a Markdown report beside the published native figures")
    add_html_option(p, "per-hit events per design as grouped bars, beside the published native rates")


def run(args: argparse.Namespace) -> int:
    for path in (args.json, args.report, args.html):
        if path:
            check_writable(path)
    from emu.bench import report_markdown, results_table, run_bench, workloads_from  # heavy: only when run

    results = run_bench(chosen_designs(args), workloads_from(args.workload), args.duration, args.runs)
    for design in dict.fromkeys(r.design for r in results):
        print(f"{design}:")
        for r in results:
            if r.design == design:
                print("  " + r.line())
    print()
    print(results_table(results))
    if args.json:
        write_json(args.json, {"results": {f"{r.design}/{r.workload}": r.to_json() for r in results}})
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(report_markdown(results))
    if args.html:
        from emu.report.bench_page import page

        page(results, f"uprobe-emu bench --kernel {args.kernel} --workload {args.workload}").write(args.html)
    return 0
