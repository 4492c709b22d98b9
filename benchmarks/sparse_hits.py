"""Per-hit cost of a probe in real-looking code against the same probe in a tight loop.

    python3 benchmarks/sparse_hits.py [--functions N] [--rounds R] [--repeat K] [--designs D,...]
                                      [--kinds uprobe,uretprobe,usdt] [--verify]
                                      [--instructions [--cache-sim]] [--same-pages] [--json FILE]

A generated static binary holds N small functions (a NOP site and ``ret``: nop5 for the designs
that optimize nop5, nop10 for nop10) called through a function-pointer table. The probe is a
uprobe on the first function's site, a uretprobe on it, or (``usdt``) a USDT probe with a
semaphore that the first function tests before its site (fixtures/usdt.h). ``sparse`` mode
calls every function once a round for R rounds; ``tight`` mode calls the first function R times,
which is what `uprobe-emu bench` measures. Each mode runs unprobed and probed (R hits), and the
per-hit cost is

    (cost probed - cost unprobed) / hits

The cost is CPU time by default: the two runs alternate in this process, and a figure is the median
of K pairs. With --instructions it is the instructions callgrind counts inside the emulation (hooks
included), from runs of 20 and 20 + R rounds (R: 200 by default), so start-up and the first hit's
work cancel; two processes' counts of one row differ by tens of instructions a hit, where a CPU time
on a shared machine moves by more than a sparse hit costs. --cache-sim adds the simulated cache misses per hit (first
level instruction, first level data, last level), the part of a hit's cost that instruction counts
miss: code between hits evicts the lines the hit's path needs.

With --verify the unprobed run has the verifiers on too: what they cost on code no probe touches
(their write hook sees every store of the run, hit or not) is a figure of its own, the "watch"
column (unprobed sparse run, verified / plain), not a cost of the hits. A hit that slows the
unprobed code around it (a flushed translation, a forced exit from the emulator's loop, a jump
target evicted from Unicorn's jump cache) shows up as a sparse cost above the tight one; the ratio
sparse/tight is the figure to watch. A design that maps a page at its first hit (a trampoline) makes
the probed run's address space differ from the unprobed one's, and with the verifiers on every access
of the run pays for the lookup of a map with that page in it; --same-pages maps the probed run's new
pages in the unprobed runs too, so a row charges the hits and not the page. No assertions: the
numbers go into the README.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import callgrind  # noqa: E402
from probe_hits import cpu_seconds  # noqa: E402

from emu.abi import Prot  # noqa: E402
from emu.guestio import GuestIO  # noqa: E402
from emu.machine import Machine, RunOptions  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NOP5 = "0x0f,0x1f,0x44,0x00,0x00"
NOP10 = "0x66,0x2e,0x0f,0x1f,0x84,0x00,0x00,0x00,0x00,0x00"
SITE_OF_DESIGN = {"int3": NOP5, "uretprobe-rfc": NOP5, "linux-6.18": NOP5, "jmp-slots": NOP5, "nop10": NOP10}
USDT_SITE = {NOP5: "USDT_SITE_NOP1_NOP5", NOP10: "USDT_SITE_NOP1_NOP10"}
SPEC_OF_KIND = {"uprobe": "uprobe:f0", "uretprobe": "uretprobe:f0", "usdt": "usdt:bench:hit"}


def _asm_function(index: int, site: str) -> str:
    return f'__asm__(".text\\n.globl f{index}\\n.type f{index},@function\\nf{index}: .byte {site}\\nret\\n");\n'


def _usdt_function(site: str) -> str:
    """f0 as USDT code is written: test the semaphore, then the probe site."""
    return (f"USDT_DEFINE_SEMAPHORE(bench, hit);\n__attribute__((noinline)) void f0(void)\n"
            f'{{ if (USDT_ENABLED(bench, hit)) _USDT_PROBE({USDT_SITE[site]}, "bench_hit_semaphore", bench, hit); }}\n')


def program_source(functions: int, site: str, kind: str = "uprobe") -> str:
    """C for N functions ``site; ret`` (f0 a USDT probe for ``usdt``) and a main that calls them
    through a table."""
    first = _usdt_function(site) if kind == "usdt" else _asm_function(0, site)
    bodies = first + "".join(_asm_function(i, site) for i in range(1, functions))
    declarations = "".join(f"void f{i}(void);\n" for i in range(functions))
    table = ",".join(f"f{i}" for i in range(functions))
    return f"""#include <stdlib.h>
#include <string.h>
#include "usdt.h"
{declarations}{bodies}
static void (*const table[])(void) = {{{table}}};
int main(int argc, char **argv)
{{
    long rounds = argc > 2 ? atol(argv[2]) : 1;
    int sparse = argc > 1 && strcmp(argv[1], "sparse") == 0;
    for (long r = 0; r < rounds; r++) {{
        if (!sparse) {{ table[0](); continue; }}
        for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++)
            table[i]();
    }}
    return 0;
}}
"""


@functools.cache
def build(functions: int, site: str, kind: str, workdir: str) -> str:
    source = Path(workdir) / f"sparse_{functions}_{len(site)}_{kind}.c"
    binary = source.with_suffix("")
    source.write_text(program_source(functions, site, kind))
    subprocess.run(["gcc", "-O1", "-static", f"-I{FIXTURES}", "-o", str(binary), str(source)], check=True)
    return str(binary)


def extra_pages(binary: str, design: str, probe: str) -> str:
    """The mappings a probed run ends with that an unprobed one lacks (a design's trampoline page), as
    ``start,size,prot`` items joined by ``;``: with --same-pages the unprobed run maps them too."""
    def mappings(spec: str | None) -> list[tuple[int, int, int]]:
        m = Machine(binary, [binary, "tight", "2"], {}, RunOptions(design=design), GuestIO.captured())
        if spec:
            m.attach(spec)
        assert m.run().exit_status == 0
        return [(vma.start, vma.end - vma.start, int(vma.prot)) for vma in m.mem.overlapping(0, 1 << 64)]

    unprobed = mappings(None)
    new = [(start, size, prot) for start, size, prot in mappings(probe)
           if not any(start < s + n and s < start + size for s, n, _ in unprobed)]
    return ";".join(f"{start:#x},{size:#x},{prot}" for start, size, prot in new)


def map_pages(pages: str) -> Callable[[Machine], object] | None:
    """What the unprobed child does before it runs: map ``pages`` (extra_pages' form)."""
    if not pages:
        return None
    items = [tuple(int(field, 0) for field in item.split(",")) for item in pages.split(";")]
    return lambda m: [m.mem.map(start, size, Prot(prot), name="[probed run's page]") for start, size, prot in items]


COST = "cost"  # the per-hit figure's key: CPU microseconds, or instructions with --instructions
MISSES = {"I1 misses": ("I1mr",), "D1 misses": ("D1mr", "D1mw"), "LL misses": ("ILmr", "DLmr", "DLmw")}


@dataclass(frozen=True, slots=True)
class Row:
    design: str
    kind: str
    verify: bool
    unit: str  # "us" (CPU time) or "instructions" (callgrind)
    tight: float  # per-hit cost in the tight loop
    sparse: float  # per-hit cost with the other functions' calls between hits
    watch: float  # the unprobed sparse run with the verifiers on, over without (1.0: off)
    misses: dict[str, tuple[float, float]]  # --cache-sim: simulated cache misses per hit, (tight, sparse)
    pages: str = ""  # --same-pages: what the unprobed runs mapped too (extra_pages' form)

    @property
    def ratio(self) -> float:
        return self.sparse / self.tight if self.tight > 0 else float("inf")


class Timed:
    """Per-hit cost in CPU microseconds: the median of ``repeat`` unprobed/probed pairs of ``rounds`` rounds."""

    unit = "us"

    def __init__(self, rounds: int, repeat: int) -> None:
        self.rounds, self.repeat = rounds, repeat

    def per_hit(self, binary: str, design: str, mode: str, probe: str, verify: bool, pages: str) -> dict[str, float]:
        argv = [binary, mode, str(self.rounds)]
        costs = [(cpu_seconds(argv, design, probe, verify) - cpu_seconds(argv, design, None, verify, map_pages(pages)))
                 / self.rounds * 1e6 for _ in range(self.repeat)]
        return {COST: statistics.median(costs)}

    def watch(self, binary: str, design: str) -> float:
        argv = [binary, "sparse", str(self.rounds)]
        return statistics.median(cpu_seconds(argv, design, None, True) / cpu_seconds(argv, design, None, False)
                                 for _ in range(self.repeat))


class Counted:
    """Per-hit cost in instructions, counted by callgrind inside the emulation (hooks included). Each
    figure comes from runs of FIRST and FIRST + ``rounds`` rounds, so translating the program and the
    first hit's work (attaching, optimizing the site) cancel out."""

    unit = "instructions"
    FIRST = 20

    def __init__(self, rounds: int, cache_sim: bool, workdir: str) -> None:
        self.rounds, self.cache_sim, self.workdir = rounds, cache_sim, Path(workdir)
        self._runs: dict[tuple[str, ...], dict[str, int]] = {}

    def _run(self, binary: str, design: str, mode: str, rounds: int, probe: str, verify: bool,
             pages: str = "") -> dict[str, int]:
        key = (binary, design, mode, str(rounds), probe, str(verify), pages)
        if key not in self._runs:
            argv = [sys.executable, __file__, "--child", *key]
            out = self.workdir / f"callgrind.{len(self._runs)}.out"
            self._runs[key] = callgrind.profile(argv, out, collect=callgrind.EMULATION, cache_sim=self.cache_sim)
        return self._runs[key]

    def _per_round(self, binary: str, design: str, mode: str, probe: str, verify: bool,
                   pages: str = "") -> dict[str, float]:
        first, last = (self._run(binary, design, mode, n, probe, verify, pages)
                       for n in (self.FIRST, self.FIRST + self.rounds))
        return {event: (last[event] - first[event]) / self.rounds for event in last}

    def per_hit(self, binary: str, design: str, mode: str, probe: str, verify: bool, pages: str) -> dict[str, float]:
        probed = self._per_round(binary, design, mode, probe, verify)
        unprobed = self._per_round(binary, design, mode, "", verify, pages)
        per_hit = {event: probed[event] - unprobed[event] for event in probed}
        return {COST: per_hit.pop("Ir"), **per_hit}

    def watch(self, binary: str, design: str) -> float:
        verified, plain = (self._per_round(binary, design, "sparse", "", v)["Ir"] for v in (True, False))
        return verified / plain


def measure(meter: Timed | Counted, design: str, kind: str, functions: int, verify: bool, same_pages: bool,
            workdir: str) -> Row:
    binary = build(functions, SITE_OF_DESIGN[design], kind, workdir)
    probe = SPEC_OF_KIND[kind]
    pages = extra_pages(binary, design, probe) if same_pages else ""
    tight, sparse = (meter.per_hit(binary, design, mode, probe, verify, pages) for mode in ("tight", "sparse"))
    misses = {name: (sum(tight.get(e, 0.0) for e in events), sum(sparse.get(e, 0.0) for e in events))
              for name, events in MISSES.items() if events[0] in tight}
    return Row(design, kind, verify, meter.unit, tight[COST], sparse[COST],
               meter.watch(binary, design) if verify else 1.0, misses, pages)


def _child(binary: str, design: str, mode: str, rounds: str, probe: str, verify: str, pages: str) -> None:
    cpu_seconds([binary, mode, rounds], design, probe or None, verify == "True", map_pages(pages))


def _line(row: Row) -> str:
    precision = 0 if row.unit == "instructions" else 2
    cells = [f"{row.design:<12} {row.kind:<10} {'on' if row.verify else 'off':<10}",
             f"{row.tight:>13,.{precision}f} {row.sparse:>14,.{precision}f} {row.ratio:>12.2f}x {row.watch:>6.2f}x"]
    cells += [f"{t:>8,.0f} / {s:<8,.0f}" for t, s in row.misses.values()]
    return " ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--functions", type=int, default=1000)
    ap.add_argument("--rounds", type=int, help="rounds a run (default 2000); with --instructions, the rounds the"
                                               f" long run adds to the short run's {Counted.FIRST} (default 200)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--designs", default=",".join(SITE_OF_DESIGN))
    ap.add_argument("--kinds", default="uprobe", help=f"probe kinds, of {','.join(SPEC_OF_KIND)}")
    ap.add_argument("--verify", action="store_true", help="also every row with the verifiers on")
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind, not CPU time")
    ap.add_argument("--cache-sim", action="store_true", help="with --instructions: simulated cache misses per hit too")
    ap.add_argument("--json")
    ap.add_argument("--same-pages", action="store_true",
                    help="the unprobed run maps the pages the probed one's design maps (its trampoline page)")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    if args.instructions:
        callgrind.require("sparse_hits")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        meter = (Counted(args.rounds or 200, args.cache_sim, workdir) if args.instructions
                 else Timed(args.rounds or 2000, args.repeat))
        print(f"{'design':<12} {'probe':<10} {'verifiers':<10} {'tight ' + meter.unit:>13} {'sparse':>14}"
              f" {'sparse/tight':>13} {'watch':>7}" + "".join(f" {name + ' t/s':>19}" for name in MISSES
                                                             if args.cache_sim and args.instructions))
        for design in args.designs.split(","):
            for kind in args.kinds.split(","):
                for verify in (False, True) if args.verify else (False,):
                    rows.append(measure(meter, design, kind, args.functions, verify, args.same_pages, workdir))
                    print(_line(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) | {"ratio": r.ratio} for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
