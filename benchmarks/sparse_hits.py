"""Per-hit cost of a probe in real-looking code against the same probe in a tight loop.

    python3 benchmarks/sparse_hits.py [--functions N] [--rounds R] [--repeat K] [--designs D,...]
                                      [--kinds uprobe,uretprobe,usdt] [--verify] [--json FILE]

A generated static binary holds N small functions (a NOP site and ``ret``: nop5 for the designs
that optimize nop5, nop10 for nop10) called through a function-pointer table. The probe is a
uprobe on the first function's site, a uretprobe on it, or (``usdt``) a USDT probe with a
semaphore that the first function tests before its site (fixtures/usdt.h). ``sparse`` mode
calls every function once a round for R rounds; ``tight`` mode calls the first function R times,
which is what `uprobe-emu bench` measures. Each mode runs unprobed and with a uprobe on the first
function (R hits either way), in the same process, alternating, and the per-hit cost is

    (CPU time probed - CPU time unprobed) / hits

(median of K pairs). With --verify the unprobed run has the verifiers on too: what they cost on
code no probe touches (their write hook sees every store of the run, hit or not) is a figure of
its own, the "watch" column (unprobed sparse run, verified / plain), not a cost of the hits.
A hit that slows the unprobed code around it (a flushed translation, a forced exit from the
emulator's loop) shows up as a sparse cost above the tight one; the ratio sparse/tight is the
figure to watch. No assertions: the numbers go into the README.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_hits import cpu_seconds  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NOP5 = "0x0f,0x1f,0x44,0x00,0x00"
NOP10 = "0x66,0x2e,0x0f,0x1f,0x84,0x00,0x00,0x00,0x00,0x00"
SITE_OF_DESIGN = {"int3": NOP5, "linux-6.18": NOP5, "jmp-slots": NOP5, "nop10": NOP10}
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


@dataclass(frozen=True, slots=True)
class Row:
    design: str
    kind: str
    verify: bool
    tight_us: float  # per-hit cost in the tight loop
    sparse_us: float  # per-hit cost with the other functions' calls between hits
    watch: float  # the unprobed sparse run's CPU time with the verifiers on, over without (1.0: off)

    @property
    def ratio(self) -> float:
        return self.sparse_us / self.tight_us if self.tight_us > 0 else float("inf")


def per_hit_us(binary: str, design: str, mode: str, rounds: int, repeat: int, probe: str, verify: bool) -> float:
    costs = []
    for _ in range(repeat):
        argv = [binary, mode, str(rounds)]
        unprobed = cpu_seconds(argv, design, None, verify)
        probed = cpu_seconds(argv, design, probe, verify)
        costs.append((probed - unprobed) / rounds * 1e6)
    return statistics.median(costs)


def watch_cost(binary: str, design: str, rounds: int, repeat: int) -> float:
    """The verifiers' cost on the unprobed sparse run, as a ratio (median of ``repeat`` pairs)."""
    argv = [binary, "sparse", str(rounds)]
    return statistics.median(cpu_seconds(argv, design, None, True) / cpu_seconds(argv, design, None, False)
                             for _ in range(repeat))


def measure(design: str, kind: str, functions: int, rounds: int, repeat: int, verify: bool, workdir: str) -> Row:
    binary = build(functions, SITE_OF_DESIGN[design], kind, workdir)
    probe = SPEC_OF_KIND[kind]
    return Row(design, kind, verify,
               tight_us=per_hit_us(binary, design, "tight", rounds, repeat, probe, verify),
               sparse_us=per_hit_us(binary, design, "sparse", rounds, repeat, probe, verify),
               watch=watch_cost(binary, design, rounds, repeat) if verify else 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--functions", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--designs", default=",".join(SITE_OF_DESIGN))
    ap.add_argument("--kinds", default="uprobe", help=f"probe kinds, of {','.join(SPEC_OF_KIND)}")
    ap.add_argument("--verify", action="store_true", help="also every row with the verifiers on")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(f"{'design':<12} {'probe':<10} {'verifiers':<10} {'tight us/hit':>13} {'sparse us/hit':>14} {'sparse/tight':>13}"
          f" {'watch':>7}")
    with tempfile.TemporaryDirectory() as workdir:
        for design in args.designs.split(","):
            for kind in args.kinds.split(","):
                for verify in (False, True) if args.verify else (False,):
                    row = measure(design, kind, args.functions, args.rounds, args.repeat, verify, workdir)
                    rows.append(row)
                    print(f"{row.design:<12} {kind:<10} {'on' if verify else 'off':<10} {row.tight_us:>13.2f}"
                          f" {row.sparse_us:>14.2f} {row.ratio:>12.2f}x {row.watch:>6.2f}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) | {"ratio": r.ratio} for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
