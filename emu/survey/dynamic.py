"""The dynamic half: one corpus entry under one design, as `check` runs it, with each site's verdict.

Runs on a worker (a Dask task) and returns plain data. Per probed site: its hits (linux-6.18
optimizes a site on its first hit, through INT3, so a site hit once never ran the optimized path),
the hits the red-zone verifier flagged (a red-zone byte differs from the unprobed reference after
the hit), and the hits whose changed bytes the program then **read back** before storing to them:
that is a clobber the program can see. A flagged byte nothing reads again (a dead red zone) is
harmless, so a site counts as dynamically clobbered only when a read-back was seen.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from emu.designs import Design
from emu.survey.corpus import Entry, file_sha256, run_options

if TYPE_CHECKING:
    from emu.check import DesignReport
    from emu.machine import Machine
    from emu.process.vma import Vma
    from emu.runtypes import RunOptions
    from emu.survey.libraries import Reached
    from emu.verify.records import Transaction
    from emu.verify.session import VerifySession
    from emu.violations import Violation

LibrarySites = tuple[tuple[str, tuple[int, ...]], ...]  # (a mapped file's path, its sites' link-time addresses)
Owner = tuple[int, int, int]  # the hit that changed a byte: site, hit number, pid (0: the run's first process)
DYNAMIC_VERSION = 9  # bump when a dynamic verdict could change: stored runs of older versions are redone


@dataclass(frozen=True, slots=True)
class SiteRun:
    address: int  # link-time address (as the static survey names it)
    spec: str
    hits: int
    flagged: int  # hits after which the red-zone verifier found changed bytes
    read_back: int  # of those, hits whose changed bytes guest code read before storing to them
    refused: bool = False  # the design would not attach the probe


@dataclass(frozen=True, slots=True)
class DesignRun:
    entry: str  # the entry's content key
    sha256: str  # of the binary
    design: str
    status: str  # ok | error | changed | timeout (the entry's timeout stopped a run: not a verdict)
    error: str | None = None
    same_output: bool = True
    divergence: str | None = None
    sites: tuple[SiteRun, ...] = ()
    wall_s: float = 0.0


class ReadBack:
    """Watches the red-zone bytes a hit left changed until they are stored to (harmless) or read (a
    visible clobber, counted for the site and hit that changed them): by guest code, by the kernel
    copying them from user memory for a system call the program made (a write(2) of red-zone bytes),
    or in a child forked after the hit, whose copy of the address space holds the same bytes.

    The hooks span the whole address space and return at once while nothing is watched (Unicorn's
    public API cannot move a hook's range while the CPU runs). The tracker ends a hit before the
    trampoline's own ``ret`` runs, so reads by code in the kernel's pages, and the system calls that
    code makes, are the design's, not the program's. Only a read below rsp is a use of the red zone: a
    byte at or above it belongs to a frame allocated since (a call, push or sub covered it), and a
    read there before any store is of a slot never written (strlen's aligned over-read of a local
    buffer), whatever the probe did."""

    def __init__(self, machine: Machine, session: VerifySession) -> None:
        self.session = session
        self.bias = machine.resolver.image.bias  # runtime address - link-time address of the executable
        self.confirmed: set[Owner] = set()
        self._first_pid = machine.kernel.ident.pid  # (its violations say pid 0)
        self._spaces = {self._first_pid: _Space(machine, self.confirmed)}
        self._new: list[Violation] = []  # found since the last finished hit (the log keeps only the first ones)
        session.violations.listeners.append(self._new.append)
        self._watch(session)
        session.child_observers.append(self._watch)  # a forked process's hits are verified too
        machine.fork_observers.append(self._on_fork)

    def _watch(self, session: VerifySession) -> None:
        """Mark the bytes each hit of ``session``'s process changed, as the hit ends."""
        if session.tracker.edges is not None:
            session.tracker.edges.judge_every_hit()  # each hit's clobbered bytes are marked as it ends
        inner = session.tracker.on_finished

        def finished(tx: Transaction) -> None:
            inner(tx)
            self._mark(tx)

        session.tracker.on_finished = finished

    def counts(self) -> Counter[int]:
        """site -> hits whose clobber was read back."""
        return Counter(site for site, _hit, _pid in self.confirmed)

    def _mark(self, tx: Transaction) -> None:
        from emu.violations import Check

        new = self._new[:]
        self._new.clear()  # in place: the log's listener appends to this list
        for v in new:
            if v.kind is Check.REDZONE and "offset" in v.detail:  # a run of changed bytes, rsp-relative
                space = self._spaces[v.pid or self._first_pid]
                space.mark(tx.start_rsp + int(v.detail["offset"]), int(v.detail["size"]), (v.address, v.hit, v.pid))

    def _on_fork(self, child: Machine) -> None:
        """A child's memory is a copy of its parent's: the changed bytes are there too, watched apart."""
        parent = self._spaces.get(child.kernel.ident.ppid)
        marked = dict(parent.marked) if parent is not None else {}
        self._spaces[child.kernel.ident.pid] = _Space(child, self.confirmed, marked)


class _Space:
    """One process's address space under the read-back watch: its changed red-zone bytes (address ->
    the site and hit that changed them) and the hooks that see them read or stored to."""

    def __init__(self, machine: Machine, confirmed: set[Owner], marked: dict[int, Owner] | None = None) -> None:
        from emu.hotpath.mem_filter import FilteredMemHooks
        from emu.process.vma import WatchedBackend

        self.cpu, self.mem = machine.cpu, machine.mem
        self.marked: dict[int, Owner] = {} if marked is None else marked
        self.confirmed = confirmed
        self._program_syscall = False  # a system call the program made (not the design's trampoline) runs
        machine.mem.backend = WatchedBackend(machine.mem.backend, self._on_kernel_write)  # the kernel's stores too
        machine.mem.user_read_observers.append(self._on_kernel_read)
        machine.mem.map_observers.append(self._on_map)
        self.cpu.hooks.before_syscall.append(self._on_syscall)
        self.cpu.hooks.after_syscall.append(self._after_syscall)
        # raw: no Python frame between; with the C extension, Python sees only the accesses to marked bytes
        self._hooks = FilteredMemHooks(self.cpu.hooks, self._on_read, self._on_raw_write)
        self._hooks.watch(self.marked)

    def mark(self, first: int, size: int, owner: Owner) -> None:
        """Bytes [first, first + size) were changed by ``owner``'s hit."""
        for addr in range(first, first + size):
            self.marked[addr] = owner
        self._hooks.watch(self.marked)

    def _read(self, addr: int, size: int) -> None:
        """Bytes read: the marked ones below rsp are a clobber the program sees; none stays marked."""
        from emu.cpu import Reg

        owners = [(a, o) for a in range(addr, addr + size) if (o := self.marked.get(a)) is not None]
        if not owners:
            return
        rsp = self.cpu.read(Reg.RSP)
        self._forget(addr, size)
        self.confirmed.update(o for a, o in owners if a < rsp)

    def _on_read(self, _uc: object, _access: int, addr: int, size: int, _value: int, _ud: object) -> bool:
        if not self.marked:
            return True
        try:
            if not self._kernel_side():
                self._read(addr, size)
        except BaseException as exc:  # a raw hook hands its exception to the run
            self.cpu.hooks.raised(exc)
        return True

    def _on_kernel_read(self, addr: int, size: int) -> None:
        """copy_from_user, for a system call of the program's (rsp: the program's, at the call)."""
        if self.marked and self._program_syscall:
            self._read(addr, size)

    def _on_syscall(self) -> None:
        self._program_syscall = bool(self.marked) and not self._kernel_side()

    def _after_syscall(self) -> None:
        self._program_syscall = False

    def _kernel_side(self) -> bool:
        from emu.cpu import Reg
        from emu.process.vma import KERNEL_SIDE

        vma = self.mem.find(self.cpu.read(Reg.RIP))
        return vma is not None and vma.name in KERNEL_SIDE

    def _on_raw_write(self, _uc: object, _access: int, addr: int, size: int, _value: int, _ud: object) -> bool:
        if self.marked:
            self._forget(addr, size)
        return True

    def _forget(self, addr: int, size: int) -> None:
        if self.marked:
            removed = [a for a in range(addr, addr + size) if self.marked.pop(a, None) is not None]
            if removed:
                self._hooks.watch(self.marked)

    def _on_kernel_write(self, addr: int, data: bytes) -> None:
        self._forget(addr, len(data))

    def _on_map(self, vma: Vma) -> None:
        """A new mapping (an exec's stack, a mapping over the old one) holds none of the changed bytes."""
        if self.marked:
            for a in [a for a in self.marked if vma.start <= a < vma.end]:
                del self.marked[a]
            self._hooks.watch(self.marked)


def run_entry(entry: Entry, sha256: str, designs: Sequence[Design], sites: tuple[int, ...] | None,
              libraries: LibrarySites = (), reached: Reached | None = None) -> list[DesignRun]:
    """``entry`` under each of ``designs`` (one unprobed reference run for all, as `check` makes it);
    ``sites``: link-time addresses to probe ("all sites"), else the entry's own specs; ``libraries``:
    the sites of the other files its processes map, probed in every process that maps them (a SiteRun's
    spec names its file); ``reached``: the code the unprobed run ran, by file (libraries.py): a site
    outside it is not attached, and counts as never reached."""
    from emu.designs import known_designs, register

    start = time.perf_counter()

    def every(status: str, error: str | None = None) -> list[DesignRun]:
        took = (time.perf_counter() - start) / max(len(designs), 1)
        return [DesignRun(entry.content_key(), sha256, d.name, status, error, wall_s=took) for d in designs]

    if file_sha256(entry.binary) != sha256:
        return every("changed", "the binary changed during the survey")
    if sites == () and not libraries:  # "all sites" of files without any: nothing to probe (check would scan)
        return every("ok")
    for design in designs:
        if design.name not in known_designs():  # a --design-file design, on a worker that never loaded the file
            register(design)
    try:
        return _run(entry, sha256, [d.name for d in designs], sites, libraries, reached or {}, start)
    except Exception as exc:  # a program the emulation cannot run: recorded, never fatal to the survey
        return every("error", f"{type(exc).__name__}: {exc}")


def _run(entry: Entry, sha256: str, designs: list[str], sites: tuple[int, ...] | None, libraries: LibrarySites,
         reached: Reached, start: float) -> list[DesignRun]:
    with run_options(entry) as options:
        return _run_in(entry, sha256, designs, sites, libraries, reached, start, options)


def _run_in(entry: Entry, sha256: str, designs: list[str], sites: tuple[int, ...] | None, libraries: LibrarySites,
            reached: Reached, start: float, options: RunOptions) -> list[DesignRun]:
    from emu.check import CheckRequest, run_check
    from emu.machine import Machine

    argv, env = [entry.binary, *entry.args], dict(entry.env)
    bias = Machine(entry.binary, argv, env, options).resolver.image.bias if sites is not None else 0
    specs, unreached = _specs(entry, sites, libraries, reached, bias)
    if not specs:  # the run reaches none of its sites: nothing to probe, the unprobed run is the verdict
        took = time.perf_counter() - start
        left = tuple(SiteRun(_link_address(s, bias), s, 0, 0, 0) for s in unreached)
        return [DesignRun(entry.content_key(), sha256, d, "ok", sites=left, wall_s=took) for d in designs]
    request = CheckRequest(entry.binary, argv, env, specs=specs, designs=tuple(designs), options=options,
                           stdin=entry.stdin, watcher=ReadBack, lenient=True)
    reports = run_check(request)
    took = (time.perf_counter() - start) / len(reports)
    return [_design_run(entry.content_key(), sha256, report, specs, unreached, took) for report in reports]


def _design_run(key: str, sha256: str, report: DesignReport, specs: tuple[str, ...], unreached: list[str],
                took: float) -> DesignRun:
    """One design's report as the survey keeps it: each site's hits, flagged hits and read-backs."""
    from emu.violations import Check

    if report.result is None or not isinstance(report.watch, ReadBack):  # the harness could not run it
        return DesignRun(key, sha256, report.design, "error", report.error, wall_s=took)
    flagged = report.violations.hits_flagged(Check.REDZONE)
    read_back = report.watch.counts()
    bias = report.watch.bias
    runs = [_site(p, bias, flagged, read_back) for p in report.result.probes]
    attached = {r.spec for r in runs}
    runs += [SiteRun(_link_address(s, bias), s, 0, 0, 0, refused=True) for s in specs
             if s not in attached and s.rpartition(":")[2].startswith("0x")]
    runs += [SiteRun(_link_address(s, bias), s, 0, 0, 0) for s in unreached]
    stopped = report.limit
    status, error = ("ok", None) if stopped is None else (stopped.ending.value, stopped.message)
    return DesignRun(key, sha256, report.design, status, error, report.same_output, report.divergence, tuple(runs),
                     took)


def _specs(entry: Entry, sites: tuple[int, ...] | None, libraries: LibrarySites, reached: Reached,
           bias: int) -> tuple[tuple[str, ...], list[str]]:
    """The specs to attach, and those of sites left out: where the unprobed run ran no code (each
    probe costs the run a code hook that Unicorn checks while translating every instruction, so
    tens of thousands of never-reached sites would multiply the run's time)."""
    import os

    from emu.survey.libraries import is_reached

    def split(path: str, addresses: tuple[int, ...], prefix: str, shift: int) -> None:
        ran = reached.get(os.path.realpath(path))
        for a in addresses:
            wanted = not reached or (ran is not None and is_reached(ran, a))
            (attach if wanted else left_out).append(f"{prefix}{a + shift:#x}")

    attach: list[str] = [] if sites is not None else list(entry.probes or ())
    left_out: list[str] = []
    if sites is not None:
        split(entry.binary, sites, "uprobe:", bias)
    for path, addresses in libraries:
        split(path, addresses, f"uprobe:{path}:", 0)
    return tuple(attach), left_out


def _site(probe: dict[str, Any], bias: int, flagged: Counter[int], read_back: Counter[int]) -> SiteRun:
    """A probe's counts; a library's (installed where the first process mapped it, or never: None) by
    the link-time address its spec names."""
    spec = str(probe["spec"])
    address = probe["address"]
    if address is None:  # a library's probe never installed: not mapped, or the design refused it there
        return SiteRun(_link_address(spec, bias), spec, int(probe["hits"]), 0, 0, refused="refused" in probe)
    link = _link_address(spec, bias) if library_file(spec) else int(address) - bias
    return SiteRun(link, spec, int(probe["hits"]), flagged[int(address)], read_back[int(address)])


def library_file(spec: str) -> str | None:
    """The file a ``uprobe:FILE:0xADDR`` spec names (None: the executable's ``uprobe:0xADDR`` or a symbol)."""
    path, _, target = spec.partition(":")[2].rpartition(":")
    return path if path and target.startswith("0x") else None


def _link_address(spec: str, bias: int) -> int:
    """The link-time address of a by-address spec: a library's as written, the executable's less its bias."""
    address = int(spec.rpartition(":")[2], 16)
    return address if library_file(spec) else address - bias

