"""Harness overhead against bare Unicorn, measured side by side in one run.

    python3 benchmarks/overhead.py [--reps N] [--json FILE] [--cpu-n N] [--getpid-n N]

Four workloads (see benchmarks/README.md for the method):

1. cpu_bound N: guest instructions/s under ``emu.machine.Machine(...).run()``
   (instruction counting off) against bare_loader.BareProcess, both in this
   process with a primed, live throwaway Uc. Instruction counts come from a
   separate counted run of each (block hook + capstone). Whole run
   (construction + run) and emulation only (``emu_start``) are both reported.
2. getpid_loop N: emulated syscalls/s, harness and bare (stock-binding hook
   that answers getpid first), same process.
3. hello_static whole process: ``python3 -m emu run`` against
   ``python3 benchmarks/bare_loader.py``, both as subprocesses.
4. /bin/true (dynamic) whole process under ``python3 -m emu run``.

Prints a table (metric, harness, bare, ratio, target, met). Nothing asserts on
timings: this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SAMPLES = os.path.join(REPO, "elf_samples")
CPU_BOUND = os.path.join(SAMPLES, "cpu_bound")
GETPID_LOOP = os.path.join(SAMPLES, "getpid_loop")
HELLO_STATIC = os.path.join(SAMPLES, "hello_static")
BIN_TRUE = "/bin/true"
GUEST_ENV = ["PATH=/usr/bin:/bin", "LANG=C"]  # the same small environment for both sides

for path in (REPO, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)


@dataclass
class Row:
    metric: str
    unit: str
    harness: float | None
    bare: float | None
    ratio: float | None  # harness / bare
    target: str
    met: bool | None


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "insn/s":
        return f"{value / 1e6:,.0f} M/s"
    if unit == "syscall/s":
        return f"{value:,.0f}/s"
    if unit == "s":
        return f"{value * 1e3:,.1f} ms"
    return f"{value:.3g}"


def print_table(rows: list[Row]) -> None:
    head = ("metric", "harness", "bare", "ratio", "target", "met")
    cells = [head] + [
        (r.metric, fmt(r.harness, r.unit), fmt(r.bare, r.unit),
         "-" if r.ratio is None else f"{r.ratio:.2f}x", r.target,
         "-" if r.met is None else ("yes" if r.met else "NO"))
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    aligns = ["<", ">", ">", ">", "<", "<"]
    for n, c in enumerate(cells):
        print("  ".join(f"{v:{a}{w}}" for v, a, w in zip(c, aligns, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


# ----------------------------------------------------------------- in-process runs
def harness_run(path: str, argv: list[str], count: bool = False) -> dict[str, Any]:
    """One Machine(...).run(); returns construction, emulation and whole times."""
    from emu.machine import Machine, RunOptions

    t0 = time.perf_counter()
    machine = Machine(path, argv, list(GUEST_ENV), RunOptions(count_insns=count))
    emu_s: list[float] = []
    inner = machine.cpu.run

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            emu_s.append(time.perf_counter() - t)

    machine.cpu.run = timed_run  # type: ignore[method-assign]
    t1 = time.perf_counter()
    result = machine.run()
    t2 = time.perf_counter()
    if result.exit_status != 0:
        raise RuntimeError(f"harness: {path} exited {result.exit_status}: {result.message}")
    return {"build_s": t1 - t0, "emu_s": sum(emu_s), "whole_s": t2 - t0, "insns": result.insns,
            "out": bytes(machine.io.out), "syscalls": sum(result.syscalls.values())}


def bare_run(path: str, argv: list[str], count: bool = False) -> dict[str, Any]:
    import bare_loader

    out = bytearray()
    t0 = time.perf_counter()
    proc = bare_loader.BareProcess(path, argv, list(GUEST_ENV), out=lambda _fd, data: out.extend(data))
    if count:
        proc.count_insns()
    t1 = time.perf_counter()
    status = proc.run()
    t2 = time.perf_counter()
    if status != 0:
        raise RuntimeError(f"bare: {path} exited {status}")
    return {"build_s": t1 - t0, "emu_s": t2 - t1, "whole_s": t2 - t0, "insns": proc.insns if count else None,
            "out": bytes(out), "syscalls": proc.syscalls}


def alternate(reps: int, *runs: Callable[[], dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Run each callable ``reps`` times, interleaved (A B A B ...) so drift hits both alike."""
    results: list[list[dict[str, Any]]] = [[] for _ in runs]
    for i in range(reps):
        order = range(len(runs)) if i % 2 == 0 else reversed(range(len(runs)))
        for j in order:
            results[j].append(runs[j]())
            gc.collect()  # free the finished process's Uc before the next one (untimed)
    return results


def bench_cpu(n: int, reps: int, raw: dict[str, Any]) -> list[Row]:
    argv = [CPU_BOUND, str(n)]
    h_count = harness_run(CPU_BOUND, argv, count=True)
    b_count = bare_run(CPU_BOUND, argv, count=True)
    if h_count["out"] != b_count["out"]:
        raise RuntimeError(f"outputs differ: {h_count['out']!r} vs {b_count['out']!r}")
    h_insns, b_insns = h_count["insns"], b_count["insns"]
    hs, bs = alternate(reps, lambda: harness_run(CPU_BOUND, argv), lambda: bare_run(CPU_BOUND, argv))
    h_emu, b_emu = median([r["emu_s"] for r in hs]), median([r["emu_s"] for r in bs])
    h_whole, b_whole = median([r["whole_s"] for r in hs]), median([r["whole_s"] for r in bs])
    raw["cpu_bound"] = {
        "n": n, "insns_harness": h_insns, "insns_bare": b_insns,
        "harness": [{k: v for k, v in r.items() if k != "out"} for r in hs],
        "bare": [{k: v for k, v in r.items() if k != "out"} for r in bs],
    }
    rows = []
    for label, h_s, b_s in (("emulation", h_emu, b_emu), ("whole run", h_whole, b_whole)):
        h_rate, b_rate = h_insns / h_s, b_insns / b_s
        ratio = h_rate / b_rate
        rows.append(Row(f"cpu_bound {n}: insn/s, {label}", "insn/s", h_rate, b_rate, ratio, ">= 0.8x bare",
                        ratio >= 0.8))
    return rows


def bench_getpid(n: int, reps: int, raw: dict[str, Any]) -> list[Row]:
    argv = [GETPID_LOOP, str(n)]
    hs, bs = alternate(reps, lambda: harness_run(GETPID_LOOP, argv), lambda: bare_run(GETPID_LOOP, argv))
    expect = f"sum={4242 * n}\n".encode()
    for r in hs + bs:
        if r["out"] != expect:
            raise RuntimeError(f"getpid_loop printed {r['out']!r}, expected {expect!r}")
    h_s, b_s = median([r["emu_s"] for r in hs]), median([r["emu_s"] for r in bs])
    h_rate = hs[0]["syscalls"] / h_s
    b_rate = bs[0]["syscalls"] / b_s
    raw["getpid_loop"] = {
        "n": n, "us_per_syscall_harness": 1e6 / h_rate, "us_per_syscall_bare": 1e6 / b_rate,
        "harness": [{k: v for k, v in r.items() if k != "out"} for r in hs],
        "bare": [{k: v for k, v in r.items() if k != "out"} for r in bs],
    }
    h_best = hs[0]["syscalls"] / min(r["emu_s"] for r in hs)
    b_best = bs[0]["syscalls"] / min(r["emu_s"] for r in bs)
    return [Row(f"getpid_loop {n}: syscalls/s (emulation)", "syscall/s", h_rate, b_rate, h_rate / b_rate,
                ">= 200,000/s", h_rate >= 200_000),
            Row(f"(ref) getpid_loop: best of {reps}", "syscall/s", h_best, b_best, h_best / b_best, "-", None)]


# -------------------------------------------------------------- whole-process runs
def wall(cmd: list[str], env: dict[str, str], expect: bytes | None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or (expect is not None and proc.stdout != expect):
        raise RuntimeError(f"{cmd} -> {proc.returncode}, stdout {proc.stdout[:200]!r}, stderr {proc.stderr[-500:]!r}")
    return elapsed


def bench_processes(reps: int, raw: dict[str, Any]) -> list[Row]:
    """Whole processes, interleaved. Bytecode caching is on for both sides (a private
    PYTHONPYCACHEPREFIX, warmed by one untimed run), as for any installed package; the
    inherited environment (PYTHONDONTWRITEBYTECODE=1 here recompiles every module of the
    harness on each start) is measured too, as a reference row."""
    py = sys.executable
    hello = b"hello, world\n"
    bare = os.path.join(HERE, "bare_loader.py")
    cache_dir = tempfile.mkdtemp(prefix="overhead-pyc-")
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = cache_dir
    inherited = dict(os.environ)
    cmds: dict[str, tuple[list[str], dict[str, str], bytes | None]] = {
        "python_pass": ([py, "-c", "pass"], cached, None),
        "python_import_unicorn": ([py, "-c", "import unicorn"], cached, None),
        "harness_hello": ([py, "-m", "emu", "run", HELLO_STATIC], cached, hello),
        "bare_hello": ([py, bare, HELLO_STATIC], cached, hello),
        "harness_true": ([py, "-m", "emu", "run", BIN_TRUE], cached, b""),
    }
    no_pyc = inherited.get("PYTHONDONTWRITEBYTECODE")
    if no_pyc:
        cmds["harness_hello_no_pyc"] = ([py, "-m", "emu", "run", HELLO_STATIC], inherited, hello)
        cmds["bare_hello_no_pyc"] = ([py, bare, HELLO_STATIC], inherited, hello)
    try:
        for cmd, env, expect in cmds.values():  # warm the page cache and the .pyc cache; not timed
            wall(cmd, env, expect)
        samples: dict[str, list[float]] = {k: [] for k in cmds}
        for i in range(reps):
            keys = list(cmds) if i % 2 == 0 else list(reversed(cmds))
            for key in keys:
                samples[key].append(wall(*cmds[key]))
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    raw["processes"] = samples
    med = {k: median(v) for k, v in samples.items()}
    ratio = med["harness_hello"] / med["bare_hello"]
    rows = [
        Row("hello_static: whole process wall", "s", med["harness_hello"], med["bare_hello"], ratio,
            "<= 1.5x bare", ratio <= 1.5),
        Row("/bin/true (dynamic): whole process wall", "s", med["harness_true"], None, None, "<= 0.5 s",
            med["harness_true"] <= 0.5),
    ]
    best_h, best_b = min(samples["harness_hello"]), min(samples["bare_hello"])
    rows.append(Row(f"(ref) hello_static: best of {reps}", "s", best_h, best_b, best_h / best_b, "-", None))
    if no_pyc:
        rows.append(Row("(ref) hello_static, PYTHONDONTWRITEBYTECODE=1", "s", med["harness_hello_no_pyc"],
                        med["bare_hello_no_pyc"], med["harness_hello_no_pyc"] / med["bare_hello_no_pyc"], "-", None))
    rows.append(Row("(ref) python3 -c pass / -c 'import unicorn'", "s", med["python_pass"],
                    med["python_import_unicorn"], None, "-", None))
    return rows


# ------------------------------------------------------------------------- main
def environment() -> dict[str, Any]:
    import unicorn

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        head = ""
    return {"python": platform.python_version(), "unicorn": unicorn.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "git_head": head,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions per measurement (median; default 5)")
    ap.add_argument("--process-reps", type=int, default=11, help="subprocess repetitions (default 11)")
    ap.add_argument("--cpu-n", type=int, default=4_000_000, help="cpu_bound iterations (~10 insns each)")
    ap.add_argument("--getpid-n", type=int, default=100_000, help="getpid_loop iterations")
    ap.add_argument("--json", metavar="FILE", help="also write rows, raw samples and environment as JSON")
    args = ap.parse_args(argv)

    import bare_loader

    load_start = os.getloadavg()
    primer = bare_loader.prime()  # live for the whole run: both sides get the primed rate
    started = time.perf_counter()
    raw: dict[str, Any] = {}
    try:  # warm-up: one untimed run of each side (imports, first translation of libc start-up code)
        harness_run(HELLO_STATIC, [HELLO_STATIC])
        bare_run(HELLO_STATIC, [HELLO_STATIC])
    except Exception as exc:
        print(f"warm-up failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    rows: list[Row] = []
    errors: list[str] = []
    sections: list[tuple[str, Callable[[], list[Row]]]] = [
        ("cpu_bound", lambda: bench_cpu(args.cpu_n, args.reps, raw)),
        ("getpid_loop", lambda: bench_getpid(args.getpid_n, args.reps, raw)),
        ("processes", lambda: bench_processes(args.process_reps, raw)),
    ]
    for name, section in sections:
        try:
            rows += section()
        except Exception as exc:  # report and go on: the tree may be mid-edit
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            rows.append(Row(f"{name}: ERROR (see below)", "", None, None, None, "-", None))
    elapsed = time.perf_counter() - started
    del primer

    env = environment()
    env["loadavg_start"] = load_start
    print(f"uprobe-emu overhead vs bare Unicorn {env['unicorn']} (Python {env['python']}, {env['cpus']} CPUs); "
          f"in-process medians of {args.reps}, subprocess medians of {args.process_reps} (interleaved); {elapsed:.0f} s")
    load0, load1 = env["loadavg_start"][0], env["loadavg"][0]
    print(f"1-min load average {load0:.1f} at start, {load1:.1f} at end"
          + ("  ** busy machine: expect noisy numbers **" if max(load0, load1) > (env["cpus"] or 1) else ""))
    if "cpu_bound" in raw:
        cb = raw["cpu_bound"]
        print(f"cpu_bound {cb['n']}: {cb['insns_harness']:,} insns under the harness, {cb['insns_bare']:,} bare "
              "(separate counted runs; the timed runs count nothing)")
    if "getpid_loop" in raw:
        gp = raw["getpid_loop"]
        print(f"getpid_loop {gp['n']}: {gp['us_per_syscall_harness']:.2f} us/syscall under the harness, "
              f"{gp['us_per_syscall_bare']:.2f} us bare (stock binding reg_read/reg_write)")
    print()
    print_table(rows)
    for err in errors:
        print(f"ERROR {err}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"environment": env, "rows": [asdict(r) for r in rows], "errors": errors, "raw": raw},
                      fh, indent=2)
            fh.write("\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
