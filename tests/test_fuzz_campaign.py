"""Campaigns and the fuzz/replay commands: partitioning, jobs, shards, --json, Ctrl-C, exit codes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
from pathlib import Path

import pytest

from emu.cli import main
from emu.errors import UsageError
from emu.fuzz import campaign as campaign_mod
from emu.fuzz.campaign import CampaignConfig, CaseDone, CaseWork, Stats, run_campaign
from emu.fuzz.elfwriter import file_offset
from emu.fuzz.findings import load_record
from emu.fuzz.oracle import reference_outcome
from emu.fuzz.partition import Partition, parse_shard
from emu.native import NativeProbe, run_native
from emu.native import available as native_available


def quiet(_stats: Stats) -> None:
    pass


def test_shards_and_workers_split_a_campaign_exactly_once() -> None:
    seen = [i for s in range(3) for w in range(2) for i in Partition(5, 40, s, 3, w, 2).indices()]
    assert sorted(seen) == list(range(5, 45))


@pytest.mark.parametrize("text", ["2/2", "-1/3", "a/b", "3", "0/0"])
def test_bad_shards_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        parse_shard(text)


def test_two_jobs_find_what_one_job_finds(tmp_path: Path) -> None:
    one = run_campaign(CampaignConfig(("linux-6.18", "jmp-slots"), seed=4, cases=60, out=str(tmp_path / "a")), quiet)
    two = run_campaign(CampaignConfig(("linux-6.18", "jmp-slots"), seed=4, cases=60, jobs=2, out=str(tmp_path / "b")),
                       quiet)
    assert one.cases == two.cases == 60
    assert one.findings == two.findings > 0
    assert one.first_finding_case == two.first_finding_case
    assert one.designs["jmp-slots"].findings == 0


def test_shards_merge_to_the_whole_campaign(tmp_path: Path) -> None:
    whole = run_campaign(CampaignConfig(("linux-6.18",), seed=6, cases=40, out=str(tmp_path)), quiet)
    parts = [run_campaign(CampaignConfig(("linux-6.18",), seed=6, cases=40, shard=(i, 2), out=str(tmp_path)), quiet)
             for i in range(2)]
    assert sum(p.cases for p in parts) == 40
    assert sum(p.findings for p in parts) == whole.findings
    assert min(p.first_finding_case for p in parts if p.first_finding_case is not None) == whole.first_finding_case


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    real = CaseWork.__call__

    def call(self: CaseWork, worker: int, i: int) -> CaseDone:
        if i == index:
            raise KeyboardInterrupt
        return real(self, worker, i)

    monkeypatch.setattr(CaseWork, "__call__", call)


def test_ctrl_c_keeps_the_findings_and_knows_where_to_resume(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _interrupt_at(monkeypatch, 30)
    stats = run_campaign(CampaignConfig(("linux-6.18",), seed=0, cases=100, out=str(tmp_path)), quiet)
    assert stats.interrupted and stats.cases == 30 and stats.resume_index() == 30
    assert stats.findings > 0 and list(tmp_path.glob("*.json"))


def test_ctrl_c_with_workers_stops_them_and_keeps_their_cases(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = campaign_mod._drain
    calls = {"n": 0}

    def drain(*args: object) -> None:
        calls["n"] += 1
        if calls["n"] == 20:
            raise KeyboardInterrupt
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(campaign_mod, "_drain", drain)
    stats = run_campaign(CampaignConfig(("jmp-slots",), seed=0, cases=100_000, jobs=2, out=str(tmp_path)), quiet)
    assert stats.interrupted and 0 < stats.cases < 100_000
    resume = stats.resume_index()
    assert resume is not None and resume <= stats.cases + 1


def test_cli_ctrl_c_prints_the_resume_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _interrupt_at(monkeypatch, 12)
    status = main(["fuzz", "--cases", "50", "--seed", "3", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 130
    assert "resume with: uprobe-emu fuzz --kernel linux-6.18 --seed 3 --start 12 --cases 38" in err


def test_cli_json_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "f.json"
    assert main(["fuzz", "--kernel", "jmp-slots", "--cases", "40", "--json", str(out), "--out", str(tmp_path)]) == 0
    clean = json.loads(out.read_text())
    assert (clean["cases"], clean["findings"], clean["first_finding_case"]) == (40, 0, None)
    assert isinstance(clean["cases_per_s"], float) and clean["cases_per_s"] > 0
    assert main(["fuzz", "--cases", "40", "--json", str(out), "--out", str(tmp_path)]) == 1
    found = json.loads(out.read_text())
    assert found["findings"] > 0 and isinstance(found["first_finding_case"], int)
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["design", "cases", "findings", "first", "finding", "saved", "fewest",
                                             "stores"]


@pytest.mark.parametrize("argv", [
    ["fuzz", "--cases", "0"], ["fuzz", "--cases", "5", "--time", "1"], ["fuzz", "--kernel", "bogus"],
    ["fuzz", "--shard", "2/2"], ["fuzz", "--jobs", "0"], ["fuzz", "--seed", "-1"], ["replay"],
    ["replay", "/nonexistent.json"], ["replay", "--kernel", "bogus", "x.json"],
    ["fuzz", "--cases", "1", "--out", "/proc/no/such/dir"],
])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_replay_says_whether_a_finding_still_reproduces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["fuzz", "--cases", "20", "--out", str(tmp_path)])
    record = sorted(tmp_path.glob("*.json"))[0]
    assert main(["replay", str(record)]) == 1
    assert "reproduces" in capsys.readouterr().out
    assert main(["replay", "--kernel", "jmp-slots", str(record)]) == 0
    assert main(["replay", str(record.with_suffix(".elf"))]) == 1
    case = load_record(str(record)).case
    native = subprocess.run([str(record.with_suffix(".elf"))], capture_output=True, timeout=10)
    assert native.returncode == 0
    assert native.stdout == reference_outcome(case, "int3").results  # the saved ELF, run for real
    (tmp_path / "junk.json").write_text("{}")
    assert main(["replay", str(tmp_path / "junk.json")]) == 2


@pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
def test_a_saved_618_finding_reproduces_on_the_real_kernel(tmp_path: Path) -> None:
    main(["fuzz", "--cases", "50", "--seed", "0", "--out", str(tmp_path)])
    for record_path in sorted(tmp_path.glob("*.json")):
        record = json.loads(record_path.read_text())
        if not record["differences"]:
            continue
        elf = record["elf"]
        plain = subprocess.run([elf], capture_output=True, timeout=10)
        probe = NativeProbe(elf, file_offset(int(record["site"]["address"], 16)))
        probed = run_native([elf], [probe])
        assert plain.returncode == probed.returncode == 0
        assert plain.stdout != probed.stdout, f"{record_path.name}: the real kernel keeps the red zone"
        assert probed.counts == (2,)
        return
    pytest.fail("no saved finding with an observable difference")


def test_a_timed_campaign_stops_on_time_and_saves_a_replay_script(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = itertools.count()  # a clock that moves 2 ms a reading: the case count does not depend on the machine's speed
    monkeypatch.setattr("emu.fuzz.campaign.time.perf_counter", lambda: next(ticks) * 0.002)
    out = tmp_path / "t.json"
    assert main(["fuzz", "--time", "1.5", "--json", str(out), "--out", str(tmp_path)]) == 1
    report = json.loads(out.read_text())
    assert report["cases"] > 10 and report["findings"] > 0
    script = sorted(tmp_path.glob("*.replay.sh"))[0]
    assert script.read_text().splitlines()[1] == f"uprobe-emu replay {script.with_name(script.name[:-10] + '.json')}"


def test_workers_batch_clean_cases_but_send_a_finding_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(campaign_mod, "POLL_S", 3600.0)  # only the size and findings trigger a send
    sent: list[list[CaseDone]] = []
    batcher = campaign_mod.Batcher(sent.append)
    for i in range(campaign_mod.BATCH_CASES - 1):
        batcher(CaseDone(0, i, ()))
    assert sent == []
    batcher(CaseDone(0, 100, ("linux-6.18",)))
    assert len(sent) == 1 and len(sent[0]) == campaign_mod.BATCH_CASES and sent[0][-1].findings
    batcher(CaseDone(0, 101, ()))
    batcher.flush()
    assert [e.index for e in sent[1]] == [101]


def test_tasks_on_an_executor_save_what_one_process_saves(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--scheduler: each share runs as a task that shrinks but writes nothing; the client writes one
    finding per signature, the lowest index, so the saved files are the one-process run's (here the
    executor is inline; test_survey runs it on a real scheduler). Negative control: the shares'
    findings overlap, so writing each task's would save more."""
    from emu import dist

    monkeypatch.setattr(dist, "dask_executor", lambda _scheduler, _jobs: dist.inline)
    config = CampaignConfig(("linux-6.18", "jmp-slots"), seed=4, cases=40, out=str(tmp_path / "one"))
    one = run_campaign(config, quiet)
    tasks = run_campaign(dataclasses.replace(config, jobs=3, scheduler="tcp://x:1", out=str(tmp_path / "tasks")),
                         quiet)
    assert (tasks.cases, tasks.findings, tasks.first_finding_case) == (one.cases, one.findings, one.first_finding_case)
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names and sorted(p.name for p in (tmp_path / "tasks").iterdir()) == names
    for d in config.designs:
        assert [Path(r["json"]).name for r in tasks.designs[d].saved] == [Path(r["json"]).name
                                                                          for r in one.designs[d].saved]
    shrunk = [s.signature for w in range(3) for e in campaign_mod.share(dataclasses.replace(config, jobs=3), w)
              for s in e.shrunk]
    assert len(shrunk) > len(set(shrunk))
