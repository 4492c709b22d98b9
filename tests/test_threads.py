"""Threads: clone3/clone, futex, clear-child-tid, per-thread signals and uprobe state, the deterministic scheduler."""

from __future__ import annotations

import errno
import struct
import subprocess
import sys

import pytest
from conftest import REPO, GuestKernel, run_emulated, run_native, sample

from emu import hotpath
from emu.cpu import Reg
from emu.designs import DESIGNS
from emu.errors import UsageError
from emu.guestio import GuestIO
from emu.kernel.clock import VirtualClock
from emu.kernel.exits import GuestBlocked
from emu.kernel.sched import DEFAULT_QUANTUM, EXACT_SLICES_BELOW, Scheduler
from emu.kernel.state import SignalState
from emu.kernel.tasks import Task, TaskState
from emu.machine import Ending, Machine, RunOptions

THREADS = sample("threads")
WORKERS, CALLS = 4, 300


def _machine(*args: str, **opts: object) -> Machine:
    return Machine(THREADS, [THREADS, *args], {}, RunOptions(**opts), GuestIO.captured())  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ same as native
@pytest.mark.parametrize("args", [(), ("8", "500"), ("timedwait",), ("kill",), ("pipe",)])
def test_pthread_sample_runs_as_natively(args: tuple[str, ...]) -> None:
    emulated = run_emulated([THREADS, *args])
    assert emulated.observed() == run_native([THREADS, *args]).observed()
    assert emulated.status == 0


def test_the_sample_made_threads_and_switched_between_them() -> None:
    result = run_emulated([THREADS, "4", "100"], sched_quantum=200).result
    assert result is not None
    assert result.threads == 5  # main + 4 workers, each with its own tid (the sample checks they differ)
    assert result.switches > 4


@pytest.mark.parametrize("quantum,seed", [(100, 3), (1000, 1), (20_000, None)])
def test_a_thread_reading_an_empty_pipe_waits_for_the_writer_thread(quantum: int, seed: int | None) -> None:
    outcome = run_emulated([THREADS, "pipe"], sched_quantum=quantum, sched_seed=seed)
    assert (outcome.out, outcome.status) == (b"pipe: got 'late'\n", 0)


def test_small_and_random_slices_give_the_same_output() -> None:
    expected = run_native([THREADS, "3", "200"]).observed()
    for quantum, seed in ((1, None), (7, 1), (50, 2), (5000, 3)):
        assert run_emulated([THREADS, "3", "200"], sched_quantum=quantum, sched_seed=seed).observed() == expected


# ------------------------------------------------------------------------------ determinism
def _interleaving(seed: int | None, quantum: int = 40) -> tuple[int, int, bytes]:
    machine = _machine("3", "100", sched_quantum=quantum, sched_seed=seed)
    order: list[int] = []
    consumer = machine.attach("uprobe:probed")
    assert not isinstance(consumer, list)
    machine.uprobes.chain_observers.append(
        lambda probe, regs, path, after: None if after else order.append(machine.kernel.task.tid))
    result = machine.run()
    assert result.exit_status == 0
    return result.switches, hash(tuple(order)), bytes(machine.io.out)


def test_switch_observers_hear_every_switch() -> None:
    machine = _machine("3", "50", sched_quantum=100)
    seen: list[tuple[int, int]] = []
    machine.kernel.sched.switch_observers.append(lambda old, new: seen.append((old.tid, new.tid)))
    result = machine.run()
    assert result.exit_status == 0 and len(seen) == result.switches > 0
    assert all(old != new for old, new in seen)


def test_same_seed_same_run_other_seed_other_interleaving() -> None:
    first = _interleaving(seed=11)
    assert _interleaving(seed=11) == first
    others = {_interleaving(seed=s)[:2] for s in (12, 13, 14)}
    assert any(other != first[:2] for other in others)
    assert _interleaving(seed=None) == _interleaving(seed=None)  # plain round-robin is deterministic too


# ------------------------------------------------------------------------------ probes in threads
@pytest.mark.parametrize("design", list(DESIGNS))
def test_every_call_from_every_thread_is_a_hit(design: str) -> None:
    machine = _machine(str(WORKERS), str(CALLS), design=design, sched_quantum=13, sched_seed=5)
    for spec in ("uprobe:probed", "usdt:thr:tick", "uretprobe:probed"):
        machine.attach(spec)
    result = machine.run()
    assert result.exit_status == 0, result.message
    assert [p["hits"] for p in result.probes] == [WORKERS * CALLS] * 3
    assert machine.io.out == run_native([THREADS, str(WORKERS), str(CALLS)]).out


def test_return_instances_belong_to_their_thread() -> None:
    """A thread switched out between a uretprobe's entry and its return keeps its own pending return;
    another thread entering the probed leaf sees none of it."""
    machine = _machine("2", "50", sched_quantum=3)
    machine.attach("uretprobe:probed")
    own: list[int] = []
    others: list[int] = []

    def on_entry(probe: object, regs: object, path: object, after: bool) -> None:
        if after:
            return
        own.append(len(machine.uprobes.return_instances))
        others.append(sum(len(t.uprobe.return_instances) for t in machine.kernel.sched.tasks.values()))

    machine.uprobes.chain_observers.append(on_entry)
    result = machine.run()
    assert result.exit_status == 0 and result.probes[0]["hits"] == 100
    assert max(own) == 0  # probed is a leaf: its own thread never has a return pending at entry
    assert max(others) >= 1  # while the other thread, switched out inside probed, has one


# ------------------------------------------------------------------------------ blocking
def test_deadlock_is_reported_not_hung() -> None:
    result = run_emulated([THREADS, "deadlock"]).result
    assert result is not None
    assert result.ending is Ending.BLOCKED
    assert result.message is not None and "deadlock: no thread can run" in result.message
    assert result.message.count("futex 0x") == 2


def _sched() -> tuple[Scheduler, Task, list[int]]:
    stops: list[int] = []
    main = Task(100, SignalState())
    return Scheduler(main, VirtualClock(0), lambda: stops.append(1), quantum=10), main, stops


def test_scheduler_round_robin_skips_blocked_and_exited() -> None:
    sched, main, _ = _sched()
    others = [Task(sched.new_tid(), SignalState()) for _ in range(3)]
    for task in others:
        sched.add(task)
    assert sched.pick_next() is others[0]
    sched.block(others[0], 0x1000, 1, None)
    sched.exit(others[1])
    sched.current = main
    assert sched.pick_next() is others[2]
    sched.current = others[2]
    assert sched.pick_next() is main
    assert [t.tid for t in sched.waiters(0x1000, 0xFFFFFFFF)] == [others[0].tid]
    assert sched.waiters(0x1000, 2) == []  # FUTEX_WAIT_BITSET: the masks must meet


def test_all_blocked_with_a_timeout_jumps_the_clock_and_times_out() -> None:
    sched, main, _ = _sched()
    sched.block(main, 0x2000, 1, deadline=5_000_000)
    assert sched.pick_next() is main
    assert main.state is TaskState.RUNNABLE
    assert main.resume_regs[Reg.RAX] == (-errno.ETIMEDOUT) & (2**64 - 1)
    assert sched.clock.elapsed >= 5_000_000


def test_all_blocked_forever_is_a_deadlock() -> None:
    sched, main, _ = _sched()
    sched.block(main, 0x2000, 1, deadline=None)
    with pytest.raises(GuestBlocked, match="tid 100: futex 0x2000"):
        sched.pick_next()


def test_single_thread_runs_uncounted_and_bad_quantum_is_refused() -> None:
    sched, main, _ = _sched()
    assert sched.slice_length() == 0
    sched.add(Task(sched.new_tid(), SignalState()))
    assert sched.slice_length() == 10
    with pytest.raises(UsageError, match="quantum"):
        sched.configure(0, None)


def test_short_or_seeded_slices_end_exactly_long_unseeded_ones_at_a_block() -> None:
    sched, _, _ = _sched()
    cases = [(EXACT_SLICES_BELOW - 1, None), (EXACT_SLICES_BELOW, None), (DEFAULT_QUANTUM, None), (DEFAULT_QUANTUM, 1)]
    exact = []
    for quantum, seed in cases:
        sched.configure(quantum, seed)
        exact.append(sched.exact_slices)
    assert exact == [True, False, False, True]


@pytest.mark.parametrize("quantum,seed", [(5000, None), (5000, 4)])
def test_threads_sliced_by_block_or_exactly_run_as_natively(quantum: int, seed: int | None) -> None:
    """A long unseeded slice is counted a block at a time (the C counter; pure Python has none and
    counts exactly); either way the threads share the CPU and the program prints what it does natively."""
    machine = _machine("4", "300", sched_quantum=quantum, sched_seed=seed)
    result = machine.run()
    assert result.exit_status == 0 and result.switches > 4
    assert machine.io.out == run_native([THREADS, "4", "300"]).out
    by_block = hotpath.native is not None and seed is None
    assert (machine.run_loop.time.counter is not None) == by_block


# ------------------------------------------------------------------------------ CLI
def test_run_flags_choose_quantum_and_seed() -> None:
    cmd = [sys.executable, "-m", "emu", "run", "--sched-quantum", "25", "--sched-seed", "9",
           "-p", "uprobe:probed", THREADS, "2", "40"]
    proc = subprocess.run(cmd, capture_output=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0
    assert proc.stdout == run_native([THREADS, "2", "40"]).out
    assert b"uprobe:probed" in proc.stderr and b" 80 " in proc.stderr


# ------------------------------------------------------------------------------ clone, clone3, futex one call at a time
THREAD_FLAGS = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000 | 0x80000 | 0x100000 | 0x200000  # glibc's


def test_clone_takes_flags_newsp_parent_tid_child_tid_tls(guest: GuestKernel) -> None:
    parent_tid, child_tid = guest.alloc(4), guest.alloc(4)
    tid = guest("clone", THREAD_FLAGS, 0x7000_0000, parent_tid, child_tid, 0x7100_0000)
    assert tid == guest.kernel.config.pid + 1
    assert struct.unpack("<I", guest.read(parent_tid, 4))[0] == tid  # CLONE_PARENT_SETTID
    child = guest.kernel.sched.tasks[tid]
    assert child.resume_regs[Reg.RSP] == 0x7000_0000 and child.resume_regs[Reg.FS_BASE] == 0x7100_0000
    assert child.resume_regs[Reg.RAX] == 0 and child.clear_child_tid == child_tid
    assert child.signals.actions is guest.kernel.signals.actions  # CLONE_SIGHAND: one table of actions
    assert guest("gettid") == guest.kernel.config.pid  # the caller is still the main thread


def test_clone3_reads_struct_clone_args(guest: GuestKernel) -> None:
    ptid = guest.alloc(4)
    args = struct.pack("<11Q", THREAD_FLAGS, 0, ptid, ptid, 0, 0x6000_0000, 0x1000, 0x6100_0000, 0, 0, 0)
    tid = guest("clone3", guest.alloc(88, args), 88)
    child = guest.kernel.sched.tasks[tid]
    assert child.resume_regs[Reg.RSP] == 0x6000_1000  # stack + stack_size
    assert guest("clone3", guest.alloc(88, args), 32) == -errno.EINVAL  # smaller than CLONE_ARGS_SIZE_VER0
    assert guest("clone3", guest.alloc(96, args + b"\1" + bytes(7)), 96) == -errno.E2BIG  # unknown field set


def test_clone_flag_rules(guest: GuestKernel) -> None:
    assert guest("clone", 0x10000 | 0x100, 0, 0, 0, 0) == -errno.EINVAL  # CLONE_THREAD without CLONE_SIGHAND
    assert guest("clone", 0x800, 0, 0, 0, 0) == -errno.EINVAL  # CLONE_SIGHAND without CLONE_VM
    assert guest("clone", THREAD_FLAGS | 0x20000, 0, 0, 0, 0) == -errno.EINVAL  # CLONE_NEWNS: not modelled


def test_futex_errors_and_wake_counts(guest: GuestKernel) -> None:
    word = guest.alloc(4, struct.pack("<I", 5))
    assert guest("futex", word, 0, 4, 0) == -errno.EAGAIN  # FUTEX_WAIT: the value moved on
    assert guest("futex", word + 1, 1, 1, 0) == -errno.EINVAL  # unaligned
    assert guest("futex", word, 10, 1, 0, 0, 0) == -errno.EINVAL  # FUTEX_WAKE_BITSET with an empty mask
    assert guest("futex", word, 1, 1, 0) == 0  # nobody waits
    expired = guest.alloc(16, struct.pack("<qq", 0, 0))
    assert guest("futex", word, 9 | 256, 5, expired, 0, 0xFFFFFFFF) == -errno.ETIMEDOUT  # absolute, long past
    assert guest("futex", word, 6, 0, 0) == -errno.ENOSYS  # FUTEX_LOCK_PI: not emulated
