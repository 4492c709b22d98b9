"""`uprobe-emu survey`: walking paths, the SQLite store (resume, no repeated analysis), the CLI,
the report, and a real Dask scheduler with two workers giving the local run's database."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import sample

from emu.cli import main
from emu.designs import DESIGNS, Design
from emu.dist import InlinePool
from emu.survey.engine import survey, walk
from emu.survey.report import markdown, packages, to_json
from emu.survey.store import Store, designs_key

inline = InlinePool()
SMALL = ("survey_cases", "hello_asm", "rmw_sites", "rsb_shapes")  # -nostdlib: a few functions each
ALL = list(DESIGNS.values())
R = TypeVar("R")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Four small ELF files, a copy of one, a text file, a FIFO and a dangling symlink."""
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    for name in SMALL:
        shutil.copy(sample(name), root / ("sub" if name == "rmw_sites" else "") / name)
    shutil.copy(sample("survey_cases"), root / "sub" / "copy_of_cases")
    (root / "notes.txt").write_text("not an ELF file\n")
    os.mkfifo(root / "fifo")
    (root / "dangling").symlink_to(root / "nowhere")
    return root


def _store(tmp_path: Path, designs: Sequence[Design] = ALL) -> Store:
    return Store(str(tmp_path / "s.sqlite"), designs_key(designs))


def test_walk_counts_everything(tree: Path) -> None:
    found = walk([str(tree), str(tree / "missing")])
    assert found.counts == {"files": 6, "not-elf": 1, "special": 1, "links": 1, "missing": 1}
    assert len(found.elf) == 5 and len(set(found.elf.values())) == 4  # the copy has the same content


def test_walk_refuses_only_when_no_path_is_usable(tmp_path: Path) -> None:
    from emu.errors import UsageError

    with pytest.raises(UsageError, match="no such file"):
        walk([str(tmp_path / "a"), str(tmp_path / "b")])


def test_resume_never_analyses_a_file_twice(tree: Path, tmp_path: Path) -> None:
    store = _store(tmp_path)
    first = survey([str(tree)], ALL, store, inline, max_files=2)
    assert (first.analysed, first.complete) == (2, False)
    second = survey([str(tree)], ALL, store, inline)
    assert (second.analysed, second.complete) == (2, True)  # the other two distinct contents
    third = survey([str(tree)], ALL, store, inline)
    assert third.analysed == 0
    assert sorted(store.analyses().values()) == [1, 1, 1, 1]
    assert to_json(third, ALL)["sites"] == to_json(second, ALL)["sites"]


def test_a_changed_file_or_design_set_is_analysed_again(tree: Path, tmp_path: Path) -> None:
    """Negative controls of the cache: new content, or other designs, is not served from the store."""
    store = _store(tmp_path)
    survey([str(tree)], ALL, store, inline)
    target = tree / "hello_asm"
    target.write_bytes(target.read_bytes() + b"\0")
    assert survey([str(tree)], ALL, store, inline).analysed == 1
    fewer = [DESIGNS["linux-6.18"]]
    assert survey([str(tree)], fewer, _store(tmp_path, fewer), inline).analysed == 4


class _InterruptedAfter(InlinePool):
    """Ctrl-C after ``n`` results."""

    def __init__(self, n: int) -> None:
        self.n = n

    def map(self, fn: Callable[..., R], tasks: Sequence[tuple[Any, ...]]) -> Iterator[R]:
        for i, result in enumerate(super().map(fn, tasks)):
            if i == self.n:
                raise KeyboardInterrupt
            yield result


def test_ctrl_c_keeps_what_is_done(tree: Path, tmp_path: Path) -> None:
    store = _store(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        survey([str(tree)], ALL, store, _InterruptedAfter(3))
    assert len(store.analyses()) == 3
    assert survey([str(tree)], ALL, store, inline).analysed == 1


def test_cli_survey_json_and_report(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, report, db = tmp_path / "s.json", tmp_path / "s.md", tmp_path / "cli.sqlite"
    status = main(["survey", "--jobs", "1", "--db", str(db), "--json", str(out), "--report", str(report),
                   str(tree / "survey_cases"), str(tree / "notes.txt"), str(tree / "missing")])
    assert status == 0
    data = json.loads(out.read_text())
    assert (data["files"], data["elf_files"], data["skipped"]) == (2, 1, {"not-elf": 1, "missing": 1})
    live = next(s for s in data["sites"] if s["symbol"] == "rz_live+0x5")
    assert live["file"] == str(tree / "survey_cases") and live["red_zone"] == "live"
    assert live["live_bytes"] == [[-8, -1]] and live["hazard"]["linux-6.18"] is True
    assert data["designs"]["linux-6.18"]["hazards"] == 3  # rz_live, rz_branch, rz_frame
    text = report.read_text()
    assert "| linux-6.18 | 11 |" in text and "rz_live+0x5" in text and "=> 0x" in text
    assert "linux-6.18" in capsys.readouterr().out


def test_cli_bad_path_only_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["survey", "--db", str(tmp_path / "x.sqlite"), str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err


def test_report_per_package_counts(tree: Path, tmp_path: Path) -> None:
    info = tmp_path / "info"
    info.mkdir()
    cases, copy = tree / "survey_cases", tree / "sub" / "copy_of_cases"
    (info / "cases:amd64.list").write_text(f"/.\n{tree}\n{cases}\n{copy}\n")
    outcome = survey([str(tree)], ALL, _store(tmp_path), inline)
    owners = packages(sorted(outcome.walk.elf), str(info))
    assert owners == {str(cases): "cases", str(copy): "cases"}
    text = markdown(outcome, ALL, owners)
    assert "## Per package" in text and "| cases | 11 | 5 |" in text and "(no package)" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dask_cluster(tmp_path: Path) -> Iterator[str]:
    """A real `dask scheduler` and two `dask worker` processes on 127.0.0.1; killed at the end."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    log = open(tmp_path / "dask.log", "w")  # noqa: SIM115 - closed below
    cli = [sys.executable, "-m"]
    procs = [subprocess.Popen([*cli, "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stdout=log, stderr=log)]
    try:
        from distributed import Client

        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline and procs[0].poll() is None, "the scheduler did not start"
                time.sleep(0.2)
        procs += [subprocess.Popen([*cli, "distributed.cli.dask_worker", address, "--nthreads", "1",
                                    "--no-dashboard", "--name", f"w{i}"], stdout=log, stderr=log) for i in range(2)]
        with Client(address, timeout="30s") as client:  # type: ignore[no-untyped-call]  # (not annotated)
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        log.close()


CORPUS = str(Path(__file__).resolve().parents[1] / "fixtures" / "survey_corpus.toml")


@pytest.mark.slow
def test_survey_and_fuzz_through_a_dask_scheduler_equal_the_local_run(dask_cluster: str, tree: Path,
                                                                       tmp_path: Path) -> None:
    """The static survey, the corpus runs and a fuzz campaign, on a real scheduler's two workers."""
    from emu.fuzz.campaign import CampaignConfig, run_campaign
    from emu.survey.corpus import load_corpus
    from emu.survey.engine import run_corpus

    remote, local = tmp_path / "remote.sqlite", tmp_path / "local.sqlite"
    assert main(["survey", "--scheduler", dask_cluster, "--db", str(remote), "--corpus", CORPUS, str(tree)]) == 0
    local_store = Store(str(local), designs_key(ALL))
    outcome = survey([str(tree), sample("survey_corpus")], ALL, local_store, inline)
    run_corpus(load_corpus(CORPUS), ALL, local_store, inline, outcome)
    remote_store = Store(str(remote), designs_key(ALL))
    assert remote_store.dump() == local_store.dump() and len(remote_store.dump()) > 50
    assert sorted(remote_store.analyses().values()) == [1, 1, 1, 1, 1]
    assert sum(row[0] == "runs" for row in remote_store.dump()) == 2 * len(ALL)

    def fuzz(jobs: int, scheduler: str | None, out: str) -> dict[str, Any]:
        config = CampaignConfig(("linux-6.18", "jmp-slots"), seed=4, cases=40, jobs=jobs, scheduler=scheduler,
                                out=str(tmp_path / out))
        got = run_campaign(config, lambda _stats: None).to_json()
        del got["cases_per_s"]
        for d in got["designs"].values():
            d["saved"] = [os.path.basename(p) for p in d["saved"]]
        return got

    here, there = fuzz(1, None, "local"), fuzz(2, dask_cluster, "remote")
    assert there == here and here["findings"] > 0 and here["designs"]["linux-6.18"]["saved"]
    assert sorted(os.listdir(tmp_path / "remote")) == sorted(os.listdir(tmp_path / "local"))


@pytest.mark.slow
def test_sigint_keeps_the_files_done_and_the_rerun_goes_on(tmp_path: Path) -> None:
    """A real Ctrl-C (SIGINT) during a local-cluster survey: exit 130, the finished files stay stored."""
    import signal
    import sqlite3

    root = tmp_path / "bins"
    root.mkdir()
    names = ("hello_static", "argv_env", "file_reader", "cpu_bound", "exit_code", "getpid_loop")
    for name in names:
        shutil.copy(sample(name), root / name)
    db = tmp_path / "int.sqlite"
    cmd = [sys.executable, "-m", "emu", "survey", "--jobs", "1", "--db", str(db), str(root)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while _stored_files(db) < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "no file finished"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "kept in the database" in err
    kept = _stored_files(db)
    assert 1 <= kept < len(names)
    store = Store(str(db), designs_key(ALL))
    assert survey([str(root)], ALL, store, inline).analysed == len(names) - kept
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _stored_files(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    try:
        return int(sqlite3.connect(db, timeout=5).execute("SELECT count(*) FROM files").fetchone()[0])
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


def test_an_unreadable_file_is_counted_and_skipped(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(root reads a chmod 000 file anyway: the refusal is simulated at open)"""
    import builtins

    real_open = builtins.open
    locked = str(tree / "hello_asm")

    def fake_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    found = walk([str(tree)])
    assert found.counts["unreadable"] == 1 and locked not in found.elf and len(found.elf) == 4
