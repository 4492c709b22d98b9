"""The survey reads its SQLite database back: a file that is not one of ours, a damaged row or a
damaged page is a one-line error (exit 2), never a traceback and never a silent wrong report."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emu.cli import main
from emu.designs import DESIGNS
from emu.errors import EmuError
from emu.survey.dynamic import DesignRun, SiteRun
from emu.survey.store import COLUMNS, Store, design_key, designs_key

KEY = designs_key(list(DESIGNS.values()))


@pytest.fixture(scope="module")
def surveyed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a database holding survey_cases' analysis, the binary)."""
    root = tmp_path_factory.mktemp("store")
    binary, db = root / "survey_cases", root / "good.sqlite"
    shutil.copy(sample("survey_cases"), binary)
    assert main(["survey", "--jobs", "1", "--db", str(db), str(binary)]) == 0
    return db, binary


def _survey(db: Path, binary: Path, capsys: pytest.CaptureFixture[str], out: Path) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["survey", "--jobs", "1", "--db", str(db), "--json", str(out), str(binary)])
    return status, capsys.readouterr().err


def _copy(surveyed: tuple[Path, Path], tmp_path: Path) -> Path:
    db = tmp_path / "copy.sqlite"
    shutil.copy(surveyed[0], db)
    return db


def _one_line_about(err: str, db: Path, words: str) -> None:
    assert err.count("\n") == 1 and str(db) in err and words in err, err


def test_the_stored_survey_reads_back_as_it_was_made(surveyed: tuple[Path, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    db = _copy(surveyed, tmp_path)
    assert _survey(db, surveyed[1], capsys, tmp_path / "a.json") == (0, "")
    data = json.loads((tmp_path / "a.json").read_text())
    live = next(s for s in data["sites"] if s["symbol"] == "rz_live+0x5")
    assert live["live_bytes"] == [[-8, -1]]  # what the database holds, not a fresh analysis
    assert list(Store(str(db), KEY).analyses().values()) == [1]  # analysed once, when the fixture made it


def test_a_table_with_other_columns_is_not_our_database(surveyed: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "other.sqlite"
    with sqlite3.connect(db) as con:  # a `files` table of another program
        con.execute("CREATE TABLE files (name TEXT, size INTEGER)")
    status, err = _survey(db, surveyed[1], capsys, tmp_path / "a.json")
    assert status == 2
    _one_line_about(err, db, "not a uprobe-emu survey database (table files")


def test_a_missing_constraint_is_another_schema(surveyed: tuple[Path, Path], tmp_path: Path) -> None:
    db = tmp_path / "loose.sqlite"
    with sqlite3.connect(db) as con:  # the same names, but `address` may be NULL
        con.execute("CREATE TABLE sites (sha256 TEXT NOT NULL, key TEXT NOT NULL, address INTEGER, kind TEXT NOT NULL,"
                    " symbol TEXT, name TEXT NOT NULL, insn TEXT NOT NULL, red_zone TEXT NOT NULL, reason TEXT,"
                    " live TEXT NOT NULL, context TEXT NOT NULL, PRIMARY KEY (sha256, key, address, kind))")
    with pytest.raises(EmuError, match="table sites has other columns"):
        Store(str(db), KEY)


def test_a_value_of_the_wrong_type_is_a_damaged_database(surveyed: tuple[Path, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    db = _copy(surveyed, tmp_path)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE sites SET address = 'main' WHERE rowid = 1")
    status, err = _survey(db, surveyed[1], capsys, tmp_path / "a.json")
    assert status == 2
    _one_line_about(err, db, "damaged survey database (table sites, row 1: address is not integer)")


@pytest.mark.parametrize("live", ["{", "[[1]]", '[["rax", 2]]', "7", "[" * 100_000 + "]" * 100_000])
def test_a_live_range_that_is_not_pairs_is_a_damaged_database(surveyed: tuple[Path, Path], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str], live: str) -> None:
    db = _copy(surveyed, tmp_path)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE sites SET live = ? WHERE rowid = 1", (live,))
    status, err = _survey(db, surveyed[1], capsys, tmp_path / "a.json")
    assert status == 2
    _one_line_about(err, db, "live is not a list of register pairs")


def test_a_damaged_page_is_one_line(surveyed: tuple[Path, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    db = _copy(surveyed, tmp_path)
    data = bytearray(db.read_bytes())
    assert len(data) > 3 * 4096
    data[4096:len(data)] = bytes(len(data) - 4096)  # every page after the first one zeroed
    db.write_bytes(bytes(data))
    status, err = _survey(db, surveyed[1], capsys, tmp_path / "a.json")
    assert status == 2
    _one_line_about(err, db, "survey database")


def test_a_stored_corpus_run_reads_back_and_its_damage_is_caught(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    key = ("entry", "ab" * 32, "int3", design_key(DESIGNS["int3"]))
    run = DesignRun(*key[:3], "timeout", "stopped after 1.0 s (--timeout)", True, None,
                    (SiteRun(0x1139, "uprobe:0x555555555139", 3, 1, 0),), 1.5)
    store = Store(str(db), KEY)
    store.put_run(run, key[3], "cat")
    assert store.get_run(key) == ("cat", run)
    store.close()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE run_sites SET hits = x'00'")
    with pytest.raises(EmuError, match=r"table run_sites, row 1: hits is not integer"):
        Store(str(db), KEY)


CELLS = [(table, name) for table, columns in COLUMNS.items() for name, *_ in columns]
VALUES = st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1), st.floats(allow_nan=True), st.text(max_size=40),
                   st.binary(max_size=40), st.sampled_from(["[]", "[[0, 0]]", "[[1e999, 2]]", "null", "ok", "int3"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cell=st.sampled_from(CELLS), value=VALUES)
def test_any_one_changed_cell_reads_back_or_is_one_line(surveyed: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        cell: tuple[str, str], value: object) -> None:
    db = _copy(surveyed, tmp_path)
    table, column = cell
    with sqlite3.connect(db) as con:
        try:
            con.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = (SELECT min(rowid) FROM {table})", (value,))
        except sqlite3.IntegrityError:
            return  # the schema itself refuses it (NULL, a duplicate key): nothing a survey can read back
    status, err = _survey(db, surveyed[1], capsys, tmp_path / "a.json")
    assert status in (0, 2)
    if status == 2:
        _one_line_about(err, db, "survey database")
