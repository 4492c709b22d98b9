"""Running a process: time slices of its threads, context switches, the processes sharing the
CPU, signals delivered at a return to user mode, CPU faults turned into the signals Linux sends,
and how a run ends (exit, kill, limits, a deadlock)."""

from __future__ import annotations

import enum
import errno
from typing import TYPE_CHECKING

from emu.abi import SI_KERNEL, Signal
from emu.cpu import Access, Reg, StopReason
from emu.disasm import describe_insn
from emu.errors import EXIT_INSN_LIMIT, EXIT_TIMEOUT, MemoryFault
from emu.kernel.dispatch import SYSCALL_INSN_LEN
from emu.kernel.exits import GuestBlocked, GuestExit, GuestKilled, PollOthers, ProcessSuspended, WouldBlock
from emu.kernel.fork import Family, wait_status
from emu.kernel.signal import deliver, deliver_pending, handles
from emu.kernel.uprobes.core import Uprobes
from emu.process.icount import InsnCounter
from emu.process.timekeeping import TimeKeeper
from emu.runtypes import LIMITS, Budget, Ending, Outcome, RunOptions

PROCESS_QUANTUM = 200_000  # instructions a process runs while another one is runnable
PROCESS_SLICE_NS = 4_000_000  # virtual time one such slice takes: a tick of CONFIG_HZ=250 (Debian)
MAX_SPURIOUS_STOPS = 10_000  # emu_start returning for no reason, per process, before it counts as a hlt

ILL_ILLOPN, FPE_INTDIV, SEGV_MAPERR, SEGV_ACCERR = 2, 1, 1, 2
# CPU exception vector -> the signal Linux sends for it in user mode, and the si_code (arch/x86/kernel/traps.c).
EXCEPTION_SIGNALS = {
    0: (Signal.SIGFPE, "divide error", FPE_INTDIV),
    1: (Signal.SIGTRAP, "debug trap", SI_KERNEL),
    3: (Signal.SIGTRAP, "breakpoint", SI_KERNEL),
    4: (Signal.SIGSEGV, "overflow", SI_KERNEL),
    5: (Signal.SIGSEGV, "bound range exceeded", SI_KERNEL),
    6: (Signal.SIGILL, "invalid opcode", ILL_ILLOPN),
    13: (Signal.SIGSEGV, "general protection", SI_KERNEL),
    16: (Signal.SIGFPE, "x87 floating-point error", SI_KERNEL),
    17: (Signal.SIGBUS, "alignment check", SI_KERNEL),
    19: (Signal.SIGFPE, "SIMD floating-point error", SI_KERNEL),
}


if TYPE_CHECKING:  # for the type checker only: a Protocol class costs start-up time, and a run needs none
    from typing import Protocol

    from emu.kernel.dispatch import Kernel
    from emu.process.timekeeping import ClockedProcess

    class RunHost(ClockedProcess, Protocol):
        """The process a RunLoop runs (emu/machine.py's Machine); read at each use, since an execve
        replaces its uprobes. ClockedProcess has its cpu, mem, kernel, counter and vdso."""

        @property
        def options(self) -> RunOptions: ...
        @property
        def uprobes(self) -> Uprobes: ...
        @property
        def family(self) -> Family: ...
        @property
        def budget(self) -> Budget: ...


class _Wait(enum.Enum):
    """What a syscall that must wait does next (RunLoop._wait_for_others)."""

    RESTART = "restart it now"
    YIELD = "let another thread of the process run first"


class RunLoop:
    """Runs one process's threads until the process ends; ``first``: the process the run started
    with (the others, its descendants, are suspended rather than ended when they must wait)."""

    def __init__(self, process: RunHost, first: bool) -> None:
        self.process = process
        self._first = first
        self._counted = False  # the last slice ran with an instruction count (several threads)
        self._stalls = 0  # syscalls restarted in a row with no slice run in between (a thread deadlock past a bound)
        self._signalled = False  # another process sent a signal: act on it before running on
        self._process_slice = False  # the last slice was counted because another process could run
        self._waiting = False  # stopped in a syscall that waits: it restarts when the process runs on
        self.spurious_stops = 0  # emu_start returns with nothing to report (see _spurious_stop)
        self.time = TimeKeeper(process)  # the process's CPU on the virtual clock: its counter, its timers' stops

    # ------------------------------------------------------------ entry points
    def run_first(self, entry: int) -> Outcome:
        """Run the first process from ``entry`` to its end, then its orphans to theirs. A limit of the
        run's budget ends every process of it: the first reports it, the others stop where they are."""
        outcome = self.run_until_end(entry)
        if outcome[0] in LIMITS:
            return outcome
        self.end_process(outcome[0], outcome[1], outcome[2])
        self._run_orphans()
        return outcome

    def resume(self) -> bool:
        """Run this (non-first) process until it ends, blocks or is preempted; True if it made progress.
        Once the run's budget is spent it does not run (the first process reports the limit)."""
        kernel, family = self.process.kernel, self.process.family
        if self.process.budget.spent is not None:
            return False
        before = sum(kernel.counts.values())
        try:
            ending, status, signal, _message = self.run_until_end(kernel.task.pc)
        except ProcessSuspended as suspended:
            wake = self._wake_time(suspended.wait) if suspended.wait is not None else None
            family.set_waiting(kernel.ident.pid, suspended.wait, wake)
            if suspended.wait is None:
                return True  # preempted: it ran a slice
            family.note_wake(wake)
            return sum(kernel.counts.values()) - before >= 2  # more than the restarted syscall
        if ending in LIMITS:
            return False  # the run's budget is spent: every process stops where it is
        self.end_process(ending, status, signal)
        return True

    def signal_arrived(self) -> None:
        self._signalled = True

    def end_process(self, ending: Ending, status: int, signal: Signal | None) -> None:
        kernel = self.process.kernel
        self.time.ended()
        _abandon_open_waits(kernel)
        kernel.files.close_all()
        self.process.family.ended(kernel.ident.pid, wait_status(ending is Ending.EXITED, status, signal))

    def on_interrupt(self, intno: int) -> None:
        """A CPU exception: an int3 of a uprobe is handled, anything else is the signal Linux sends."""
        cpu = self.process.cpu
        if intno == 3 and self.process.uprobes.handle_int3():
            return
        signal, what, code = EXCEPTION_SIGNALS.get(intno, (Signal.SIGSEGV, f"exception {intno}", SI_KERNEL))
        if intno in (16, 19):  # math_error: the si_code names the unmasked exception pending
            from emu.kernel.fpu import exception_code  # fpu.py loads with the first FPU exception

            code = exception_code(cpu, intno) or SI_KERNEL
        rip = cpu.read(Reg.RIP)
        at = rip - 1 if intno == 3 else rip  # int3 traps after its byte; the message names the int3
        raise GuestKilled(signal, at, what, code=code, si_addr=0 if code == SI_KERNEL else rip, resume_ip=rip)

    def fold_fast(self) -> None:
        """What the C hot path counted goes into the statistics and the syscall counts (fastpath.py)."""
        fast = self.process.uprobes.fast
        if fast is not None:
            fast.fold(self.process.kernel.counts)

    def run_deferred(self) -> None:
        """The kernel's actions between instructions; no timer stops the CPU while one steps the guest
        (an out-of-line step: Linux holds signals back until it is done, uprobe_deny_signal)."""
        deferred = self.process.kernel.deferred
        if not deferred:
            return
        release = self.time.hold_stops()
        try:
            while deferred:
                deferred.pop(0)()
        finally:
            if release is not None:
                release()

    # ------------------------------------------------------------ the loop
    def run_until_end(self, entry: int) -> Outcome:
        sched = self.process.kernel.sched
        sched.current.pc = entry
        yield_first = False
        while True:
            if self.process.budget.spent is not None:
                return self._stopped()  # another process of the run spent the budget
            try:
                if self._signalled or self.process.kernel.timers:
                    self._act_on_signals()
                self._waiting = False
                if yield_first:
                    yield_first = False
                    self._switch(yielding=True)
                reason = self._run_slices(sched.current.pc)
                signal = self._fault_signal(reason)
                if signal is None and self.time.stopped_for_timer():
                    continue  # a timer expired: its signal comes as the loop goes round (_act_on_signals)
                if signal is None and self._slice_ended():
                    self._stalls = 0
                    self._switch()
                    self._share_cpu()
                    continue
            except GuestExit as ex:
                self.process.kernel.trace_exit("exit_group", ex.status)
                return Ending.EXITED, ex.status, None, None
            except GuestKilled as kill:
                signal = kill
            except WouldBlock as wait:
                self._waiting = True  # until the restarted syscall runs (a signal may interrupt it)
                ended = self._wait_for_others(wait)
                if isinstance(ended, _Wait):
                    yield_first = ended is _Wait.YIELD
                    continue
                return ended
            except GuestBlocked as blocked:
                return Ending.BLOCKED, 128 + Signal.SIGKILL, None, f"guest blocked forever: {blocked}"
            if signal is None:
                if self._spurious_stop():
                    continue
                return self._stopped()
            if not self._to_handler(signal):
                return self._killed(signal.signal, signal.address, signal.detail)
            sched.current.pc = self.process.cpu.read(Reg.RIP)

    def _run_slices(self, pc: int) -> StopReason:
        """Run the current thread until something other than a deferred kernel action (an XOL step) or
        the clock's first count stops the CPU; with several threads, for at most one scheduler slice of
        instructions; and, with a timer armed, at most until it expires (emu/process/timekeeping.py).

        A slice is counted per block where a block counter exists (TimeKeeper.slice_counter): a
        process's while another process can run, and a thread's unless the scheduler wants exact slices.
        Those (a seed or a short quantum) are counted one instruction at a time (Unicorn's count): races
        are found by preempting a thread inside a probe site (tests/test_uprobe_race.py), which block
        granularity cannot do."""
        process = self.process
        kernel, cpu, budget = process.kernel, process.cpu, process.budget
        sched = kernel.sched
        while True:
            remaining = budget.remaining_us()
            count = sched.slice_length()
            self._process_slice = (not count and len(process.family.procs) > 1  # (the usual case: one process)
                                   and process.family.runnable_others(kernel.ident.pid))
            if self._process_slice:
                count = PROCESS_QUANTUM
            self._counted = count > 0
            fast = process.uprobes.fast
            if fast is not None:  # the C hot path takes counting-only hits while nothing watches them
                fast.sync(kernel.tracer is not None)
            self.time.before_run()
            by_block = self._process_slice or (self._counted and not sched.exact_slices)
            slicer = self.time.slice_counter() if by_block else None
            counter = self.time.counter
            run = cpu.run if counter is None else counter.run
            before = self._charge_from(counter)
            try:
                if slicer is not None:
                    reason = slicer.run_slice(pc, remaining, count)
                else:
                    reason = run(pc, timeout_us=remaining, count=count)
            finally:
                self.time.after_run()
                self.fold_fast()
                self._charge(counter, before)
            sched.current.pc = cpu.read(Reg.RIP)
            restart = self.time.started_during_run()  # it stopped for a counter: it runs on with one
            if not (kernel.deferred or restart) or reason is not StopReason.FINISHED or self._at_limit():
                return reason
            self.run_deferred()
            pc = sched.current.pc = cpu.read(Reg.RIP)
            if sched.switch_requested or self.time.stopped_for_timer():
                return reason

    def _charge_from(self, counter: InsnCounter | None) -> int:
        """Before a slice: the process's counter may take it to the run's instruction budget, no further;
        the total it starts from."""
        if counter is None:
            return 0
        left = self.process.budget.insns_left
        counter.limit = None if left is None else counter.total + left
        return counter.total

    def _charge(self, counter: InsnCounter | None, before: int) -> None:
        """After a slice: what it ran comes off the run's budget."""
        budget = self.process.budget
        if counter is not None and budget.insns_left is not None:
            budget.insns_left = max(0, budget.insns_left - (counter.total - before))
            if counter.hit_limit:
                budget.spent = Ending.INSN_LIMIT

    def _at_limit(self) -> bool:
        return self.process.budget.spent is Ending.INSN_LIMIT

    def _timed_out(self) -> bool:
        budget = self.process.budget
        if budget.spent is None and budget.timed_out():
            budget.spent = Ending.TIMEOUT
        return budget.spent is Ending.TIMEOUT

    def _slice_ended(self) -> bool:
        """Did the CPU stop at a scheduling point: a syscall asked for a switch, or a counted slice ran out?

        Unicorn reports a hlt and the end of a counted slice alike (rip after the hlt, or at the next
        instruction), so while several threads run a hlt is taken for the end of a slice: only an
        uncounted (single-thread) run reports hlt as Linux does (#GP, SIGSEGV)."""
        if self.process.kernel.sched.switch_requested:
            return True
        if not self._counted or self._at_limit():
            return False
        return not self._timed_out()

    def _spurious_stop(self) -> bool:
        """Unicorn can return from emu_start with nothing to report: no limit, no timeout, no hlt just
        run (seen rarely after a stop request raced with the end of an earlier run). The guest then
        simply goes on; only a hlt is the #GP Linux raises (bounded, so a stuck engine still ends)."""
        if self._at_limit() or self._timed_out():
            return False
        rip = self.process.cpu.read(Reg.RIP)
        try:
            after_hlt = self.process.mem.read(rip - 1, 1) == b"\xf4"
        except MemoryFault:
            after_hlt = False
        self.spurious_stops += 1
        return not after_hlt and self.spurious_stops <= MAX_SPURIOUS_STOPS

    def _stopped(self) -> Outcome:
        budget = self.process.budget
        if self._at_limit():
            return (Ending.INSN_LIMIT, EXIT_INSN_LIMIT, None,
                    f"stopped after {budget.max_insns} instructions (--max-insns {budget.max_insns})")
        if self._timed_out():
            return Ending.TIMEOUT, EXIT_TIMEOUT, None, f"stopped after {budget.timeout_s} s (--timeout)"
        # Unicorn stops on hlt; in user mode Linux raises #GP for it.
        return self._killed(Signal.SIGSEGV, self.process.cpu.read(Reg.RIP), "general protection")

    def _killed(self, signal: Signal, address: int | None, detail: str) -> tuple[Ending, int, Signal, str]:
        where = ""
        if address is not None:
            where = f" at {address:#x}: {describe_insn(self.process.mem, address)}"
        message = f"killed by {signal.name}{where} ({detail})"
        strace = self.process.options.strace
        if strace:
            strace(f"+++ killed by {signal.name} +++")
        return Ending.KILLED, 128 + signal, signal, message

    # ------------------------------------------------------------ threads and processes
    def _switch(self, yielding: bool = False) -> None:
        """Save the running thread, load the next one (sched.py decides which), deliver its pending signals."""
        cpu, kernel = self.process.cpu, self.process.kernel
        sched = kernel.sched
        sched.switch_requested = False
        current = sched.current
        nxt = sched.pick_next(yielding)
        if nxt is not current:
            if current.alive:
                current.context = cpu.save_context(current.context)
            assert nxt.context is not None
            cpu.restore_context(nxt.context)
            sched.current = nxt
            self.process.uprobes.task = nxt.uprobe
            sched.switches += 1
            for observer in sched.switch_observers:
                observer(current, nxt)
        for reg, value in nxt.resume_regs.items():
            cpu.write(reg, value)
        nxt.resume_regs.clear()
        if nxt.signals.pending & ~nxt.signals.mask:
            cpu.write(Reg.RIP, nxt.pc)
            deliver_pending(kernel)
            self.run_deferred()
            nxt.pc = cpu.read(Reg.RIP)

    def _share_cpu(self) -> None:
        """At the end of a slice: let the other processes run if one can (or one this process woke
        waits further down the call stack); a process that is not the first is suspended for that."""
        kernel, family = self.process.kernel, self.process.family
        if self._process_slice:  # virtual time goes on while processes share the CPU (timeouts come)
            kernel.clock.advance(PROCESS_SLICE_NS)
        woke, family.preempt = family.preempt or family.due(kernel.clock.elapsed), False
        pid = kernel.ident.pid
        if not (woke or family.runnable_others(pid)):
            return
        if not self._first:
            raise ProcessSuspended("preempted")
        family.run_others(pid)

    def _run_orphans(self) -> None:
        """Children still running once the first process is gone run to their end; when all of them
        wait, time moves on to the first timeout among them."""
        kernel, family = self.process.kernel, self.process.family
        while True:
            if family.run_others(kernel.ident.pid):
                continue
            wake = family.take_wake(None)
            if wake is None:
                return
            kernel.clock.advance(max(0, wake - kernel.clock.elapsed))

    def _wait_for_others(self, wait: WouldBlock) -> _Wait | Outcome:
        """A syscall that must wait for another process or thread: it is restarted once they have run
        (or, for a poll, answered); a deadlock ends the run (or suspends a process that is not the first)."""
        kernel, cpu, family = self.process.kernel, self.process.cpu, self.process.family
        sched = kernel.sched
        pid = kernel.ident.pid
        after = cpu.read(Reg.RIP)
        sched.current.pc = after - SYSCALL_INSN_LEN
        polling = isinstance(wait, PollOthers)  # it does not sleep: the others get one slice each
        ends = family.ends
        family.set_waiting(pid, wait, kernel.clock.elapsed if polling else self._wake_time(wait))
        try:
            progressed = family.run_others(pid)
        finally:
            family.set_waiting(pid, None)
        if self.process.budget.spent is not None:  # the others ran the run's budget out
            if not self._first:
                raise ProcessSuspended("the run's budget is spent")
            return self._stopped()
        if progressed and not (polling and family.ends == ends):
            return _Wait.RESTART
        if isinstance(wait, PollOthers):  # no process ended: the poll's answer stands
            kernel.cpu.write_syscall_return(wait.result, after, cpu.read(Reg.RFLAGS))
            sched.current.pc = after
            return _Wait.RESTART
        if sched.threaded and self._stalls < 2 * len(sched.live()):
            self._stalls += 1  # bounded: fruitless retries with nothing else running are a deadlock
            return _Wait.YIELD
        if not self._first:
            raise ProcessSuspended(str(wait), wait)
        until = family.take_wake(self._wake_time(wait))
        if until is not None:  # everyone waits, some with a timeout: time moves on to the first one
            kernel.clock.advance(max(0, until - kernel.clock.elapsed))
            return _Wait.RESTART
        return Ending.BLOCKED, 128 + Signal.SIGKILL, None, f"guest blocked forever: {wait}"

    def _wake_time(self, wait: WouldBlock) -> int | None:
        """When the wait ends by itself: its own timeout or the process's first timer, if earlier."""
        from emu.kernel.procsig import next_expiry  # procsig.py loads with the first wait (a plain run has none)

        kernel = self.process.kernel
        times = [t for t in (wait.until, next_expiry(kernel) if kernel.timers else None) if t is not None]
        return min(times) if times else None

    # ------------------------------------------------------------ signals
    def _act_on_signals(self) -> None:
        """Before running on: signals another process sent and timers that fired are acted on as at a
        return to user mode (a handler frame on the interrupted state, or death)."""
        kernel, cpu = self.process.kernel, self.process.cpu
        if not (self._signalled or kernel.timers):
            return  # the common case: nothing to do, and procsig is not even imported
        from emu.kernel.procsig import acting_signal, fire_timers  # loaded with the first signal between processes

        fired = fire_timers(kernel) if kernel.timers else False
        if not (self._signalled or fired):
            return
        self._signalled = False
        task = kernel.sched.current
        if not task.signals.pending & ~task.signals.mask:
            return
        rip = task.pc
        signo = acting_signal(kernel) if self._waiting else None
        if signo is not None:
            # it sleeps in a syscall about to be restarted: the signal interrupts it (EINTR), then acts;
            # with SA_RESTART the handler's frame holds the syscall itself, which runs again after it
            if not _restarts(kernel, signo, cpu.read(Reg.RAX)):
                rip += SYSCALL_INSN_LEN
                cpu.write_syscall_return(-errno.EINTR, rip, cpu.read(Reg.RFLAGS))
                _abandon_open_waits(kernel, task.tid)
            self._waiting = False
        cpu.write(Reg.RIP, rip)
        deliver_pending(kernel)  # may raise GuestKilled: the caller's loop ends the process
        self.run_deferred()
        task.pc = cpu.read(Reg.RIP)

    def _to_handler(self, sig: GuestKilled) -> bool:
        """force_sig: a caught, unblocked signal runs the guest's handler; anything else kills."""
        from emu.kernel.sigframe import SigInfo  # sigframe.py loads with the first signal a guest takes

        kernel = self.process.kernel
        signo = int(sig.signal)
        if not handles(kernel, signo):
            return False
        info = SigInfo(signo, sig.code, addr=sig.si_addr)
        try:
            deliver(kernel, signo, info, sig.resume_ip)
        except GuestKilled:
            return False
        return True

    def _fault_signal(self, reason: StopReason) -> GuestKilled | None:
        """The signal a stop of the CPU stands for: SIGILL for an invalid opcode, SIGSEGV for a bad access."""
        cpu = self.process.cpu
        rip = cpu.read(Reg.RIP)
        if reason is StopReason.INVALID_INSN:
            return GuestKilled(Signal.SIGILL, rip, "invalid opcode", code=ILL_ILLOPN, si_addr=rip)
        if reason is not StopReason.BAD_ACCESS:
            return None
        bad = cpu.last_bad_access
        if bad is None:
            return GuestKilled(Signal.SIGSEGV, rip, "bad memory access", code=SI_KERNEL)
        state = "unmapped" if bad.unmapped else "protected"
        what = {Access.READ: "read of", Access.WRITE: "write to", Access.FETCH: "execution of"}[bad.access]
        code = SEGV_MAPERR if bad.unmapped else SEGV_ACCERR
        return GuestKilled(Signal.SIGSEGV, rip, f"{what} {state} {bad.address:#x}", code=code, si_addr=bad.address)


def _abandon_open_waits(kernel: Kernel, tid: int | None = None) -> None:
    """The opens that wait (a FIFO's: emu/kernel/fifo.py) of thread ``tid`` (every thread's: None) and
    will never complete (EINTR, the process ending): each undoes what it counted."""
    for waiting in [t for t in kernel.open_waits if tid is None or t == tid]:
        kernel.open_waits.pop(waiting)()


def _restarts(kernel: Kernel, signo: int, nr: int) -> bool:
    from emu.kernel.sigframe import restarts

    row = kernel.table.get(nr)
    return row is not None and restarts(kernel, signo, row.name)
