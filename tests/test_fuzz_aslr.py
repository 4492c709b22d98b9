"""`fuzz --aslr SEED`: every case's process laid out from the seed, in one process, in --jobs workers,
in scheduler tasks and in a shard; findings record the seed and replay in that layout."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emu import abi
from emu.cli import main
from emu.cpu import Reg
from emu.errors import EXIT_HARNESS_ERROR
from emu.fuzz import oracle
from emu.fuzz.campaign import CampaignConfig, CaseDone, CaseWork, Stats, run_campaign
from emu.fuzz.case import FLAGS_BASE, Case, Store, StoreKind
from emu.fuzz.codegen import program
from emu.fuzz.runner import CaseRunner

# A nop5 site under linux-6.18: optimized on the first hit, so the second hit's call clobbers rsp-8;
# the uretprobe maps [uprobes] too. A finding under every layout.
CLOBBERED = Case(0, 0, "nop5", "nop1", (Store(8, 8, StoreKind.MOV, 0x1122334455667788),), (0,) * 15, FLAGS_BASE,
                 uretprobe=True)
SPECIAL = ("[stack]", "[vdso]", "[uprobes]", "[uprobes-trampoline]")


def quiet(_stats: Stats) -> None:
    pass


class LayoutLog:
    """Every (pid, aslr) the oracle asks a runner for, in this process or its forked workers (a file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.clear()

    def clear(self) -> None:
        self.path.write_text("")

    def add(self, aslr: int | None) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"{os.getpid()} {aslr}\n")

    def seen(self) -> set[tuple[int, int | None]]:
        pairs = (line.split() for line in self.path.read_text().splitlines())
        return {(int(pid), None if aslr == "None" else int(aslr)) for pid, aslr in pairs}

    def seeds(self) -> set[int | None]:
        return {aslr for _pid, aslr in self.seen()}


@pytest.fixture
def layouts_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> LayoutLog:
    log = LayoutLog(tmp_path / "layouts.log")
    real = oracle.runner_for

    def spy(design: str, aslr: int | None = None) -> CaseRunner:
        log.add(aslr)
        return real(design, aslr)

    monkeypatch.setattr(oracle, "runner_for", spy)
    return log


def run_case(runner: CaseRunner, case: Case) -> tuple[bytes, list[str]]:
    """The probed run's result blocks and violation lines (after the unprobed run, as the oracle does)."""
    prog = program(case)
    assert runner.reference(case, prog).ending == "exited"
    outcome, violations = runner.probed(case, prog)
    return outcome.results, violations


def special_mappings(runner: CaseRunner) -> dict[str, tuple[int, int]]:
    return {vma.name: (vma.start, vma.end) for vma in runner.machine.mem if vma.name in SPECIAL}


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """A --json report without what differs between two runs of one campaign: the rate, the out dir."""
    designs = {d: {**s, "saved": [Path(p).name for p in s["saved"]]} for d, s in report["designs"].items()}
    return {**report, "cases_per_s": None, "designs": designs}


def records(out: Path) -> dict[str, dict[str, Any]]:
    """The saved findings' records by file name, less the fields that hold the out dir."""
    paths = ("elf", "replay", "native")
    return {p.name: {k: v for k, v in json.loads(p.read_text()).items() if k not in paths}
            for p in sorted(out.glob("*.json"))}


def fuzz(out: Path, *extra: str) -> dict[str, Any]:
    out.mkdir(exist_ok=True)
    report = out / "report.json"
    main(["fuzz", "--cases", "30", "--out", str(out / "findings"), "--json", str(report), *extra])
    return dict(json.loads(report.read_text()))


# ------------------------------------------------------------- the layout
def test_two_seeds_lay_the_case_process_out_apart_and_one_seed_alike() -> None:
    """The stack (so the rsp each case runs on) and the vDSO follow the seed; the same seed gives the
    same layout in a new process. The kernel's pages do not follow it: the trampoline page is the free
    page nearest the fixed site, [uprobes] sits at its hint below TASK_SIZE once the stack has moved."""
    seeds = {"7": 7, "7 again": 7, "8": 8, "off": None}
    runners = {name: CaseRunner("linux-6.18", aslr) for name, aslr in seeds.items()}
    results = {name: run_case(runner, CLOBBERED) for name, runner in runners.items()}
    maps = {name: special_mappings(runner) for name, runner in runners.items()}
    assert maps["7"] == maps["7 again"] and runners["7"].sp == runners["7 again"].sp
    for other in ("8", "off"):
        assert maps["7"]["[stack]"] != maps[other]["[stack]"] and maps["7"]["[vdso]"] != maps[other]["[vdso]"]
        assert runners["7"].sp != runners[other].sp
    assert maps["off"]["[stack]"][1] == abi.STACK_TOP > maps["7"]["[stack]"][1]
    for name, runner in runners.items():
        start, end = maps[name]["[stack]"]
        assert start < runner.sp < end, name
        assert runner.machine.cpu.read(Reg.RSP) == runner.sp, name  # where the driver ended: it ran on that stack
    assert len({m["[uprobes-trampoline]"] for m in maps.values()}) == 1
    assert maps["7"]["[uprobes]"] == maps["8"]["[uprobes]"] == (abi.TASK_SIZE - abi.PAGE_SIZE, abi.TASK_SIZE)
    assert maps["off"]["[uprobes]"] != maps["7"]["[uprobes]"]
    # the case computes the same wherever its stack is, and 6.18 clobbers its red zone in every layout
    assert len({r for r, _v in results.values()}) == 1
    assert all(any(v.startswith("redzone:") for v in violations) for _r, violations in results.values())


@settings(max_examples=12, deadline=None)
@given(aslr=st.integers(0, 2**64 - 1))
def test_any_seed_runs_a_case_as_aslr_off_does(aslr: int) -> None:
    """The driver starts from the randomized entry sp (any page offset arch_align_stack leaves): the
    outputs and the verifiers' lines, all sp-relative, are those of the unrandomized process."""
    assert run_case(CaseRunner("linux-6.18", aslr), CLOBBERED) == run_case(oracle.runner_for("linux-6.18"), CLOBBERED)


# ------------------------------------------------------------- the campaign
def test_a_seeded_campaign_gives_the_same_findings_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         layouts_used: LayoutLog) -> None:
    """The second run builds its processes anew. Negative control: another campaign seed differs."""
    first = fuzz(tmp_path / "a", "--aslr", "7")
    monkeypatch.setattr(oracle, "_RUNNERS", {})
    second = fuzz(tmp_path / "b", "--aslr", "7")
    assert first["aslr"] == 7 and first["findings"] > 0
    assert comparable(first) == comparable(second)
    assert records(tmp_path / "a" / "findings") == records(tmp_path / "b" / "findings")
    assert all(name.endswith("-aslr7.json") for name in records(tmp_path / "a" / "findings"))
    assert layouts_used.seeds() == {7}
    other = fuzz(tmp_path / "c", "--aslr", "7", "--seed", "1")
    assert comparable(other)["designs"] != comparable(first)["designs"]


@contextmanager
def pickling_pool() -> Iterator[Any]:
    """A scheduler's round trip without one: each task and its result pickled, as Dask sends them."""

    class Pool:
        def map(self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]]) -> Iterator[Any]:
            return (pickle.loads(pickle.dumps(fn(*pickle.loads(pickle.dumps(task))))) for task in tasks)

    yield Pool()


@pytest.mark.parametrize("split", [{"jobs": 2}, {"jobs": 2, "scheduler": "tcp://x:1"}, {"shard": (1, 2)}],
                         ids=["jobs", "scheduler", "shard"])
def test_workers_tasks_and_shards_use_the_seed(split: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               layouts_used: LayoutLog) -> None:
    """Each split runs its cases in the seed's layout (the workers are other processes) and finds what one
    process finds on the same indices. Negative control: the same split without --aslr runs with it off."""
    from emu import dist

    monkeypatch.setattr(dist, "dask_executor", lambda _scheduler, _jobs: pickling_pool)
    one = CampaignConfig(("linux-6.18", "jmp-slots"), seed=2, cases=30, aslr=7, out=str(tmp_path / "one"))
    config = dataclasses.replace(one, **split, out=str(tmp_path / "split"))
    whole = run_campaign(one, quiet)
    layouts_used.clear()
    parted = run_campaign(config, quiet)
    assert layouts_used.seeds() == {7}
    if split.get("jobs") and not split.get("scheduler"):
        assert len({pid for pid, _aslr in layouts_used.seen()} - {os.getpid()}) == 2
    indices = {i for worker in range(config.jobs) for i in config.partition(worker).indices()}
    assert parted.findings > 0
    for design in one.designs:
        assert sorted(parted.designs[design].cases) == [i for i in whole.designs[design].cases if i in indices]
    assert all(r["json"].endswith("-aslr7.json") for s in parted.designs.values() for r in s.saved)
    layouts_used.clear()
    run_campaign(dataclasses.replace(config, aslr=None), quiet)
    assert layouts_used.seeds() == {None}


def test_the_resume_command_keeps_the_seed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C at case 12 prints a command that resumes the campaign in the same layout (negative
    control: without --aslr the command has none)."""
    real = CaseWork.__call__
    interrupt = {"at": 12}

    def call(self: CaseWork, worker: int, index: int) -> CaseDone:
        if index == interrupt["at"]:
            raise KeyboardInterrupt
        return real(self, worker, index)

    monkeypatch.setattr(CaseWork, "__call__", call)
    assert main(["fuzz", "--cases", "20", "--aslr", "7", "--out", str(tmp_path)]) == 130
    argv = shlex.split(capsys.readouterr().err.split("resume with: ")[1])
    assert argv[argv.index("--aslr") + 1] == "7" and argv[argv.index("--start") + 1] == "12"
    interrupt["at"] = -1
    report = tmp_path / "rest.json"
    assert main([*argv[1:], "--json", str(report)]) == 1
    rest = json.loads(report.read_text())
    assert (rest["aslr"], rest["cases"]) == (7, 8)
    interrupt["at"] = 12
    assert main(["fuzz", "--cases", "20", "--out", str(tmp_path)]) == 130
    assert "--aslr" not in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", str(2**64), "seven", "1.5"])
def test_a_bad_aslr_seed_is_one_line_and_exit_2(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--cases", "1", "--aslr", value]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--aslr" in err and "Traceback" not in err


def test_the_largest_seed_is_taken(tmp_path: Path) -> None:
    """The negative control of the test above: 2**64-1 is a seed."""
    assert fuzz(tmp_path, "--aslr", str(2**64 - 1))["aslr"] == 2**64 - 1


# ------------------------------------------------------------- findings and replay
@pytest.fixture
def finding(tmp_path: Path) -> Path:
    """A linux-6.18 finding saved by a campaign under --aslr 7 (case 1 of seed 0 is one)."""
    assert main(["fuzz", "--cases", "2", "--aslr", "7", "--out", str(tmp_path / "findings")]) == 1
    return sorted((tmp_path / "findings").glob("*.json"))[0]


def test_a_finding_records_its_seed_and_replays_in_that_layout(finding: Path, layouts_used: LayoutLog,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    record = json.loads(finding.read_text())
    assert record["aslr"] == 7 and finding.name.endswith("-aslr7.json")
    capsys.readouterr()
    assert main(["replay", str(finding)]) == 1
    assert capsys.readouterr().out.startswith("linux-6.18 (--aslr 7): reproduces")
    assert layouts_used.seeds() == {7}
    assert main(["replay", "--kernel", "jmp-slots", str(finding)]) == 0
    assert "jmp-slots (--aslr 7): does not reproduce" in capsys.readouterr().out


@pytest.mark.parametrize("absent", [True, False], ids=["no field", "null"])
def test_a_record_without_a_seed_replays_with_aslr_off(absent: bool, finding: Path, layouts_used: LayoutLog,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A record without the field, or with null, is a finding of a process with ASLR off."""
    record = json.loads(finding.read_text())
    if absent:
        del record["aslr"]
    else:
        record["aslr"] = None
    finding.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["replay", str(finding)]) == 1
    assert capsys.readouterr().out.startswith("linux-6.18: reproduces")
    assert layouts_used.seeds() == {None}


HOSTILE = {"-1": "-1", "2**64": str(2**64), "2**300": str(2**300), "5000 digits": "9" * 5000, "a string": '"7"',
           "a float": "7.0", "true": "true", "infinity": "Infinity", "a list": "[7]", "an object": '{"seed": 7}'}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_aslr_field_is_one_line_and_exit_2(name: str, finding: Path, capfd: pytest.CaptureFixture[str]) -> None:
    finding.write_text(finding.read_text().replace('"aslr": 7', f'"aslr": {HOSTILE[name]}'))
    capfd.readouterr()
    assert main(["replay", str(finding)]) == EXIT_HARNESS_ERROR
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("uprobe-emu: ") and "Traceback" not in err, err
    assert str(finding) in err


@pytest.mark.parametrize("seed", [0, 2**64 - 1])
def test_the_edge_seeds_of_a_record_replay(seed: int, finding: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The negative control of the test above: the bounds themselves are seeds."""
    finding.write_text(finding.read_text().replace('"aslr": 7', f'"aslr": {seed}'))
    assert main(["replay", str(finding)]) == 1
    assert f"(--aslr {seed}): reproduces" in capsys.readouterr().out
