"""Run-wide limits: tasks (RLIMIT_NPROC: fork/clone get EAGAIN), guest memory (mmap/brk/fork get ENOMEM),
and the run's budget of time and instructions over every process and thread (--timeout, --max-insns)."""

from __future__ import annotations

import argparse
import errno
import struct
from pathlib import Path

import pytest
from conftest import GuestKernel, run_emulated

from emu import abi
from emu.commands.common import size_arg
from emu.errors import EXIT_INSN_LIMIT, EXIT_TIMEOUT
from emu.kernel import limits, state

RLIMIT_NPROC = 6
THREAD = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000  # CLONE_VM FS FILES SIGHAND THREAD SYSVSEM
MAP_ANON_PRIVATE = abi.MAP_PRIVATE | abi.MAP_ANONYMOUS
PROT_RW = abi.Prot.READ | abi.Prot.WRITE
MIB = 1 << 20


def _set_nproc(g: GuestKernel, n: int) -> None:
    assert g("prlimit64", 0, RLIMIT_NPROC, g.alloc(16, struct.pack("<QQ", n, n)), 0) == 0


def test_clone_and_fork_past_rlimit_nproc_are_eagain() -> None:
    g = GuestKernel()
    _set_nproc(g, 2)
    stack = g.alloc(4096) + 4096
    assert g("clone", THREAD, stack, 0, 0, 0) > 0  # the second task fits
    assert g("clone", THREAD, stack, 0, 0, 0) == -errno.EAGAIN
    assert g("fork") == -errno.EAGAIN


def test_mmap_and_brk_past_the_memory_limit_are_enomem() -> None:
    probe = GuestKernel()
    in_use = limits.memory_in_use(probe.kernel)
    g = GuestKernel(memory_limit=in_use + 16 * MIB)
    assert g("mmap", 0, 8 * MIB, PROT_RW, MAP_ANON_PRIVATE, -1, 0) > 0
    assert g("mmap", 0, 16 * MIB, PROT_RW, MAP_ANON_PRIVATE, -1, 0) == -errno.ENOMEM
    brk = g("brk", 0)
    assert g("brk", brk + 4 * MIB) == brk + 4 * MIB
    assert g("brk", brk + 64 * MIB) == brk + 4 * MIB  # a refused brk returns the old break
    unlimited = GuestKernel(memory_limit=None)
    assert unlimited("mmap", 0, 64 * MIB, PROT_RW, MAP_ANON_PRIVATE, -1, 0) > 0


def test_default_memory_limit_is_a_fraction_of_the_hosts_ram(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree: 1 kB\n")
    assert state.default_memory_limit(str(meminfo)) == 16000000 * 1024 // 8
    assert state.default_memory_limit(str(tmp_path / "missing")) == state.FALLBACK_LIMIT


FORK_UNTIL_REFUSED = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NPROC, (int(sys.argv[1]), int(sys.argv[1])))
r, w = os.pipe()
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print(n, 'children, then', e.strerror); break
    if pid == 0:
        os.close(w); os.read(r, 1); os._exit(0)
    n += 1
os.close(w)
while True:
    try: os.wait()
    except ChildProcessError: break
"""


def test_a_fork_loop_ends_with_eagain_inside_the_guest() -> None:
    out = run_emulated(["/usr/bin/python3.11", "-c", FORK_UNTIL_REFUSED, "6"])
    assert (out.out, out.status) == (b"5 children, then Resource temporarily unavailable\n", 0), out.err


THREADS_UNTIL_REFUSED = """
import threading
stop = threading.Event(); n = 0
try:
    while True:
        threading.Thread(target=stop.wait).start(); n += 1
except RuntimeError as e:
    print(n > 0, e)
stop.set()
"""


def test_a_thread_loop_ends_with_enomem_inside_the_guest() -> None:
    out = run_emulated(["/usr/bin/python3.11", "-c", THREADS_UNTIL_REFUSED], memory_limit=256 * MIB)
    assert (out.out, out.status) == (b"True can't start new thread\n", 0), out.err


def test_memory_limit_sizes() -> None:
    assert size_arg("512M") == 512 * MIB and size_arg("2GiB") == 2 << 30 and size_arg("4096") == 4096
    assert size_arg("none") == 0  # no cap
    for bad in ("0", "12X", "", "-1G"):
        with pytest.raises(argparse.ArgumentTypeError):
            size_arg(bad)


# ----------------------------------------------- --timeout and --max-insns bound the whole run
BOMBS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "bombs")


def _cli(*argv: str, timeout: float = 60) -> tuple[int, float, dict[str, object]]:
    """`uprobe-emu run ...` as a user runs it: (exit status, seconds, its --json)."""
    import json
    import subprocess
    import sys
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "run.json"
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "emu", "run", "--json", str(report), *argv],
                              capture_output=True, timeout=timeout)
        elapsed = time.monotonic() - start
        return proc.returncode, elapsed, json.loads(report.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fork", "thread"])
def test_a_bomb_ends_at_the_timeout(mode: str) -> None:
    """Every process and thread of the run shares the one deadline: a fork bomb is stopped, not each
    of its processes given a timeout of its own."""
    status, elapsed, report = _cli("--timeout", "2", BOMBS, mode)
    assert (status, report["ending"]) == (EXIT_TIMEOUT, "timeout")
    assert elapsed < 2 + 8  # start-up, and the last slice of the process that saw the deadline


def test_a_child_s_instructions_count_against_max_insns() -> None:
    """The parent waits while its child spins: only the child runs, and the run still stops."""
    outcome = run_emulated([BOMBS, "spin"], {}, max_insns=2_000_000, timeout_s=60)
    assert outcome.status == EXIT_INSN_LIMIT


def test_a_child_runs_to_the_run_s_deadline_not_its_own() -> None:
    import time

    start = time.monotonic()
    outcome = run_emulated([BOMBS, "spin"], {}, timeout_s=1)
    assert outcome.status == EXIT_TIMEOUT
    assert time.monotonic() - start < 1 + 8


# ----------------------------------------------- check says which limit stopped which of its runs
CPU_BOUND = str(Path(__file__).resolve().parent.parent / "elf_samples" / "cpu_bound")


def test_check_stopped_by_a_limit_says_so_and_exits_with_its_status(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from emu.cli import main

    report = tmp_path / "check.json"
    status = main(["check", "--kernel", "int3,linux-6.18", "--max-insns", "20000", "--json", str(report),
                   "-p", "uprobe:main", CPU_BOUND])
    out = capsys.readouterr().out
    assert status == EXIT_INSN_LIMIT
    assert "unprobed run: stopped after 20000 instructions (--max-insns 20000)" in out
    data = json.loads(report.read_text())
    assert data["limit"] == "insn-limit" and data["reference"]["ending"] == "insn-limit"
    assert {d["ending"] for d in data["designs"].values()} == {"insn-limit"}
    assert main(["check", "--kernel", "int3", "--json", str(report), "-p", "uprobe:main", CPU_BOUND]) == 0
    data = json.loads(report.read_text())
    assert (data["limit"], data["reference"]["ending"], data["designs"]["int3"]["ending"]) == (None, "exited", "exited")


def test_a_corpus_run_its_timeout_stopped_is_not_a_verdict(tmp_path: Path) -> None:
    import hashlib

    from emu.designs import DESIGNS
    from emu.survey.corpus import load_corpus
    from emu.survey.dynamic import run_entry

    corpus = tmp_path / "c.toml"
    corpus.write_text(f'[[run]]\nbinary = "{BOMBS}"\nargs = ["spin"]\nprobes = ["uprobe:main"]\ntimeout = 0.5\n')
    (entry,) = load_corpus(str(corpus))
    sha = hashlib.sha256(Path(BOMBS).read_bytes()).hexdigest()
    [run] = run_entry(entry, sha, [DESIGNS["int3"]], None)
    assert (run.status, run.error) == ("timeout", "stopped after 0.5 s (--timeout)")
