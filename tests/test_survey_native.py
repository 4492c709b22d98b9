"""The corpus's native record (emu/survey/native.py): what each entry prints on this machine's kernel,
held against the emulated unprobed run of every survey."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from pathlib import Path

import pytest
from conftest import FIXTURES_DIR, survey_with_corpus

from emu import hotpath
from emu.cli import main
from emu.designs import DESIGNS
from emu.survey.corpus import Entry, load_corpus
from emu.survey.libraries import discover, mapped_files
from emu.survey.native import Output, Recorded, compare, load, record, record_key, record_path, run_natively

RECORDED = ["survey_corpus.toml", "rzlib.toml", "survey_readback.toml", "debian_corpus.toml", "llvm_corpus.toml",
            "node_corpus.toml", "debian/corpus.toml", "debian/llvm.toml", "debian/node.toml"]


@pytest.mark.parametrize("corpus", RECORDED)
def test_every_entry_is_recorded_and_the_record_is_current(corpus: str) -> None:
    """Each fixture corpus has a record of every entry, of the binaries installed now, and a native run
    today prints what the record says (the record is not stale, the entries are deterministic)."""
    path = str(FIXTURES_DIR / corpus)
    entries, records = load_corpus(path), load(record_path(path))
    assert {record_key(e) for e in entries} == set(records)
    for entry in entries:
        native = run_natively(entry)
        assert compare(entry, native, records) == ("same", None), entry.name


def test_record_path_sits_beside_the_corpus() -> None:
    assert record_path("fixtures/a.toml") == "fixtures/a.native.json"
    assert record_path("corpus") == "corpus.native.json"


def test_the_survey_holds_each_unprobed_run_against_the_record(tmp_path: Path) -> None:
    outcome = survey_with_corpus(tmp_path, "rzlib_main", "rzlib.toml", [DESIGNS["jmp-slots"]])
    assert list(outcome.fidelity.values()) == [("same", None)]


def _entry_and_records(tmp_path: Path) -> tuple[Entry, dict[str, Recorded]]:
    [entry] = load_corpus(str(FIXTURES_DIR / "rzlib.toml"))
    return entry, record([entry], str(tmp_path / "r.native.json"))


def test_negative_control_a_different_output_or_ending_is_reported(tmp_path: Path) -> None:
    entry, records = _entry_and_records(tmp_path)
    _files, emulated, _reached = mapped_files(entry)
    assert emulated is not None and compare(entry, emulated, records) == ("same", None)
    other = Output.of(emulated.ending, b"not what it prints\n")
    kind, how = compare(entry, other, records)
    assert kind == "differs" and how == f"stdout differs (19 bytes, natively {emulated.stdout_size})"
    killed = dataclasses.replace(emulated, ending="signal 11")
    assert compare(entry, killed, records) == ("differs", "signal 11, natively exit 0")


def test_nothing_to_compare_is_said_as_such(tmp_path: Path) -> None:
    entry, records = _entry_and_records(tmp_path)
    key = record_key(entry)
    emulated = records[key].output
    stale = {key: dataclasses.replace(records[key], binary_sha256="0" * 64)}
    assert compare(entry, emulated, stale) == ("stale", None)
    assert compare(entry, emulated, {}) == ("unrecorded", None)
    assert compare(entry, None, records) == ("failed", None)
    stopped = Output.of("stopped: after 1 s", b"")
    assert compare(entry, stopped, records) == ("stopped", None)


def test_record_native_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "c.toml"
    corpus.write_text('[[run]]\nbinary = "/usr/bin/printf"\nargs = ["%s\\\\n", "a", "b"]\n'
                      '[[run]]\nbinary = "/usr/bin/false"\n')
    assert main(["survey", "--corpus", str(corpus), "--record-native"]) == 0
    assert "recorded 2 entries natively" in capsys.readouterr().out
    body = json.loads((tmp_path / "c.native.json").read_text())
    endings = sorted(e["ending"] for e in body["entries"].values())
    sizes = sorted(e["stdout_size"] for e in body["entries"].values())
    assert endings == ["exit 0", "exit 1"] and sizes == [0, 4]


@pytest.mark.parametrize("text, error", [("{", "not a native record"), ('{"version": 99, "entries": {}}', "version 99"),
                                         ('{"version": 2, "entries": {"k": {}}}', "bad field")])
def test_a_broken_record_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                          error: str) -> None:
    corpus = tmp_path / "c.toml"
    corpus.write_text('[[run]]\nbinary = "/usr/bin/true"\n')
    (tmp_path / "c.native.json").write_text(text)
    assert main(["survey", "--db", str(tmp_path / "s.sqlite"), "--jobs", "1", "--corpus", str(corpus)]) == 2
    assert error in capsys.readouterr().err


def test_a_survey_needs_paths_or_a_corpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["survey"]) == 2
    assert "give a PATH to survey, or a --corpus" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(hotpath.native is None, reason="an unprobed run uses no verifier, so neither hot path: the run with "
                                                    "the C extension covers it")
@pytest.mark.parametrize("corpus", ["debian/corpus.toml", "debian/llvm.toml"])
def test_every_debian_entry_runs_in_the_emulation_as_on_linux(corpus: str) -> None:
    """Each entry of the Debian corpus, run unprobed in the emulation (the survey's discovery run),
    prints and exits as the native record says (node.toml's four are left to the survey: ten seconds each)."""
    path = str(FIXTURES_DIR / corpus)
    entries, records = load_corpus(path), load(record_path(path))
    with multiprocessing.get_context("forkserver").Pool(2) as pool:
        found = pool.map(discover, entries)
    verdicts = {e.name: compare(e, d.output, records) for e, d in zip(entries, found, strict=True)}
    assert {name: v for name, v in verdicts.items() if v != ("same", None)} == {}


def test_an_entry_runs_in_an_empty_directory_as_its_record_was_made(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`ls -a` lists only . and .. natively and emulated, whatever the survey's own directory holds."""
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "a-file").write_text("x")
    monkeypatch.chdir(busy)
    corpus = tmp_path / "c.toml"
    corpus.write_text('[[run]]\nbinary = "/usr/bin/ls"\nargs = ["-a"]\n')
    [entry] = load_corpus(str(corpus))
    records = record([entry], str(tmp_path / "c.native.json"))
    _files, emulated, _reached = mapped_files(entry)
    assert emulated is not None and emulated.stdout_size == len(".\n..\n")
    assert compare(entry, emulated, records) == ("same", None)
