"""`uprobe-emu bench`: the kernel's trigger benchmarks, emulated, with per-hit accounting; the published
native figures beside the counts (--report) and the cost model's predicted native rates (--predict)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from emu.commands.common import (
    add_design_options,
    add_html_option,
    check_writable,
    chosen_designs,
    positive_float,
    positive_int,
    stderr_line,
    write_json,
)
from emu.errors import UsageError

NAME = "bench"
HELP = "bench_trigger workloads per design: rates, what each hit costs, and predicted native rates"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_design_options(p, "all", "designs (default all: built-in and --design-file ones)")
    p.add_argument("--workload", default="all", metavar="W1,W2", help="workloads (default all)")
    p.add_argument("--duration", type=positive_float, default=0.5, metavar="S", help="seconds per run (default 0.5)")
    p.add_argument("--runs", type=positive_int, default=3, metavar="N", help="runs per workload (default 3)")
    p.add_argument("--json", metavar="FILE", help="write rates and per-hit accounting (or the report and predictions) "
                                                  "as JSON")
    p.add_argument("--report", metavar="FILE", nargs="?", const="-",
                   help="instead of timing the emulator: every published native figure beside the designs' per-hit "
                        "counts and the cost model's predictions, as text (to FILE, or stdout)")
    p.add_argument("--predict", metavar="CPU",
                   help="the cost model's predicted native rates of the selected designs and workloads on CPU "
                        "(a published one, or 'native': this machine, measured now)")
    p.add_argument("--no-native", action="store_true",
                   help="with --report or --predict: do not time this machine's kernel (no 'native' rows)")
    add_html_option(p, "per-hit events per design as grouped bars, beside the published native rates")


def run(args: argparse.Namespace) -> int:
    for path in (args.json, args.report, args.html):
        if path and path != "-":
            check_writable(path)
    if args.report is not None or args.predict:
        return _model(args)
    from emu.bench.workloads import results_table, run_bench, workloads_from  # heavy: only when run

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
    if args.html:
        from emu.report.bench_page import page

        page(results, f"uprobe-emu bench --kernel {args.kernel} --workload {args.workload}").write(args.html)
    return 0


def _check_cpu(name: str | None, no_native: bool) -> None:
    from emu.bench import published
    from emu.bench.model import NATIVE_CPU

    if name is None:
        return
    known = [c.slug for c in published.CPUS] + ([] if no_native else [NATIVE_CPU])
    if name not in known:
        raise UsageError(f"--predict {name!r}: unknown CPU (known: {', '.join(known)})")


def _model(args: argparse.Namespace) -> int:
    _check_cpu(args.predict, args.no_native)
    from emu.bench.model import NATIVE_CPU, Counts, predict, sources
    from emu.bench.workloads import workloads_from

    designs, workloads = chosen_designs(args), workloads_from(args.workload)
    counts = Counts()
    native, reason = _native(args.no_native or (args.report is None and args.predict != NATIVE_CPU))
    if args.predict == NATIVE_CPU and native is None:
        raise UsageError(f"--predict native: this machine cannot be timed: {reason}")
    src = sources(counts, native)
    payload: dict[str, Any] = {}
    if args.report is not None:
        from emu.bench.report import build, render

        payload["report"] = build(counts, src, native, reason, designs, workloads)
        _emit(args.report, render(payload["report"]))
    if args.predict:
        predictions = predict(src, args.predict, designs, workloads, counts)
        payload["predictions"] = {"cpu": args.predict, "rows": [
            {"design": p.design, "workload": p.workload, "mps": p.mps, "err_mps": p.err_mps} for p in predictions]}
        _emit("-", _predictions_text(args.predict, predictions))
    if args.json:
        write_json(args.json, payload)
    return 0


def _native(skip: bool) -> tuple[Any, str | None]:
    """This machine's native rows, or None and why not."""
    if skip:
        return None, "not asked for (--no-native)"
    from emu.bench.native import measure_native
    from emu.native import NativeUnavailable

    try:
        stderr_line("bench: timing this machine's kernel (perf uprobes) ...")
        return measure_native(), None
    except NativeUnavailable as exc:
        return None, str(exc)


def _emit(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    with open(path, "w") as fh:
        fh.write(text)


def _predictions_text(cpu: str, predictions: Any) -> str:
    from emu.render import table

    rows: list[tuple[str, ...]] = [("design", "workload", "predicted M/s", "±")]
    rows += [(p.design, p.workload, f"{p.mps:.3f}", f"{p.err_mps:.3f}") for p in predictions]
    return f"Predicted native rates on {cpu} (cost model, 1-sigma error bars):\n\n{table(rows)}\n"
