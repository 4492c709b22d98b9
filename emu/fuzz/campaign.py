"""A fuzz campaign: cases by index, each under every chosen design, findings shrunk and saved;
one process, J worker processes (each with its own reusable runners), or J tasks on a Dask
scheduler's workers (emu/dist.py), stoppable with Ctrl-C. Every case of a campaign runs in one
layout, ASLR off or randomized from ``aslr``, in every process and task alike.

On a scheduler each task runs one worker's share and returns its cases with the findings shrunk
but not written (the workers may be other machines); this process writes them, one per signature
(the lowest case index), so the saved findings are the ones a one-process run of the same seed saves.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emu.errors import EmuError
from emu.fuzz.generator import generate
from emu.fuzz.oracle import check_case, reference_outcome
from emu.fuzz.partition import Partition

POLL_S = 0.1
BATCH_CASES = 64  # a worker reports clean cases in batches (a queue message per case costs the parent CPU)


@dataclass(frozen=True, slots=True)
class CampaignConfig:
    designs: tuple[str, ...]
    seed: int = 0
    start: int = 0
    cases: int | None = 1000
    time_s: float | None = None
    jobs: int = 1
    shard: tuple[int, int] = (0, 1)
    out: str = "fuzz-findings"
    scheduler: str | None = None  # tcp://HOST:PORT: the J shares run as tasks on its workers
    aslr: int | None = None  # every case's process laid out from this ASLR seed (emu/fuzz/runner.py); None: off

    def partition(self, worker: int) -> Partition:
        return Partition(self.start, self.cases, self.shard[0], self.shard[1], worker, self.jobs)


@dataclass(frozen=True, slots=True)
class CaseDone:
    worker: int
    index: int
    findings: tuple[str, ...]  # designs under which this case is a finding
    saved: tuple[dict[str, Any], ...] = ()  # records of newly saved (shrunk) findings
    shrunk: tuple[Shrunk, ...] = ()  # new findings shrunk on a task, for the client to write


@dataclass(frozen=True, slots=True)
class Shrunk:
    signature: tuple[str, str, bool, tuple[str, ...]]
    case: Any  # Case: the original
    small: Any  # Case: shrunk
    verdict: Any  # Verdict of the shrunk case


@dataclass
class DesignStats:
    findings: int = 0
    first_case: int | None = None
    saved: list[dict[str, Any]] = field(default_factory=list)
    cases: list[int] = field(default_factory=list)  # the index of every finding, in the order they came


@dataclass
class Stats:
    """What the campaign knows so far (the main process's view)."""

    config: CampaignConfig
    started: float = field(default_factory=time.perf_counter)
    cases: int = 0
    designs: dict[str, DesignStats] = field(default_factory=dict)
    next_index: dict[int, int] = field(default_factory=dict)  # worker -> its first index not done
    interrupted: bool = False
    elapsed: float = 0.0

    def __post_init__(self) -> None:
        self.designs = {d: DesignStats() for d in self.config.designs}
        self.next_index = {w: self.config.partition(w).first() for w in range(self.config.jobs)}

    def record(self, event: CaseDone) -> None:
        self.cases += 1
        self.next_index[event.worker] = self.config.partition(event.worker).next_after(event.index)
        for design in event.findings:
            st = self.designs[design]
            st.findings += 1
            st.cases.append(event.index)
            if st.first_case is None or event.index < st.first_case:
                st.first_case = event.index
        for record in event.saved:
            self.designs[record["design"]].saved.append(record)
        self.elapsed = time.perf_counter() - self.started

    @property
    def findings(self) -> int:
        return sum(s.findings for s in self.designs.values())

    @property
    def first_finding_case(self) -> int | None:
        firsts = [s.first_case for s in self.designs.values() if s.first_case is not None]
        return min(firsts) if firsts else None

    @property
    def rate(self) -> float:
        return self.cases / self.elapsed if self.elapsed > 0 else 0.0

    def resume_index(self) -> int | None:
        """The lowest index some worker has not done (None: a bounded campaign finished)."""
        pending = [i for i in self.next_index.values()
                   if self.config.cases is None or i < self.config.start + self.config.cases]
        return min(pending) if pending else None

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases, "findings": self.findings, "cases_per_s": round(self.rate, 1),
            "first_finding_case": self.first_finding_case, "seed": self.config.seed, "aslr": self.config.aslr,
            "interrupted": self.interrupted, "resume_index": self.resume_index() if self.interrupted else None,
            "designs": {d: {"findings": s.findings, "first_finding_case": s.first_case,
                            "saved": [r["json"] for r in s.saved]} for d, s in self.designs.items()},
        }


class CaseWork:
    """Runs one case under every design of the campaign; shrinks and saves new kinds of findings
    (``write`` False: shrinks them and hands them back in CaseDone.shrunk)."""

    def __init__(self, config: CampaignConfig, write: bool = True) -> None:
        self.config = config
        self.write = write
        self.seen: set[tuple[str, str, bool, tuple[str, ...]]] = set()

    def __call__(self, worker: int, index: int) -> CaseDone:
        from emu.fuzz.findings import save_finding, shrink_finding, signature  # the shrinker only when needed

        case = generate(self.config.seed, index)
        reference = reference_outcome(case, self.config.designs[0], self.config.aslr)
        found, saved, shrunk = [], [], []
        for design in self.config.designs:
            verdict = check_case(case, design, reference, self.config.aslr)
            if not verdict.finding:
                continue
            found.append(design)
            sig = signature(case, verdict)
            if sig in self.seen:
                continue
            self.seen.add(sig)
            if self.write:
                saved.append(saved_record(design, index, save_finding(self.config.out, case, verdict)))
            else:
                shrunk.append(Shrunk(sig, case, *shrink_finding(case, verdict)))
        return CaseDone(worker, index, tuple(found), tuple(saved), tuple(shrunk))


def saved_record(design: str, index: int, finding: Any) -> dict[str, Any]:
    return {"design": design, "index": index, "json": finding.json_path, "stores": len(finding.case.stores),
            "replay": finding.replay_command, "summary": finding.verdict.summary()}


Emit = Callable[[CaseDone], None]


def work(config: CampaignConfig, worker: int, emit: Emit, stop: Callable[[], bool], write: bool = True) -> None:
    """One worker's share, in order, until it is done, the time is up, or ``stop()`` says so."""
    deadline = time.perf_counter() + config.time_s if config.time_s else None
    run_case = CaseWork(config, write)
    for index in config.partition(worker).indices():
        if stop() or (deadline is not None and time.perf_counter() >= deadline):
            return
        emit(run_case(worker, index))


class Batcher:
    """Sends a worker's CaseDone events in lists: at once for a finding, else every BATCH_CASES cases
    or POLL_S seconds, so the progress display stays live."""

    def __init__(self, put: Callable[[list[CaseDone]], None]) -> None:
        self.put = put
        self.pending: list[CaseDone] = []
        self.sent = time.perf_counter()

    def __call__(self, event: CaseDone) -> None:
        self.pending.append(event)
        now = time.perf_counter()
        if event.findings or len(self.pending) >= BATCH_CASES or now - self.sent >= POLL_S:
            self.flush()
            self.sent = now

    def flush(self) -> None:
        if self.pending:
            self.put(self.pending)
            self.pending = []


def _worker_main(config: CampaignConfig, worker: int, events: Any, stop_event: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it tells us through stop_event
    batcher = Batcher(events.put)
    try:
        work(config, worker, batcher, stop_event.is_set)
    except Exception as exc:  # a harness bug: report it instead of hanging the parent
        batcher.flush()
        events.put(("error", worker, f"{type(exc).__name__}: {exc}"))
    batcher.flush()
    events.put(("done", worker, None))


def run_campaign(config: CampaignConfig, on_progress: Callable[[Stats], None]) -> Stats:
    """Run the campaign; Ctrl-C (KeyboardInterrupt) stops it and keeps what was found."""
    stats = Stats(config)

    def emit(event: CaseDone) -> None:
        stats.record(event)
        on_progress(stats)

    try:
        if config.scheduler:
            _run_tasks(config, stats, on_progress)
        elif config.jobs == 1:
            work(config, 0, emit, lambda: False)
        else:
            _run_workers(config, stats, on_progress)
    except KeyboardInterrupt:
        stats.interrupted = True
    stats.elapsed = time.perf_counter() - stats.started
    return stats


def share(config: CampaignConfig, worker: int) -> list[CaseDone]:
    """Worker ``worker``'s share of the campaign, as one task: its cases, findings shrunk, none written."""
    events: list[CaseDone] = []
    work(config, worker, events.append, lambda: False, write=False)
    return events


def _run_tasks(config: CampaignConfig, stats: Stats, on_progress: Callable[[Stats], None]) -> None:
    """The J shares as tasks on the scheduler; the findings written here, deduplicated across them."""
    from emu.dist import dask_executor

    shrunk: list[tuple[int, str, Shrunk]] = []
    try:
        with dask_executor(config.scheduler, config.jobs)() as pool:
            for events in pool.map(share, [(config, w) for w in range(config.jobs)]):
                for event in events:
                    stats.record(event)
                    shrunk += [(event.index, s.verdict.design, s) for s in event.shrunk]
                on_progress(stats)
    finally:  # what the finished tasks found is kept, Ctrl-C or not
        _write_shrunk(config, stats, shrunk)


def _write_shrunk(config: CampaignConfig, stats: Stats, shrunk: list[tuple[int, str, Shrunk]]) -> None:
    from emu.fuzz.findings import write_finding

    written: set[tuple[str, str, bool, tuple[str, ...]]] = set()
    for index, design, s in sorted(shrunk, key=lambda t: (t[0], config.designs.index(t[1]))):
        if s.signature not in written:
            written.add(s.signature)
            finding = write_finding(config.out, s.case, s.small, s.verdict)
            stats.designs[design].saved.append(saved_record(design, index, finding))


def _run_workers(config: CampaignConfig, stats: Stats, on_progress: Callable[[Stats], None]) -> None:
    ctx = multiprocessing.get_context("fork")
    events, stop_event = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_worker_main, args=(config, w, events, stop_event), daemon=True)
             for w in range(config.jobs)]
    for p in procs:
        p.start()
    running: set[int] = set(range(config.jobs))
    errors: list[str] = []
    try:
        while running:
            _drain(events, stats, running, errors, on_progress)
    except KeyboardInterrupt:
        stop_event.set()
        while running:  # let each worker finish its case and report it
            _drain(events, stats, running, errors, on_progress)
        raise
    finally:
        for p in procs:
            p.join(timeout=5)
    if errors:
        raise EmuError("; ".join(errors))


def _drain(events: Any, stats: Stats, running: set[int], errors: list[str], on_progress: Callable[[Stats], None]) -> None:
    try:
        event = events.get(timeout=POLL_S)
    except queue.Empty:
        return
    if isinstance(event, list):
        for done in event:
            stats.record(done)
        on_progress(stats)
    elif event[0] == "error":
        errors.append(f"worker {event[1]}: {event[2]}")
    else:
        running.discard(event[1])
