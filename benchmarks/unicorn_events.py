"""What a probe hit makes Unicorn do, counted by the kernel's uprobes on Unicorn itself (no assertions).

    sudo python3 benchmarks/unicorn_events.py [--functions N] [--rounds R] [--designs D,...] [--json FILE]

benchmarks/sparse_hits.py finds a hit dearer in code that runs other code between hits ("sparse")
than in a loop that calls only the probed function ("tight"). This counts, in the same two programs,
the Unicorn events that could make it so: block translations (tb_gen_code), invalidations
(tb_phys_invalidate, tb_invalidate_phys_page_fast), flushes (tb_flush, tlb_flush, tlb_flush_page),
emulator loop entries (cpu_exec: an exit and a restart), jump-cache misses (tb_htable_lookup: a
jump target the 4096-entry jump cache did not hold) and stores that took the slow path for pages
that hold translated code (notdirty_write). Each run goes under `perf stat` with a uprobe on each of
those functions of libunicorn; per hit is (probed - unprobed) / rounds, the probe a uprobe on f0.
Needs root and perf; the probes are removed at the end.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import unicorn
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_hits import cpu_seconds  # noqa: E402
from sparse_hits import SITE_OF_DESIGN, build  # noqa: E402

GROUP = "uprobe_emu_bench"
EVENTS = {  # event name -> libunicorn's function
    "translate": "tb_gen_code_x86_64",
    "invalidate": "tb_phys_invalidate_x86_64",
    "invalidate_page": "tb_invalidate_phys_page_fast_x86_64",
    "tb_flush": "tb_flush_x86_64",
    "tlb_flush": "tlb_flush_x86_64",
    "tlb_flush_page": "tlb_flush_page_x86_64",
    "cpu_exec": "cpu_exec_x86_64",
    "jump_cache_miss": "tb_htable_lookup_x86_64",
    "notdirty_store": "notdirty_write.isra.0",
}


def libunicorn() -> str:
    found = glob.glob(os.path.join(os.path.dirname(unicorn.__file__), "lib", "libunicorn.so*"))
    if not found:
        raise SystemExit("unicorn_events.py: libunicorn.so not found beside the unicorn package")
    return found[0]


NEAR = "tlb_set_page_with_attrs_x86_64"  # a static function of cputlb.c has a copy per target: the x86 one is near


def addresses(lib: str) -> dict[str, int]:
    """Each function of EVENTS by its address in libunicorn's symbol table. By address, not by name:
    perf would probe a function's PLT stub too, and count each call through it twice."""
    with open(lib, "rb") as f:
        table = ELFFile(f).get_section_by_name(".symtab")
        if not isinstance(table, SymbolTableSection):
            raise SystemExit(f"unicorn_events.py: {lib} has no symbol table")
        symbols = [(s.name, s["st_value"]) for s in table.iter_symbols()
                   if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]]
    near = next(value for name, value in symbols if name == NEAR)
    found = {}
    for event, function in EVENTS.items():
        copies = [value for name, value in symbols if name == function]
        if copies:
            found[event] = min(copies, key=lambda value: abs(value - near))
    return found


def add_probes(lib: str) -> list[str]:
    """A uprobe on each function of EVENTS that libunicorn has; the event names."""
    added = []
    for name, address in addresses(lib).items():
        proc = subprocess.run(["perf", "probe", "-q", "-x", lib, "-a", f"{GROUP}:{name}={address:#x}"],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            added.append(name)
        else:
            print(f"unicorn_events.py: no probe on {EVENTS[name]}: {proc.stderr.strip()}", file=sys.stderr)
    return added


def remove_probes() -> None:
    subprocess.run(["perf", "probe", "-q", "-d", f"{GROUP}:*"], capture_output=True)


def counts(binary: str, design: str, mode: str, rounds: int, probe: str | None, events: list[str]) -> dict[str, int]:
    """Each event's count over one emulated run (a child process)."""
    child = [sys.executable, __file__, "--child", binary, design, mode, str(rounds), probe or "-"]
    argv = ["perf", "stat", "-x,", *[a for e in events for a in ("-e", f"{GROUP}:{e}")], "--", *child]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    out: dict[str, int] = {}
    for line in proc.stderr.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2].startswith(f"{GROUP}:"):
            out[fields[2].split(":", 1)[1]] = int(fields[0]) if fields[0].isdigit() else 0
    return out


def run_child(binary: str, design: str, mode: str, rounds: str, probe: str) -> None:
    cpu_seconds([binary, mode, rounds], design, None if probe == "-" else probe, False)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run_child(*sys.argv[2:7])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--functions", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--designs", default="int3,linux-6.18,jmp-slots,nop10")
    ap.add_argument("--json")
    args = ap.parse_args()
    lib = libunicorn()
    remove_probes()
    rows = []
    try:
        events = add_probes(lib)
        if not events:
            raise SystemExit("unicorn_events.py: perf could not place any uprobe (root and perf are needed)")
        print(f"{'design':<12} {'mode':<7} " + " ".join(f"{e:>15}" for e in events))
        with tempfile.TemporaryDirectory() as tmp:
            for design in args.designs.split(","):
                binary = build(args.functions, SITE_OF_DESIGN[design], "uprobe", tmp)
                for mode in ("tight", "sparse"):
                    plain = counts(binary, design, mode, args.rounds, None, events)
                    probed = counts(binary, design, mode, args.rounds, "uprobe:f0", events)
                    per_hit = {e: (probed.get(e, 0) - plain.get(e, 0)) / args.rounds for e in events}
                    print(f"{design:<12} {mode:<7} " + " ".join(f"{per_hit[e]:>15.2f}" for e in events), flush=True)
                    rows.append({"design": design, "mode": mode, "per_hit": per_hit, "unprobed": plain})
        calls = args.rounds * args.functions
        sparse = [r for r in rows if r["mode"] == "sparse"]
        if sparse and "jump_cache_miss" in events:
            misses = sparse[0]["unprobed"].get("jump_cache_miss", 0) / calls
            print(f"\nunprobed sparse run: {misses:.2f} jump-cache misses per call ({calls:,} calls)")
    finally:
        remove_probes()
    if args.json:
        Path(args.json).write_text(json.dumps({"functions": args.functions, "rounds": args.rounds, "rows": rows},
                                              indent=2) + "\n")


if __name__ == "__main__":
    main()
