"""`uprobe-emu survey --corpus`: the corpus file, the runs under every design (hits per site,
clobbers read back), the confusion table against the static verdicts, resume, bad corpus files."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import browser
import pytest
from conftest import sample, symtab_address
from hypothesis import given, settings
from hypothesis import strategies as st

from emu.cli import main
from emu.designs import DESIGNS
from emu.dist import InlinePool
from emu.survey import analyze
from emu.survey.confusion import confusion, seen_sites
from emu.survey.corpus import load_corpus
from emu.survey.engine import Outcome, run_corpus, survey
from emu.survey.redzone import RedZone, analyse
from emu.survey.replay import replay_command
from emu.survey.store import Store, designs_key

FIXTURE = str(Path(__file__).resolve().parents[1] / "fixtures" / "survey_corpus.toml")
ALL = list(DESIGNS.values())
NO_CLOBBER = {"hazard": {"clobbered": 0, "exercised": 0, "reached_once": 0, "not_reached": 0},
              "no_hazard": {"clobbered": 0, "exercised": 5, "reached_once": 1, "not_reached": 0},
              "unknown": {"clobbered": 0, "exercised": 0, "reached_once": 0, "not_reached": 0}}


def _run(tmp_path: Path, name: str = "s.sqlite") -> tuple[Outcome, Store]:
    store = Store(str(tmp_path / name), designs_key(ALL))
    pool = InlinePool()
    outcome = survey([sample("survey_corpus")], ALL, store, pool)
    run_corpus(load_corpus(FIXTURE), ALL, store, pool, outcome)
    return outcome, store


def _symbols(outcome: Outcome) -> dict[int, str]:
    return {s.address: str(s.symbol) for stored in outcome.results.values() for s in stored.sites}


def test_confusion_cells_per_design(tmp_path: Path) -> None:
    outcome, _ = _run(tmp_path)
    assert len(outcome.runs) == 2 * len(ALL) and outcome.ran == 2 * len(ALL)
    assert all(cr.run.status == "ok" for cr in outcome.runs)
    linux = confusion(outcome, DESIGNS["linux-6.18"])
    assert linux.cells == {"hazard": {"clobbered": 1, "exercised": 0, "reached_once": 1, "not_reached": 0},
                           "no_hazard": {"clobbered": 0, "exercised": 3, "reached_once": 0, "not_reached": 0},
                           "unknown": {"clobbered": 1, "exercised": 0, "reached_once": 0, "not_reached": 0}}
    assert (linux.precision, linux.recall, linux.false_negatives) == (1.0, 1.0, [])
    assert linux.unknowns_decided == 1  # rz_indirect: unknown to the analysis, clobbered by the run
    assert (linux.flagged_only, linux.unexplained, linux.unsurveyed) == (3, [], 0)  # rz_deep, rz_dead, rz_slot
    for name in ("int3", "uretprobe-rfc", "jmp-slots", "nop10"):  # none writes the red zone: rz_live is no hazard
        c = confusion(outcome, DESIGNS[name])
        assert c.cells == NO_CLOBBER and (c.precision, c.recall) == (None, None), name


def test_a_confirmed_hazard_comes_with_a_command_that_shows_it(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """rz_live, confirmed under linux-6.18: its replay (check of the entry with that site alone) shows
    the red-zone verifier's changed bytes and the output the clobber changed. The same command under
    jmp-slots (the negative control) shows neither."""
    outcome, _ = _run(tmp_path)
    [confirmed] = confusion(outcome, DESIGNS["linux-6.18"]).confirmed
    assert confirmed["symbol"] == "rz_live+0x5" and confirmed["replay"].startswith("uprobe-emu check --kernel=linux-6.18")
    assert confirmed["entries"] == ["survey_corpus, all sites"]  # the entries that hit it (the other probes rz_never)
    argv = shlex.split(confirmed["replay"])[1:]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "linux-6.18: output differs from the unprobed run" in out and "redzone: uprobe:0x401005" in out
    assert main([a.replace("linux-6.18", "jmp-slots") for a in argv]) == 0
    out = capsys.readouterr().out
    assert "output differs" not in out and "redzone:" not in out
    assert all(confusion(outcome, DESIGNS[d]).confirmed == [] for d in ("int3", "jmp-slots", "nop10"))


def test_hits_flags_and_read_backs_per_site(tmp_path: Path) -> None:
    """Per site under linux-6.18: hits 1 go through INT3 (no clobber); the verifier flags hits 2
    and 3 of every site, but only the live ones read the changed bytes back (rz_slot reads them
    too, from a frame it allocated after the site: no use of the red zone)."""
    outcome, _ = _run(tmp_path)
    names = _symbols(outcome)
    seen = {names[a]: (s.hits, s.flagged, s.read_back) for (_sha, a), s in
            seen_sites(outcome, "linux-6.18").items()}
    assert seen == {"rz_live+0x5": (3, 2, 2), "rz_deep+0x5": (3, 2, 0), "rz_dead+0xa": (3, 2, 0),
                    "rz_indirect+0xc": (3, 2, 2), "rz_never+0x5": (1, 0, 0), "rz_slot": (3, 2, 0)}
    jmp = {names[a]: (s.hits, s.flagged, s.read_back) for (_sha, a), s in seen_sites(outcome, "jmp-slots").items()}
    assert jmp["rz_live+0x5"] == (3, 0, 0)
    differs = {cr.run.design for cr in outcome.runs if not cr.run.same_output}
    assert differs == {"linux-6.18"}


def test_a_wrong_static_verdict_is_a_false_negative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: an analysis that calls rz_live's site dead is caught by the corpus run."""
    real = analyse

    def wrong(fn: Any, site: int, executed: bool = False) -> RedZone:
        got = real(fn, site, executed)
        return RedZone("dead") if got.live == ((-8, -1),) and fn.start == _address("rz_live") else got

    monkeypatch.setattr(analyze, "analyse", wrong)
    outcome, _ = _run(tmp_path)
    linux = confusion(outcome, DESIGNS["linux-6.18"])
    assert linux.cells["no_hazard"]["clobbered"] == 1 and linux.cells["hazard"]["clobbered"] == 0
    assert linux.recall == 0.0
    [missed] = linux.false_negatives
    assert (missed["symbol"], missed["red_zone"], missed["hits"], missed["read_back"]) == ("rz_live+0x5", "dead", 3, 2)


def test_an_output_difference_no_clobber_explains_is_listed() -> None:
    """A run whose output differs with no site read back (a clobber the watch cannot see) is not
    silently clean; a probed address the static survey never named is counted apart."""
    from emu.survey.dynamic import DesignRun, SiteRun
    from emu.survey.engine import CorpusRun, Walk

    run = DesignRun("k", "sha", "linux-6.18", "ok", same_output=False, sites=(SiteRun(0x10, "uprobe:f", 3, 2, 0),))
    outcome = Outcome(Walk(), {}, runs=[CorpusRun("differs", "/bin/x", run)])
    c = confusion(outcome, DESIGNS["linux-6.18"])
    assert (c.unexplained, c.unsurveyed) == (["differs"], 1)
    assert confusion(outcome, DESIGNS["jmp-slots"]).unexplained == []


def _address(symbol: str) -> int:
    return symtab_address(sample("survey_corpus"), symbol)


def test_reruns_resume_and_a_changed_binary_runs_again(tmp_path: Path) -> None:
    _, store = _run(tmp_path)
    again, _ = _run(tmp_path)
    assert again.ran == 0 and len(again.runs) == 2 * len(ALL)
    assert confusion(again, DESIGNS["linux-6.18"]).cells["hazard"]["clobbered"] == 1
    copy = tmp_path / "bin"
    copy.mkdir()
    shutil.copy(sample("survey_corpus"), copy / "survey_corpus")
    with open(copy / "survey_corpus", "ab") as fh:
        fh.write(b"\0")  # other content, same program
    corpus = tmp_path / "c.toml"
    corpus.write_text(f'[[run]]\nbinary = "{copy / "survey_corpus"}"\n')
    pool = InlinePool()
    outcome = survey([str(copy)], ALL, store, pool)
    run_corpus(load_corpus(str(corpus)), ALL, store, pool, outcome)
    assert outcome.ran == len(ALL)


def test_cli_corpus_json_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, report, page = tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.html"
    assert main(["survey", "--jobs", "1", "--db", str(tmp_path / "db"), "--corpus", FIXTURE, "--json", str(out),
                 "--report", str(report), "--html", str(page), sample("survey_corpus")]) == 0
    if browser.available():
        _check_page(page)
    data = json.loads(out.read_text())
    linux = data["corpus"]["confusion"]["linux-6.18"]
    assert linux["hazard"]["clobbered"] == 1 and linux["unknown"]["clobbered"] == 1 and linux["recall"] == 1.0
    assert len(data["corpus"]["runs"]) == 2 * len(ALL)
    text = report.read_text()
    assert "## Static verdicts against the corpus runs" in text and "| linux-6.18 | hazard | 1 | 0 | 1 | 0 |" in text
    assert "| design | sites | optimized | hazards | unknown | confirmed |" in text
    assert "| linux-6.18 | 6 | 6 | 2 | 1 | 1 |" in text and "| jmp-slots | 6 | 6 | 0 | 0 | 0 |" in text
    assert "corpus: 10 runs (10 made by this survey" in capsys.readouterr().out


BAD = {
    "syntax": ("[[run]\nbinary = 1\n", "not TOML"),
    "unknown key": ('[[run]]\nbinary = "/bin/true"\nargv = []\n', "unknown key 'argv'"),
    "unknown table": ('[runs]\nbinary = "/bin/true"\n', "unknown key 'runs'"),
    "no run": ("", "no [[run]] table"),
    "missing binary": ('[[run]]\nbinary = "./no/such/binary"\n', "binary './no/such/binary' not found"),
    "no binary": ("[[run]]\nargs = []\n", "no binary"),
    "wrong type": ('[[run]]\nbinary = "/bin/true"\nargs = "-v"\n', "args has the wrong type"),
    "bad probe": ('[[run]]\nbinary = "/bin/true"\nprobes = ["kprobe:x"]\n', "bad probe spec"),
    "bad probes": ('[[run]]\nbinary = "/bin/true"\nprobes = "some sites"\n', "probes must be"),
    "stdin twice": ('[[run]]\nbinary = "/bin/true"\nstdin = "a"\nstdin_file = "b"\n', "both given"),
    "timeout nan": ('[[run]]\nbinary = "/bin/true"\ntimeout = nan\n', "timeout must be"),
    "timeout inf": ('[[run]]\nbinary = "/bin/true"\ntimeout = inf\n', "timeout must be"),
    "nested deep": ("x = " + "[" * 5000 + "]" * 5000 + "\n", "not TOML"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_corpus_file_is_one_line_exit_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, message = BAD[case]
    corpus = tmp_path / "c.toml"
    corpus.write_text(text)
    assert main(["survey", "--db", str(tmp_path / "db"), "--corpus", str(corpus), sample("survey_corpus")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "db").exists()  # refused before anything ran


def test_corpus_entry_fields(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_bytes(b"data\n")
    corpus = tmp_path / "c.toml"
    corpus.write_text('[[run]]\nbinary = "true"\nargs = ["a"]\nstdin_file = "in.txt"\nenv = { LC_ALL = "C" }\n'
                      'timeout = 5\n')
    [entry] = load_corpus(str(corpus))
    assert entry.binary == shutil.which("true") and entry.args == ("a",) and entry.stdin == b"data\n"
    assert entry.env == (("LC_ALL", "C"),) and entry.probes is None and entry.timeout_s == 5.0
    other = tmp_path / "d.toml"
    other.write_text('[[run]]\nbinary = "true"\nargs = ["b"]\nstdin_file = "in.txt"\nenv = { LC_ALL = "C" }\n'
                     'timeout = 5\n')
    assert load_corpus(str(other))[0].content_key() != entry.content_key()
    text = tmp_path / "e.toml"
    text.write_text('[[run]]\nname = "n"\nbinary = "true"\nstdin = "typed\\n"\nprobes = ["uprobe:main"]\n')
    [typed] = load_corpus(str(text))
    assert (typed.name, typed.stdin, typed.probes, typed.env) == ("n", b"typed\n", ("uprobe:main",), ())


def test_a_corpus_binary_that_is_not_elf_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    corpus = tmp_path / "c.toml"
    corpus.write_text('[[run]]\nbinary = "./script.sh"\n')
    assert main(["survey", "--jobs", "1", "--db", str(tmp_path / "db"), "--corpus", str(corpus),
                 sample("survey_corpus")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "script.sh is not an x86-64 ELF file" in err


def test_entries_alike_but_for_their_binary_keep_their_names(tmp_path: Path) -> None:
    """Two entries with the same arguments and other binaries: one content key, two runs each named right."""
    corpus = tmp_path / "c.toml"
    corpus.write_text(f'[[run]]\nname = "cases"\nbinary = "{sample("survey_cases")}"\n'
                      f'[[run]]\nname = "corpus"\nbinary = "{sample("survey_corpus")}"\n')
    entries = load_corpus(str(corpus))
    assert entries[0].content_key() == entries[1].content_key()
    store = Store(str(tmp_path / "s.sqlite"), designs_key(ALL))
    pool = InlinePool()
    outcome = survey([e.binary for e in entries], ALL, store, pool)
    run_corpus(entries, ALL, store, pool, outcome)
    named = {(cr.name, cr.binary) for cr in outcome.runs}
    assert named == {("cases", sample("survey_cases")), ("corpus", sample("survey_corpus"))}
    assert len(outcome.runs) == 2 * len(ALL)
    twice = tmp_path / "twice.toml"
    twice.write_text(corpus.read_text() * 2)
    again = survey([e.binary for e in entries], ALL, store, pool)
    run_corpus(load_corpus(str(twice)), ALL, store, pool, again)
    assert (again.ran, len(again.runs)) == (0, 2 * len(ALL))  # stored, and each run counted once


DEBIAN_PROGRAMS = ("true", "ls", "sort", "gzip", "grep", "sed", "bash", "perl", "make", "ip")


@pytest.mark.skipif(any(shutil.which(n) is None for n in DEBIAN_PROGRAMS),
                    reason="a program of fixtures/debian_corpus.toml is not installed on this host")
def test_the_debian_corpus_file_parses() -> None:
    """fixtures/debian_corpus.toml (the README's numbers): every entry probes all sites of an installed binary."""
    names = DEBIAN_PROGRAMS
    entries = load_corpus(FIXTURE.replace("survey_corpus.toml", "debian_corpus.toml"))
    assert [Path(e.binary).name for e in entries] == list(names)
    assert all(e.probes is None for e in entries) and entries[8].stdin.startswith(b"all: a b")


TOML_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str), st.floats().map(repr),
    st.sampled_from(["nan", "inf", "-inf", "true", "[]", "{}", '["a", 1]', '"\\u0000"', '"true"', '"/"', '"all sites"',
                     '["uprobe:main"]', '"../../../../etc/passwd"', "1979-05-27T07:32:00Z", '{ A = 1 }', '{ A = "b" }']),
    st.text(max_size=20).map(json.dumps),
)


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(st.sampled_from(["name", "binary", "args", "stdin", "stdin_file", "env", "probes", "timeout",
                                        "other"]), TOML_VALUES, max_size=5))
def test_hostile_corpus_entries_are_one_line_errors_or_entries(run: dict[str, str]) -> None:
    """Every key of a [[run]] table with values of every TOML type: a UsageError of one line, or entries."""
    import tempfile

    from emu.errors import UsageError
    from emu.survey.corpus import Entry, load_corpus

    body = "".join(f"{key} = {value}\n" for key, value in run.items())
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "c.toml"
        corpus.write_text("[[run]]\n" + body, errors="surrogateescape")
        try:
            entries = load_corpus(str(corpus))
        except UsageError as err:
            assert str(err) and "\n" not in str(err)
        else:
            assert all(isinstance(e, Entry) and 0 < e.timeout_s <= 86_400 for e in entries)


def test_a_replay_feeds_the_entrys_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in.txt").write_text("b\na\n")
    corpus = tmp_path / "c.toml"
    corpus.write_text('[[run]]\nbinary = "/usr/bin/sort"\nstdin_file = "in.txt"\nenv = { LC_ALL = "C" }\n'
                      '[[run]]\nbinary = "/usr/bin/sort"\nstdin = "it\'s\\n"\n')
    from_file, inline = load_corpus(str(corpus))
    command = replay_command(from_file, "int3", "uprobe:sort:0x10")
    assert command == (f"uprobe-emu check --stdin {tmp_path}/in.txt --kernel=int3 --clear-env --env=LC_ALL=C "
                       "--timeout=120 -p uprobe:sort:0x10 /usr/bin/sort")
    assert replay_command(inline, "int3", "uprobe:0x1").startswith("printf %s 'it'\"'\"'s\n' | uprobe-emu check --stdin -")
    assert main(["check", "--stdin", str(tmp_path / "missing"), "/usr/bin/true"]) == 2
    assert capsys.readouterr().err.strip().endswith("--stdin " + str(tmp_path / "missing") + ": No such file or directory")


def _check_page(path: Path) -> None:
    """The page in Chromium: one confusion figure per design whose cells hold the table's counts (rz_live
    confirmed under linux-6.18, nothing clobbered under jmp-slots), the confirmed hazard with its replay,
    the entries against their native record, and the package table."""
    from test_report_pages import loaded

    _, dom = loaded(path)
    assert [f.attrs["data-design"] for f in dom.figures()] == [d.name for d in ALL]

    def count(design: str, row: str, column: str) -> int:
        [cell] = [e for e in dom.inside("confusion", design=design)
                  if e.attrs.get("data-row") == row and e.attrs.get("data-column") == column]
        return int(cell.attrs["data-count"])

    assert count("linux-6.18", "hazard", "clobbered") == 1 and count("linux-6.18", "unknown", "clobbered") == 1
    assert count("jmp-slots", "hazard", "clobbered") == 0 and count("jmp-slots", "no_hazard", "exercised") == 5
    text = " ".join(e.text for e in dom.elements)
    assert "Confirmed hazards (1)" in text and "uprobe-emu check --kernel=linux-6.18" in text
    assert "same" in [e.text for e in dom.elements if e.tag == "td"]  # the entries against the native record
    assert "Per package" in text
