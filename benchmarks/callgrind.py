"""A child process's instruction count, and if asked its simulated cache misses, from valgrind's callgrind.

CPU times on a shared two-vCPU machine move by several percent from one run to the next; the counts
callgrind takes of the same run repeat to a few thousand instructions. The child runs with a fixed
hash seed (the same dict layouts) and, under ``setarch -R``, at the same addresses every run, so the
simulated caches see the same lines too. Its bytecode is cached beside the profile, and the child runs
once outside valgrind first, so the counted run compiles no module, not even one a hook imports when
it first runs (the environment may say PYTHONDONTWRITEBYTECODE). ``collect=EMULATION`` counts only what runs inside Unicorn's
run loop, the hooks it calls included, which leaves out the interpreter's start-up and the loader.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

EMULATION = "vm_start_x86_64"  # Unicorn's run loop, entered once per uc_emu_start
CACHE_EVENTS = ("I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")  # what --cache-sim=yes adds


def require(script: str) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit(f"{script}: valgrind is not installed")


def profile(argv: list[str], out: Path, *, collect: str | None = None, cache_sim: bool = False) -> dict[str, int]:
    """Run ``argv`` under callgrind, its profile written to ``out``; the totals, by event (``Ir``: instructions)."""
    cmd = ["setarch", platform.machine(), "-R", "valgrind", "--tool=callgrind", "--smc-check=all",
           f"--callgrind-out-file={out}"]
    if collect:
        cmd.append(f"--toggle-collect={collect}")
    if cache_sim:
        cmd.append("--cache-sim=yes")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env |= {"PYTHONHASHSEED": "0", "PYTHONPYCACHEPREFIX": str(out.parent / "pycache")}
    subprocess.run(argv, capture_output=True, env=env, check=False)  # compiles what this run imports, lazily too
    run = subprocess.run(cmd + argv, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"callgrind run of {argv} failed ({run.returncode}): {run.stderr[-800:]}")
    return totals(out.read_text())


def totals(profile_text: str) -> dict[str, int]:
    """The ``events:`` line's names against the ``totals:`` (or ``summary:``) line's numbers."""
    events = re.search(r"^events: (.+)$", profile_text, re.M)
    summed = re.search(r"^totals: (.+)$", profile_text, re.M) or re.search(r"^summary: (.+)$", profile_text, re.M)
    if events is None or summed is None:
        raise ValueError("not a callgrind profile: no events or totals line")
    return dict(zip(events.group(1).split(), map(int, summed.group(1).split()), strict=True))


def inclusive(out: Path, functions: tuple[str, ...]) -> dict[str, int]:
    """Instructions in each of ``functions`` and all it calls, summed over the profile's call sites."""
    listing = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
                             capture_output=True, text=True, check=True).stdout
    found: dict[str, int] = {}
    for line in listing.splitlines():
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+\S*:(\w+) ", line)
        if m and m.group(2) in functions:
            found[m.group(2)] = found.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return found
