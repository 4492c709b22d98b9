"""Whole real programs: native, under qemu-user, under `uprobe-emu run` and `run --verify`, in one run.

    python3 benchmarks/real_programs.py [--reps N] [--only NAME,...] [--probe SPEC] [--json FILE]

Each command is a Debian program as a user would run it (python3.11, sort, gzip, sha256sum, awk, grep, a
bash pipeline, xz with two threads at work on two blocks) plus elf_samples/store_loop, a libc-free loop
of two stack stores an iteration. Every command runs --reps times in each mode, the modes interleaved
(A B C D D C B A ...), after one untimed warm-up run of each; the table gives the best wall time of
each and the ratios the targets are stated in: `run` against qemu-user and `run --verify` against
`run`. Every mode's stdout is checked against the native run's, so a fast wrong answer cannot pass.

The harness runs as users have it: bytecode cached (a private PYTHONPYCACHEPREFIX, warmed by the
warm-up run; this machine's PYTHONDONTWRITEBYTECODE=1 would recompile every module at each start).
Every side runs with the same small environment (PATH, LANG=C); the emulated guest gets it through
--clear-env --env. --probe SPEC adds a column: `run --verify ... -p SPEC`, a verified run with a probe
that the program hits. qemu-user must be installed (apt-get install qemu-user); without it that
column is empty. No assertions: the numbers go into the README and the issue notes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STORE_LOOP = str(REPO / "elf_samples" / "store_loop")
GUEST_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C"}
VERIFY = "redzone,regs,resume,memory"

PYTHON_SCRIPT = """\
import collections, json, re
words = re.findall(r"[a-z]+", "the quick brown fox jumps over the lazy dog " * 200)
total = 0
for i in range(300000):
    total += i
print(total, len(json.dumps(collections.Counter(words))))
"""


@dataclass(frozen=True)
class Command:
    name: str
    argv: tuple[str, ...]


COMMANDS = (
    Command("python3.11 script", ("/usr/bin/python3.11", "-c", PYTHON_SCRIPT)),
    Command("sort -r /etc/services", ("/usr/bin/sort", "-r", "/etc/services")),
    Command("gzip -c python3.11", ("/usr/bin/gzip", "-c", "/usr/bin/python3.11")),
    Command("sha256sum python3.11", ("/usr/bin/sha256sum", "/usr/bin/python3.11")),
    Command("awk loop", ("/usr/bin/awk", "BEGIN { for (i = 0; i < 300000; i++) s += i % 7; print s }")),
    Command("grep -c libc.so.6", ("/usr/bin/grep", "-a", "-c", "GLIBC", "/usr/lib/x86_64-linux-gnu/libc.so.6")),
    Command("bash pipeline", ("/bin/bash", "-c", "seq 1 20000 | sort -rn | head -3 | tr '\\n' ' '")),
    Command("xz -T2 libc.so.6", ("/usr/bin/xz", "-T2", "-1", "--block-size=1MiB", "-c", "/usr/lib/x86_64-linux-gnu/libc.so.6")),
    Command("store_loop (no libc)", (STORE_LOOP,)),
)


def harness_env(cache_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache_dir
    return env


def modes(cmd: Command, probe: str | None) -> dict[str, list[str]]:
    """The command line of each mode (a mode that cannot run here is left out)."""
    emu = [sys.executable, "-m", "emu", "run", "--clear-env"] + [f"--env={k}={v}" for k, v in GUEST_ENV.items()]
    out = {"native": list(cmd.argv)}
    qemu = shutil.which("qemu-x86_64")
    if qemu is not None:
        out["qemu-user"] = [qemu, *cmd.argv]
    out["run"] = emu + list(cmd.argv)
    out["run --verify"] = emu + [f"--verify={VERIFY}"] + list(cmd.argv)
    if probe is not None:
        out["verify -p"] = emu + [f"--verify={VERIFY}", "-p", probe] + list(cmd.argv)
    return out


def wall(argv: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:6]} exited {proc.returncode}: {proc.stderr[-400:]!r}")
    return elapsed, proc.stdout


def measure(cmd: Command, reps: int, probe: str | None, cache_dir: str) -> dict[str, list[float]]:
    """Best-of material: ``reps`` wall times per mode, interleaved; stdout checked against native."""
    lines = modes(cmd, probe)
    envs = {mode: (harness_env(cache_dir) if mode not in ("native", "qemu-user") else dict(GUEST_ENV)) for mode in lines}
    expected = wall(lines["native"], envs["native"])[1]
    for mode, argv in lines.items():  # warm-up: page cache, bytecode cache; checks every mode's output
        out = wall(argv, envs[mode])[1]
        if out != expected:
            raise RuntimeError(f"{cmd.name}: {mode} printed {out[:120]!r}, natively {expected[:120]!r}")
    samples: dict[str, list[float]] = {mode: [] for mode in lines}
    for i in range(reps):
        order = list(lines) if i % 2 == 0 else list(reversed(lines))
        for mode in order:
            samples[mode].append(wall(lines[mode], envs[mode])[0])
    return samples


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def fmt(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.3f}{suffix}" if suffix == " s" else f"{value:.2f}{suffix}"


def table(results: dict[str, dict[str, list[float]]], probe: str | None) -> str:
    cols = ["native", "qemu-user", "run", "run --verify"] + (["verify -p"] if probe else [])
    head = f"{'command':<24}" + "".join(f"{c:>14}" for c in cols) + f"{'run/qemu':>10}{'verify/run':>12}"
    if probe:
        head += f"{'verify -p/run':>15}"
    lines = [head]
    run_qemu: list[float] = []
    verify_run: list[float] = []
    probed_run: list[float] = []
    for name, samples in results.items():
        best = {mode: min(times) for mode, times in samples.items()}
        rq, vr, pr = ratio(best.get("run"), best.get("qemu-user")), ratio(best.get("run --verify"), best.get("run")), \
            ratio(best.get("verify -p"), best.get("run"))
        for value, into in ((rq, run_qemu), (vr, verify_run), (pr, probed_run)):
            if value is not None:
                into.append(value)
        row = f"{name:<24}" + "".join(f"{fmt(best.get(c), ' s'):>14}" for c in cols)
        row += f"{fmt(rq, 'x'):>10}{fmt(vr, 'x'):>12}" + (f"{fmt(pr, 'x'):>15}" if probe else "")
        lines.append(row)
    tail = f"{'geometric mean':<24}" + " " * 14 * len(cols) + f"{fmt(geomean(run_qemu), 'x'):>10}"
    tail += f"{fmt(geomean(verify_run), 'x'):>12}" + (f"{fmt(geomean(probed_run), 'x'):>15}" if probe else "")
    lines.append(tail)
    if verify_run:
        lines.append(f"{'worst verify/run':<24}" + " " * (14 * len(cols) + 10) + f"{fmt(max(verify_run), 'x'):>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="timed runs per mode (best of them is shown; default 3)")
    ap.add_argument("--only", help="comma-separated command names (a prefix is enough)")
    ap.add_argument("--probe", help="also time `run --verify ... -p SPEC`")
    ap.add_argument("--json", help="write every sample here")
    args = ap.parse_args(argv)
    chosen = [c for c in COMMANDS if not args.only or any(c.name.startswith(p) for p in args.only.split(","))]
    if not chosen:
        print(f"real_programs: no command matches {args.only!r}", file=sys.stderr)
        return 2
    cache_dir = tempfile.mkdtemp(prefix="real-programs-pyc-")
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for cmd in chosen:
            results[cmd.name] = measure(cmd, args.reps, args.probe, cache_dir)
            print(f"measured {cmd.name}", file=sys.stderr)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print(table(results, args.probe))
    if args.json:
        Path(args.json).write_text(json.dumps({"reps": args.reps, "probe": args.probe, "samples": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
