"""Counting-only probe hits: the C hot path (emu/hotpath_src/fastsys.c) and the pure-Python one
(emu/kernel/uprobes/fastpath.py) give the same counts, registers, output and statistics, and the C path
refuses every hit something in Python must see."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emu import hotpath
from emu.designs import DESIGNS, Trampoline
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import NATIVE_PATHS, NATIVE_RETURN, Consumer
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession

ROOT = Path(__file__).resolve().parent.parent
TRIG = str(ROOT / "elf_samples" / "trig")
N = 300
CASES = [  # (design, trig workload, probe)
    ("linux-6.18", "nop5", "uprobe:uprobe_target_nop5"),  # call + syscall 336, SYSRET into the trampoline
    ("jmp-slots", "nop5", "uprobe:uprobe_target_nop5"),  # jmp slot + syscall 336, IRET past the site
    ("nop10", "nop10", "uprobe:uprobe_target_nop10"),  # lea + call + syscall 336
    ("int3", "nop", "uprobe:uprobe_target_nop"),  # INT3 and an emulated nop
    ("linux-6.18", "push", "uprobe:uprobe_target_push"),  # INT3 + emulated push: not a NOP, Python's
    ("linux-6.18", "nop5", "uretprobe:uprobe_target_nop5"),
]
needs_c = pytest.mark.skipif(hotpath.native is None, reason=f"the C hot path is not in use: {hotpath.why_python}")


def _cli_run(tmp_path: Path, design: str, workload: str, spec: str, pure: bool, exe: str = TRIG,
             n: int = N) -> tuple[dict[str, Any], str]:
    out = tmp_path / f"{'py' if pure else 'c'}.json"
    env = {k: v for k, v in os.environ.items() if k != hotpath.FORCE_PYTHON_VARIABLE}
    if pure:
        env[hotpath.FORCE_PYTHON_VARIABLE] = "1"
    proc = subprocess.run([sys.executable, "-m", "emu", "run", "--clear-env", "--kernel", design, "--json", str(out),
                           "-p", spec, exe, workload, str(n)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    del result["wall_s"]
    return result, proc.stdout


@pytest.mark.parametrize("design,workload,spec", CASES)
def test_same_run_with_and_without_the_extension(tmp_path: Path, design: str, workload: str, spec: str) -> None:
    c_result, c_out = _cli_run(tmp_path, design, workload, spec, pure=False)
    py_result, py_out = _cli_run(tmp_path, design, workload, spec, pure=True)
    assert c_result == py_result  # hits, paths, exits, syscall counts, instruction count
    assert c_out == py_out
    (probe,) = c_result["probes"]
    assert probe["hits"] == N


def _machine(design: str, workload: str, spec: str, consumer: Consumer, **options: Any) -> Machine:
    m = Machine(TRIG, [TRIG, workload, str(N)], {}, RunOptions(design=design, **options), GuestIO.captured())
    m.attach(spec, consumer)
    return m


def _native_hits(consumer: Consumer) -> int:
    return sum(consumer.native) if consumer.native is not None else 0


@needs_c
@pytest.mark.parametrize("design,workload,spec", CASES[:4])
def test_counting_consumers_are_counted_in_c(design: str, workload: str, spec: str) -> None:
    consumer = Consumer()
    result = _machine(design, workload, spec, consumer).run()
    assert result.exit_status == 0
    assert consumer.hits == N
    # all but the first, optimizing, INT3 hit (spec 3.3) and the one after it, which finds the tables
    # stale (the optimization changed the site) and has Python rebuild them
    assert _native_hits(consumer) >= N - 2


class _Stack:
    """A shadow stack that never objects (the INT3 path on a NOP never touches it)."""

    def push(self, addr: int) -> None: ...
    def pop(self) -> int | None: return None
    def update_last_frame(self, addr: int) -> None: ...
    def kernel_violation(self, why: str, expected: int | None, actual: int) -> None: ...


def _with_handler(m: Machine, c: Consumer) -> None:
    c.handler = lambda hit: None


def _with_filter(m: Machine, c: Consumer) -> None:
    c.filter = lambda pid: True


def _with_rsb_model(m: Machine, c: Consumer) -> None:
    VerifySession(m, rsb=16)  # its chain observer is not one the C front mirrors (the default verifiers' are)


def _with_shadow_stack(m: Machine, c: Consumer) -> None:
    m.uprobes.shadow_stack = _Stack()


def _with_chain_observer(m: Machine, c: Consumer) -> None:
    m.uprobes.chain_observers.append(lambda probe, regs, path, after: None)


def _with_syscall_observer(m: Machine, c: Consumer) -> None:
    m.cpu.hooks.before_syscall.append(lambda: None)
    m.cpu.hooks.before_interrupt.append(lambda intno: None)


WATCHERS = [_with_handler, _with_filter, _with_rsb_model, _with_shadow_stack, _with_chain_observer,
            _with_syscall_observer]


# sys_uprobe with a shadow stack pops it (the verifier's shadow stack tests cover that): INT3 only
REFUSALS = [(case, watch) for case in (CASES[0], CASES[3]) for watch in WATCHERS
            if watch is not _with_shadow_stack or case[0] == "int3"]


@needs_c
@pytest.mark.parametrize("case,watch", REFUSALS, ids=[f"{c[0]}-{w.__name__}" for c, w in REFUSALS])
def test_the_c_path_refuses_what_python_must_see(case: tuple[str, str, str], watch: Any) -> None:
    consumer = Consumer()
    m = _machine(*case, consumer)
    watch(m, consumer)
    result = m.run()
    assert result.exit_status == 0, result.message
    assert _native_hits(consumer) == 0  # every hit went through Python
    assert consumer.hits == N


@needs_c
def test_strace_takes_every_syscall_to_python() -> None:
    lines: list[str] = []
    consumer = Consumer()
    result = _machine("linux-6.18", "nop5", "uprobe:uprobe_target_nop5", consumer, strace=lines.append).run()
    assert result.exit_status == 0
    assert _native_hits(consumer) == 0 and consumer.hits == N
    assert sum(line.startswith("uprobe()") for line in lines) == N - 1


@needs_c
def test_a_change_makes_the_tables_stale_until_rebuilt() -> None:
    consumer = Consumer()
    m = _machine("linux-6.18", "nop5", "uprobe:uprobe_target_nop5", consumer)
    assert m.uprobes.fast is not None
    m.uprobes.fast.sync()
    assert m.cpu.hooks.front is not None
    front = m.cpu.hooks.front.handle
    assert front.open and front.current
    consumer.enabled = False  # a watched field: stale
    assert not front.current
    m.uprobes.fast.sync()
    assert front.current


def test_hits_add_what_c_counted() -> None:
    consumer = Consumer()
    consumer.count("call")
    consumer.native_counters()
    assert consumer.native is not None
    consumer.native[NATIVE_PATHS.index("call")] = 5
    consumer.native[NATIVE_PATHS.index("int3")] = 1
    assert consumer.hits == 7
    assert consumer.paths == {"call": 6, "int3": 1}
    consumer.hits += 1  # a setter that keeps the C part
    assert consumer.hits == 8


needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the nop5 variant of uret_edge")


@pytest.fixture(scope="module")
def uret_nop5(tmp_path_factory: pytest.TempPathFactory) -> str:
    """fixtures/uret_edge.c with a nop5 at each C function's entry (gcc's -mnop-mcount), so that its
    uretprobes take the optimized entry: the corner cases of spec 5 on the C path."""
    where = tmp_path_factory.mktemp("uret")
    obj, exe = where / "uret_edge.o", where / "uret_edge_nop5"
    subprocess.run(["gcc", "-O2", "-fno-pie", "-pg", "-mfentry", "-mnop-mcount", "-fno-optimize-sibling-calls",
                    "-Wno-infinite-recursion", "-c", "-o", str(obj), str(ROOT / "fixtures" / "uret_edge.c")], check=True)
    subprocess.run(["gcc", "-static", "-no-pie", "-o", str(exe), str(obj)], check=True)
    return str(exe)


# depth 30: every return in C; depth 100: the 65th entry meets MAX_URETPROBE_DEPTH, handled in Python
# with the 64 instances the C side pushed; longjmp: the skipped frames' instances dropped without handlers
URET_CASES = [("depth", 30, "uretprobe:rec"), ("depth", 100, "uretprobe:rec"), ("longjmp", 20, "uretprobe:lj")]


@needs_gcc
@pytest.mark.parametrize("mode,n,spec", URET_CASES)
def test_uretprobe_corner_cases_same_both_ways(tmp_path: Path, uret_nop5: str, mode: str, n: int, spec: str) -> None:
    c_result, c_out = _cli_run(tmp_path, "linux-6.18", mode, spec, pure=False, exe=uret_nop5, n=n)
    py_result, py_out = _cli_run(tmp_path, "linux-6.18", mode, spec, pure=True, exe=uret_nop5, n=n)
    assert c_result == py_result
    assert c_out == py_out


@needs_c
@needs_gcc
@pytest.mark.parametrize("mode,n,spec,returns", [("depth", 30, "uretprobe:rec", 31), ("depth", 100, "uretprobe:rec", 64),
                                                 ("longjmp", 20, "uretprobe:lj", 0)])
def test_uretprobe_returns_counted_in_c(uret_nop5: str, mode: str, n: int, spec: str, returns: int) -> None:
    consumer = Consumer()
    m = Machine(uret_nop5, [uret_nop5, mode, str(n)], {}, RunOptions(design="linux-6.18"), GuestIO.captured())
    m.attach(spec, consumer)
    assert m.run().exit_status == 0
    assert consumer.ret_hits == returns
    native = consumer.native[NATIVE_RETURN] if consumer.native is not None else 0
    if mode == "depth" and n < 64:
        assert native >= returns - 2  # the first entry traps; its return, and those of the second, may be Python's
    if mode == "depth" and n >= 64:
        assert native == 0  # the 65th entry moved every instance to Python, whose returns they are then
    if mode == "depth":
        assert not m.uprobes.return_instances  # (longjmp leaves the last round's, as the kernel would)


VERIFIED = [case for case in CASES if case[1] != "push"]  # NOP-class sites: the front does the verifiers' part


@needs_c
@pytest.mark.parametrize("design,workload,spec", VERIFIED)
def test_verified_hits_of_nop_sites_are_settled_in_c(design: str, workload: str, spec: str) -> None:
    consumer = Consumer()
    m = _machine(design, workload, spec, consumer)
    session = VerifySession(m)
    result = m.run()
    assert result.exit_status == 0, result.message
    assert consumer.hits == N and session.transactions == N  # every hit judged
    # Python sees the first hits only: the optimizing INT3 one, the one that finds the tables stale,
    # the one whose trampoline ret the resume watch finds, and the one after, with the tables rebuilt
    assert _native_hits(consumer) >= N - 4
    edges = session.tracker.edges
    assert edges is not None
    if design != "linux-6.18":
        assert session.violations == [] and edges.finished >= N - 4
    elif spec.startswith("uprobe:"):
        # the first optimized hit's call and pushes land in the red zone; later ones store the same bytes
        assert {(v.kind.value, v.hit) for v in session.violations} == {("redzone", 2)} and edges.finished >= N - 4
    else:  # the return trampoline's pushes land there between two hits: each entry changes it again
        assert {v.hit for v in session.violations if v.kind.value == "redzone"} == set(range(2, N + 1))


def _flag_toggling_slots() -> Any:
    """jmp-slots whose slot code flips the ID flag on every hit: a regs violation each time."""
    code = "lea -128(%rsp),%rsp; pushf; xorl $0x200000,(%rsp); popf; push %rcx; push %r11; push %rax; " \
           "mov $336,%eax; syscall"
    return replace(DESIGNS["jmp-slots"], name="id-toggle", trampoline=Trampoline(code, layout="slots", slot_size=64))


@needs_c
def test_a_hit_the_c_front_cannot_settle_is_judged_in_python() -> None:
    consumer = Consumer()
    m = Machine(TRIG, [TRIG, "nop5", str(N)], {}, RunOptions(design=_flag_toggling_slots()), GuestIO.captured())
    m.attach("uprobe:uprobe_target_nop5", consumer)
    session = VerifySession(m)
    assert m.run().exit_status == 0
    assert _native_hits(consumer) >= N - 4  # the front did the kernel's part of the hits ...
    flagged = {v.hit for v in session.violations if v.kind.value == "regs"}
    assert flagged == set(range(2, N + 1))  # ... and Python judged every optimized one: ID changed
    assert all("ID" in v.summary for v in session.violations if v.kind.value == "regs")
