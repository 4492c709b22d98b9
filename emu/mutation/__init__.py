"""Mutation testing of the verifiers: small flaws put into an optimizing design through the design
API, each run on a program that keeps everything live across its probe sites (elf_samples/
live_state: every GPR, the flags, xmm0-15, x87, the red zone, the frame above rsp, a global).

A mutant is *killed* when a verifier reports something the unmutated design's run does not (for
a clean design: anything at all; linux-6.18 clobbers the red zone by design, so its baseline
already has red-zone violations, and a mutant of it is killed only by a violation the baseline
lacks, compared by what was found, not where in the trampoline the writer sits). It *survives*
when nothing new is reported but the run differs observably from the unmutated design's (output,
exit status): the verifiers missed what the program saw. A mutant neither killed nor observed is
*unseen* (its flaw changed nothing this program can see; listed, not scored). Equivalent
mutants (a deeper lea with the matching sp_skip, a leading nop, one more saved register) must
be clean: a violation or a changed output there is a *false alarm*. The score of a design is
killed / (killed + survived), and 100% needs no false alarm either.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emu.designs import Design
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.machine import Machine, RunOptions
from emu.mutation.operators import (
    LIVE_STATE,
    OPERATORS,
    Mutant,
    Target,
    code_of,
    instructions,
    mutants,
)
from emu.verify.session import DEFAULT_VERIFIERS, Verifier, VerifySession
from emu.violations import Violation

__all__ = ["LIVE_STATE", "OPERATORS", "DesignScore", "Mutant", "Outcome", "Result", "Run", "Target", "code_of",
           "global_address", "instructions", "judge", "mutants", "optimizing", "run_both", "run_once",
           "score_design", "score_table", "sites_of", "survivors_text"]


class Outcome(enum.Enum):
    KILLED = "killed"
    SURVIVED = "survived"
    UNSEEN = "unseen"
    CLEAN = "clean"  # an equivalent mutant, as it must be
    FALSE_ALARM = "false alarm"  # an equivalent mutant something flagged


@dataclass(frozen=True, slots=True)
class Run:
    signatures: frozenset[tuple[Any, ...]]
    violations: tuple[Violation, ...]
    stdout: bytes
    exit_status: int


@dataclass(frozen=True, slots=True)
class Result:
    mutant: Mutant
    outcome: Outcome
    new: tuple[Violation, ...] = ()  # what the verifiers reported that the baseline did not
    observed: str = ""  # how the run differed from the baseline's, if it did

    def to_json(self) -> dict[str, Any]:
        return {"operator": self.mutant.operator, "change": self.mutant.change, "outcome": self.outcome.value,
                "equivalent": self.mutant.equivalent, "code": code_of(self.mutant.design),
                "observed": self.observed, "new_violations": [v.to_json() for v in self.new[:5]]}


@dataclass(slots=True)
class DesignScore:
    design: str
    results: list[Result] = field(default_factory=list)

    def count(self, outcome: Outcome, operator: str | None = None) -> int:
        return sum(1 for r in self.results if r.outcome is outcome and operator in (None, r.mutant.operator))

    def score(self, operator: str | None = None) -> float | None:
        killed, survived = self.count(Outcome.KILLED, operator), self.count(Outcome.SURVIVED, operator)
        return killed / (killed + survived) if killed + survived else None

    @property
    def perfect(self) -> bool:
        return self.count(Outcome.SURVIVED) == 0 and self.count(Outcome.FALSE_ALARM) == 0

    def operators(self) -> list[str]:
        return list(dict.fromkeys(r.mutant.operator for r in self.results))


# ------------------------------------------------------------------------------ running them
def _signature(v: Violation) -> tuple[Any, ...]:
    """What a violation found, without where in the trampoline its writer sits."""
    kept = tuple(sorted((k, str(val)) for k, val in v.detail.items() if k not in ("writer", "path", "exits")))
    return v.kind.value, v.probe, v.hit, kept


def sites_of(design: Design) -> tuple[str, ...]:
    """The entry site the design optimizes, and the return of ret_fn (its return trampoline's path)."""
    return ("uprobe:nop10_site" if design.site_length == 10 else "uprobe:nop5_site", "uretprobe:ret_fn")


def _looks(_hit: Hit) -> None:
    """A handler that only looks: the kernel takes its full path (pt_regs from the saved words and back)."""


def run_once(design: Design, target: Target, verifiers: tuple[Verifier, ...] = DEFAULT_VERIFIERS,
             handler: bool = False) -> Run:
    """One run of ``target`` under ``design`` with its sites probed (``handler``: by a consumer with
    a handler, else a counting one: the kernel's fast path)."""
    m = Machine(target.path, [target.path, *target.args], {}, RunOptions(design=design), io := GuestIO.captured())
    for spec in sites_of(design):
        m.attach(spec, Consumer(handler=_looks, ret_handler=_looks) if handler else None)
    session = VerifySession(m, verifiers)
    result = m.run()
    session.finish(result.message or result.ending.value, killed=result.signal is not None)
    tag = "handler" if handler else "counting"
    return Run(frozenset((tag, *_signature(v)) for v in session.violations), tuple(session.violations),
               bytes(io.out), result.exit_status)


def run_both(design: Design, target: Target, verifiers: tuple[Verifier, ...] = DEFAULT_VERIFIERS) -> tuple[Run, Run]:
    """With a counting consumer, then with one with a handler: each path of the kernel gets its turn."""
    return run_once(design, target, verifiers), run_once(design, target, verifiers, handler=True)


def judge(mutant: Mutant, runs: tuple[Run, Run], baselines: tuple[Run, Run]) -> Result:
    new: tuple[Violation, ...] = ()
    observed = ""
    for run, baseline, tag in zip(runs, baselines, ("counting", "handler"), strict=True):
        new += tuple(v for v in run.violations if (tag, *_signature(v)) not in baseline.signatures)
        if not observed and (run.stdout != baseline.stdout or run.exit_status != baseline.exit_status):
            observed = (f"{tag} consumer: output {run.stdout!r} exit {run.exit_status} "
                        f"(unmutated: {baseline.stdout!r} exit {baseline.exit_status})")
    if mutant.equivalent:
        return Result(mutant, Outcome.FALSE_ALARM if new or observed else Outcome.CLEAN, new, observed)
    if new:
        return Result(mutant, Outcome.KILLED, new, observed)
    return Result(mutant, Outcome.SURVIVED if observed else Outcome.UNSEEN, new, observed)


def global_address(path: str) -> int:
    m = Machine(path, [path], {}, RunOptions(), GuestIO.captured())
    found = m.resolver.symbols.get("live_global")
    return found[0] if found else 0


def score_design(design: Design, target: Target | None = None, operators: list[str] | None = None,
                 on_result: Callable[[Result], None] | None = None,
                 verifiers: tuple[Verifier, ...] = DEFAULT_VERIFIERS) -> DesignScore:
    """Every mutant of ``design`` run on ``target`` (default live_state) with ``verifiers``, judged."""
    target = target or Target(global_address=global_address(LIVE_STATE))
    baselines = run_both(design, target, verifiers)
    out = DesignScore(design.name)
    for mutant in mutants(design, target, operators):
        result = judge(mutant, run_both(mutant.design, target, verifiers), baselines)
        out.results.append(result)
        if on_result is not None:
            on_result(result)
    return out


def score_table(scores: list[DesignScore]) -> str:
    from emu.render import table

    rows: list[tuple[str, ...]] = [("design", "operator", "mutants", "killed", "survived", "unseen", "equivalent ok",
                                    "false alarms", "score")]
    for s in scores:
        for op in [*s.operators(), None]:
            mine = [r for r in s.results if op in (None, r.mutant.operator)]
            score = s.score(op)
            rows.append((s.design, op or "(all)", str(len(mine)), str(s.count(Outcome.KILLED, op)),
                         str(s.count(Outcome.SURVIVED, op)), str(s.count(Outcome.UNSEEN, op)),
                         str(s.count(Outcome.CLEAN, op)), str(s.count(Outcome.FALSE_ALARM, op)),
                         "-" if score is None else f"{100 * score:.0f}%"))
    return table(rows)


def survivors_text(scores: list[DesignScore]) -> list[str]:
    """Every mutant that is not as it should be (survived, unseen, false alarm), with its code."""
    lines = []
    for s in scores:
        for r in s.results:
            if r.outcome in (Outcome.SURVIVED, Outcome.UNSEEN, Outcome.FALSE_ALARM):
                lines.append(f"{s.design}: {r.outcome.value}: {r.mutant.operator}: {r.mutant.change}")
                lines.append(f"    {code_of(r.mutant.design)}")
                if r.observed:
                    lines.append(f"    observed: {r.observed}")
                lines += [f"    {v.line()}" for v in r.new[:3]]
    return lines


def optimizing(designs: dict[str, Design]) -> list[Design]:
    return [d for d in designs.values() if d.optimizes]

