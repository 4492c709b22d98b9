"""Probe hits per second as a fraction of the real kernel's, and how the cost grows with probes and hits.

    python3 benchmarks/hit_rates.py [--repeat R] [--json FILE]          # the three rates against native
    python3 benchmarks/hit_rates.py --scale [--hits N]                   # 1, 100, 10,000 probes
    python3 benchmarks/hit_rates.py --memory [--hits N]                  # RSS over 10 million hits

Rates: in one run, the real kernel here counts hits with a perf uprobe on the trig sample
(emu/bench/native.py: CPU time per hit, two run lengths so start-up cancels) and the emulator runs
the same sample under the design of the same kind: uprobe-nop5 and uretprobe-nop5 on linux-6.18
(optimized nop5: call into the trampoline, syscall 336, and for the return 335), uprobe-nop on the
int3 design (INT3 and an emulated nop; the real kernel never optimizes a one-byte nop, so it takes
the same path). The emulator's rate is CPU seconds of two run lengths, the same difference.

--scale: a program generated here with gcc, with S functions each starting with a nop5 and S probes
attached (one per function), calls all S in turn, then one of them only (the probes' tables alone);
the CPU time counted is that between two getpid calls the program makes once every site has been hit
twice (optimized). Each also runs unprobed, which shows what more distinct code costs the emulator
itself (Unicorn's translated-block lookups), and so what a hit adds to a call.
--memory: the resident set size of this process, sampled while one probe takes N hits (default
10 million): flat means the last sample is within a few MB of the one after the first tenth.
No assertions: the numbers go into the README.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from emu import hotpath  # noqa: E402
from emu.bench.workloads import TRIG, WORKLOADS  # noqa: E402
from emu.guestio import GuestIO  # noqa: E402
from emu.kernel.uprobes.consumers import Consumer  # noqa: E402
from emu.machine import Machine, RunOptions  # noqa: E402

RATE_ROWS = (("linux-6.18", "uprobe-nop5"), ("linux-6.18", "uretprobe-nop5"), ("int3", "uprobe-nop"))
SCALES = (1, 100, 10_000)
TARGET = 0.25


def _run_s(path: str, argv: list[str], design: str, specs: list[str], ret: bool) -> tuple[float, int]:
    """CPU seconds of one emulated run and the hits its consumers counted."""
    m = Machine(path, argv, {}, RunOptions(design=design), GuestIO.captured())
    consumers = [Consumer() for _ in specs]
    for spec, consumer in zip(specs, consumers, strict=True):
        m.attach(spec, consumer)
    start = time.process_time()
    result = m.run()
    elapsed = time.process_time() - start
    if result.exit_status != 0:
        raise SystemExit(f"{path} {argv[1:]} under {design}: {result.message or result.exit_status}")
    return elapsed, sum(c.ret_hits if ret else c.hits for c in consumers)


def emulated_rate(path: str, argv: list[str], n: int, design: str, specs: list[str], repeat: int,
                  at: int = -1) -> float:
    """Hits per CPU second: runs of n and 3n hits (the count goes into ``argv`` at ``at``; -1: at the
    end), start-up cancelled."""
    ret = any(s.startswith("uretprobe") for s in specs)
    rates = []
    for _ in range(repeat):
        short, h1 = _run_s(path, _with_count(argv, n, at), design, specs, ret)
        long_, h3 = _run_s(path, _with_count(argv, 3 * n, at), design, specs, ret)
        rates.append((h3 - h1) / max(long_ - short, 1e-9))
    return statistics.median(rates)


def _with_count(argv: list[str], n: int, at: int) -> list[str]:
    return [*argv, str(n)] if at == -1 else [*argv[:at], str(n), *argv[at:]]


def rates(repeat: int, n: int) -> list[dict[str, object]]:
    from emu.bench.native import measure_native, unavailable_reason

    reason = unavailable_reason()
    native = {} if reason else {t.workload: 1e9 / t.ns for t in measure_native(tuple(w for _, w in RATE_ROWS), repeat)}
    if reason:
        print(f"native side unavailable: {reason}")
    rows = []
    for design, name in RATE_ROWS:
        w = WORKLOADS[name]
        assert w.spec is not None
        emu = emulated_rate(TRIG, [TRIG, w.trig], n, design, [w.spec], repeat)
        nat = native.get(name)
        row: dict[str, object] = {"design": design, "workload": name, "emulated_hits_per_s": emu,
                                  "native_hits_per_s": nat, "fraction": emu / nat if nat else None}
        rows.append(row)
        frac = f"{emu / nat:6.3f}  {'met' if emu / nat >= TARGET else 'NOT met'}" if nat else "   -"
        print(f"{design:<11} {name:<15} {emu:>12,.0f} {nat or 0:>12,.0f}  {frac}", flush=True)
    return rows


SITES_SOURCE = """
.text
.globl main
main:
    push %rbx
    push %r12
    push %r13
    mov %rsi, %r12
    mov 16(%r12), %rdi         /* argv[2]: how many of the sites to call in turn */
    call atol
    mov %rax, %r13
    mov 8(%r12), %rdi          /* argv[1]: calls */
    call atol
    mov %rax, %rbx
    lea (%r13,%r13), %r12      /* twice round the sites first: the first hits trap and optimize */
4:  mov %r12, %rax
    xor %edx, %edx
    div %r13
    lea table(%rip), %rax
    call *(%rax,%rdx,8)
    dec %r12
    jnz 4b
    mov $39, %eax              /* getpid: the timed part starts */
    syscall
1:  test %rbx, %rbx
    jz 2f
    lea table(%rip), %rax
    call *(%rax,%r12,8)
    inc %r12
    cmp %r13, %r12
    jb 3f
    xor %r12d, %r12d
3:  dec %rbx
    jmp 1b
2:  mov $39, %eax              /* getpid: it ends */
    syscall
    xor %eax, %eax
    pop %r13
    pop %r12
    pop %rbx
    ret
"""


def sites_binary(count: int, where: Path) -> Path:
    """A static program with ``count`` sites, each a nop5 then ret (the optimizable form, spec 3.1); its
    main makes argv[1] calls, to site_0 .. site_{argv[2]-1} in turn."""
    lines = [SITES_SOURCE]
    for i in range(count):
        lines.append(f".globl site_{i}\n.type site_{i},@function\nsite_{i}:\n.byte 0x0f,0x1f,0x44,0x00,0x00\nret")
    lines.append(".section .data.rel.ro\n.align 8\ntable:")
    lines += [f".quad site_{i}" for i in range(count)]
    src = where / f"sites_{count}.s"
    src.write_text("\n".join(lines) + "\n")
    out = where / f"sites_{count}"
    subprocess.run(["gcc", "-static", "-O1", "-Wa,--noexecstack", "-o", str(out), str(src)], check=True)
    return out


def steady_rate(exe: str, calls: int, sites: int, specs: list[str], repeat: int) -> float:
    """Calls per CPU second between the program's two getpid calls (every site already optimized),
    with ``specs`` attached: the median of ``repeat`` runs."""
    from emu.kernel.rows import Row

    rates = []
    for _ in range(repeat):
        m = Machine(exe, [exe, str(calls), str(sites)], {}, RunOptions(design="linux-6.18"), GuestIO.captured())
        for spec in specs:
            m.attach(spec, Consumer())
        marks: list[float] = []

        def mark(_k: object, *_args: int, marks: list[float] = marks) -> int:
            marks.append(time.process_time())
            return 1

        m.kernel.add_rows((Row(39, "getpid", mark, ()),))
        result = m.run()
        if result.exit_status != 0 or len(marks) != 2:
            raise SystemExit(f"{exe}: {result.message or result.exit_status}")
        rates.append(calls / max(marks[1] - marks[0], 1e-9))
    return statistics.median(rates)


def scale(hits: int, repeat: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    first: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for count in SCALES:
            exe = str(sites_binary(count, Path(tmp)))
            specs = [f"uprobe:site_{i}" for i in range(count)]
            row: dict[str, object] = {"probes": count}
            line = f"{count:>6} probes:"
            for called, sites in (("all", count), ("one", 1)):  # every site in turn, or one hot site
                rate = steady_rate(exe, hits, sites, specs, repeat)
                calls = steady_rate(exe, hits, sites, [], repeat)
                probe_us = (1 / rate - 1 / calls) * 1e6  # what a hit adds to the call
                row |= {f"{called}_hits_per_s": rate, f"{called}_unprobed_calls_per_s": calls, f"{called}_probe_us": probe_us}
                first.setdefault(called, rate)
                first.setdefault(f"{called} unprobed", calls)
                line += (f"  {called} sites: {rate:>10,.0f} hits/s ({rate / first[called]:.2f}x), unprobed "
                         f"{calls:>10,.0f}/s ({calls / first[f'{called} unprobed']:.2f}x), a hit adds {probe_us:.3f} us")
            rows.append(row)
            print(line, flush=True)
    return rows


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory(hits: int) -> dict[str, object]:
    w = WORKLOADS["uprobe-nop5"]
    assert w.spec is not None
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            samples.append(_rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)  # emu_start releases the GIL: this runs meanwhile
    sampler.start()
    elapsed, counted = _run_s(TRIG, [TRIG, w.trig, str(hits)], "linux-6.18", [w.spec], False)
    done.set()
    sampler.join()
    early = samples[max(0, len(samples) // 10)] if samples else _rss_mb()
    last = samples[-1] if samples else _rss_mb()
    print(f"{counted:,} hits in {elapsed:.1f} CPU s; RSS {early:.1f} MB after a tenth, {last:.1f} MB at the end "
          f"(+{last - early:.1f} MB), {len(samples)} samples")
    return {"hits": counted, "rss_mb_early": early, "rss_mb_end": last, "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20000, help="hits of the shorter emulated run")
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--hits", type=int, default=0, help="--scale: timed hits per run (default 200000); --memory: 10 M")
    ap.add_argument("--json")
    args = ap.parse_args()
    print(hotpath.implementation())
    out: dict[str, object] = {"hot_path": hotpath.implementation()}
    if args.scale:
        out["scale"] = scale(args.hits or 200_000, args.repeat)
    elif args.memory:
        out["memory"] = memory(args.hits or 10_000_000)
    else:
        print(f"{'design':<11} {'workload':<15} {'emulated/s':>12} {'native/s':>12}  fraction (target {TARGET})")
        out["rates"] = rates(args.repeat, args.iterations)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
