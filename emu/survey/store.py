"""The survey's SQLite database: results keyed by file content, so a rerun redoes nothing.

- ``files``: one row per content (sha256) and set of designs surveyed (``key``: the analysis
  version and the designs' values), with the status and how many times it was analysed;
- ``sites`` and ``verdicts``: what analyze.py found for that content;
- ``paths``: where each content was seen (the report's per-package counts, the JSON's file names);
- ``runs`` and ``run_sites``: the corpus runs (dynamic.py), keyed by the corpus entry's content,
  the binary's sha256 and the design (name, and ``dkey``: its values and the dynamic version).

Each file's rows are committed together as its result arrives: Ctrl-C or a killed survey keeps
every file already done, and the next run starts from there.

A database is read back only after it proves to be one of ours: every table with the columns of
SCHEMA, every value of the column's type (NULL only where the column allows it), every ``live`` a
list of register pairs. Anything else, or an SQLite error later on (a damaged page), is a one-line
error naming the file.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import wraps
from typing import ParamSpec, TypeVar

from emu.designs import Design
from emu.errors import EmuError
from emu.survey.analyze import ANALYSIS_VERSION, FileSurvey, SiteSurvey
from emu.survey.dynamic import DYNAMIC_VERSION, DesignRun, SiteRun

DEFAULT_DB = "uprobe-emu-survey.sqlite"
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    sha256 TEXT NOT NULL, key TEXT NOT NULL, size INTEGER NOT NULL, status TEXT NOT NULL, error TEXT,
    analyses INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (sha256, key));
CREATE TABLE IF NOT EXISTS paths (path TEXT PRIMARY KEY, sha256 TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sites (
    sha256 TEXT NOT NULL, key TEXT NOT NULL, address INTEGER NOT NULL, kind TEXT NOT NULL, symbol TEXT,
    name TEXT NOT NULL, insn TEXT NOT NULL, red_zone TEXT NOT NULL, reason TEXT, live TEXT NOT NULL,
    context TEXT NOT NULL, PRIMARY KEY (sha256, key, address, kind));
CREATE TABLE IF NOT EXISTS verdicts (
    sha256 TEXT NOT NULL, key TEXT NOT NULL, address INTEGER NOT NULL, kind TEXT NOT NULL, design TEXT NOT NULL,
    verdict TEXT NOT NULL, hazard INTEGER, PRIMARY KEY (sha256, key, address, kind, design));
CREATE TABLE IF NOT EXISTS runs (
    entry TEXT NOT NULL, sha256 TEXT NOT NULL, design TEXT NOT NULL, dkey TEXT NOT NULL, name TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT, same_output INTEGER NOT NULL, divergence TEXT, wall_s REAL NOT NULL,
    PRIMARY KEY (entry, sha256, design, dkey));
CREATE TABLE IF NOT EXISTS run_sites (
    entry TEXT NOT NULL, sha256 TEXT NOT NULL, design TEXT NOT NULL, dkey TEXT NOT NULL, address INTEGER NOT NULL,
    spec TEXT NOT NULL, hits INTEGER NOT NULL, flagged INTEGER NOT NULL, read_back INTEGER NOT NULL,
    refused INTEGER NOT NULL, PRIMARY KEY (entry, sha256, design, dkey, spec));
"""


def designs_key(designs: Sequence[Design]) -> str:
    """What a stored result depends on besides the content: the analysis version and the designs' values."""
    text = f"v{ANALYSIS_VERSION};" + ";".join(repr(d) for d in designs)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def design_key(design: Design) -> str:
    """What a stored corpus run depends on besides the entry and the binary: the design's values."""
    return hashlib.sha256(f"d{DYNAMIC_VERSION};{design!r}".encode()).hexdigest()[:16]


RunKey = tuple[str, str, str, str]  # (entry content key, binary sha256, design name, design_key)


@dataclass(frozen=True, slots=True)
class Stored:
    sha256: str
    status: str
    error: str | None
    size: int
    sites: tuple[SiteSurvey, ...]


# SQLite's type of each declared type: what ``typeof()`` may say of a value in such a column.
_STORED_AS = {"TEXT": ("text",), "INTEGER": ("integer",), "REAL": ("real", "integer")}


Column = tuple[str, str, int, int]  # name, declared type, NOT NULL, position in the primary key (0: none)


def _table_info(db: sqlite3.Connection, table: str) -> list[Column]:
    return [(r[1], r[2], r[3], r[5]) for r in db.execute(f"PRAGMA table_info({table})")]


def _columns() -> dict[str, list[Column]]:
    """table -> the columns SCHEMA gives it."""
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    out = {t: _table_info(db, t) for t in tables}
    db.close()
    return out


COLUMNS = _columns()
P = ParamSpec("P")
R = TypeVar("R")


def _sqlite_errors(method: Callable[P, R]) -> Callable[P, R]:
    """``method`` with an SQLite error (a damaged page, a locked file) turned into a one-line EmuError."""
    @wraps(method)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as exc:
            store = args[0]
            assert isinstance(store, Store)
            raise EmuError(f"the survey database {store.path}: {exc}") from None
    return guarded


class Store:
    def __init__(self, path: str, key: str) -> None:
        self.path, self.key = path, key
        try:
            self.db = sqlite3.connect(path)
            self.db.executescript(SCHEMA)
            self._validate()
        except sqlite3.Error as exc:
            raise EmuError(f"cannot open the survey database {path}: {exc}") from None

    def _validate(self) -> None:
        for table, columns in COLUMNS.items():
            if _table_info(self.db, table) != columns:
                raise EmuError(f"{self.path}: not a uprobe-emu survey database (table {table} has other columns)")
            for name, kind, not_null, _ in columns:
                allowed = _STORED_AS[kind] + (() if not_null else ("null",))
                marks = ", ".join("?" * len(allowed))
                bad = self.db.execute(f"SELECT rowid FROM {table} WHERE typeof({name}) NOT IN ({marks}) LIMIT 1",
                                      allowed).fetchone()
                if bad is not None:
                    raise EmuError(f"{self.path}: a damaged survey database (table {table}, row {bad[0]}: "
                                   f"{name} is not {kind.lower()})")

    def close(self) -> None:
        self.db.close()

    @_sqlite_errors
    def done(self, sha256: str) -> bool:
        row = self.db.execute("SELECT 1 FROM files WHERE sha256 = ? AND key = ?", (sha256, self.key)).fetchone()
        return row is not None

    @_sqlite_errors
    def saw(self, path: str, sha256: str) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO paths VALUES (?, ?)", (path, sha256))

    @_sqlite_errors
    def put(self, result: FileSurvey) -> None:
        """One file's rows, in one transaction (a repeat analysis replaces them and counts itself)."""
        key, sha = self.key, result.sha256
        with self.db:
            before = self.db.execute("SELECT analyses FROM files WHERE sha256 = ? AND key = ?", (sha, key)).fetchone()
            self.db.execute("DELETE FROM sites WHERE sha256 = ? AND key = ?", (sha, key))
            self.db.execute("DELETE FROM verdicts WHERE sha256 = ? AND key = ?", (sha, key))
            self.db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)",
                            (sha, key, result.size, result.status, result.error, 1 + (before[0] if before else 0)))
            self.db.executemany("INSERT OR REPLACE INTO sites VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
                (sha, key, s.address, s.kind, s.symbol, s.name, s.insn, s.red_zone, s.reason, json.dumps(s.live),
                 s.context) for s in result.sites])
            self.db.executemany("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?)", [
                (sha, key, s.address, s.kind, d, s.verdicts[d], None if h is None else int(h))
                for s in result.sites for d, h in s.hazard.items()])

    @_sqlite_errors
    def get(self, sha256: str) -> Stored | None:
        row = self.db.execute("SELECT status, error, size FROM files WHERE sha256 = ? AND key = ?",
                              (sha256, self.key)).fetchone()
        if row is None:
            return None
        return Stored(sha256, row[0], row[1], row[2], tuple(self._sites(sha256)))

    def _sites(self, sha256: str) -> Iterator[SiteSurvey]:
        verdicts: dict[tuple[int, str], list[tuple[str, str, int | None]]] = {}
        for address, kind, design, verdict, hazard in self.db.execute(
                "SELECT address, kind, design, verdict, hazard FROM verdicts WHERE sha256 = ? AND key = ? "
                "ORDER BY rowid", (sha256, self.key)):
            verdicts.setdefault((address, kind), []).append((design, verdict, hazard))
        for address, kind, symbol, name, insn, red_zone, reason, live, context in self.db.execute(
                "SELECT address, kind, symbol, name, insn, red_zone, reason, live, context FROM sites "
                "WHERE sha256 = ? AND key = ? ORDER BY rowid", (sha256, self.key)):
            rows = verdicts.get((address, kind), [])
            yield SiteSurvey(address, kind, symbol, name, insn, red_zone, reason,
                             self._live(live, sha256, address),
                             {d: v for d, v, _ in rows}, {d: None if h is None else bool(h) for d, _, h in rows},
                             context)

    def _live(self, text: str, sha256: str, address: int) -> tuple[tuple[int, int], ...]:
        try:
            pairs = json.loads(text)
        except (ValueError, RecursionError):
            pairs = None
        if not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p) for p in pairs):
            raise EmuError(f"{self.path}: a damaged survey database (site {address:#x} of {sha256[:16]}: "
                           "live is not a list of register pairs)")
        return tuple((a, b) for a, b in pairs)

    @_sqlite_errors
    def run_done(self, key: RunKey) -> bool:
        row = self.db.execute("SELECT 1 FROM runs WHERE entry = ? AND sha256 = ? AND design = ? AND dkey = ?",
                              key).fetchone()
        return row is not None

    @_sqlite_errors
    def put_run(self, run: DesignRun, dkey: str, name: str) -> None:
        """One corpus run's rows, in one transaction."""
        key = (run.entry, run.sha256, run.design, dkey)
        where = "WHERE entry = ? AND sha256 = ? AND design = ? AND dkey = ?"
        with self.db:
            self.db.execute(f"DELETE FROM run_sites {where}", key)
            self.db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (*key, name, run.status, run.error, int(run.same_output), run.divergence, run.wall_s))
            self.db.executemany("INSERT OR REPLACE INTO run_sites VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
                (*key, s.address, s.spec, s.hits, s.flagged, s.read_back, int(s.refused)) for s in run.sites])

    @_sqlite_errors
    def get_run(self, key: RunKey) -> tuple[str, DesignRun] | None:
        """(entry name, run) of ``key``."""
        where = "WHERE entry = ? AND sha256 = ? AND design = ? AND dkey = ?"
        row = self.db.execute(f"SELECT name, status, error, same_output, divergence, wall_s FROM runs {where}",
                              key).fetchone()
        if row is None:
            return None
        sites = tuple(SiteRun(a, spec, h, f, r, bool(x)) for a, spec, h, f, r, x in self.db.execute(
            f"SELECT address, spec, hits, flagged, read_back, refused FROM run_sites {where} ORDER BY rowid", key))
        return row[0], DesignRun(key[0], key[1], key[2], row[1], row[2], bool(row[3]), row[4], sites, row[5])

    @_sqlite_errors
    def analyses(self) -> dict[str, int]:
        """sha256 -> times analysed (under this key)."""
        return dict(self.db.execute("SELECT sha256, analyses FROM files WHERE key = ?", (self.key,)).fetchall())

    @_sqlite_errors
    def dump(self) -> list[tuple[object, ...]]:
        """Every stored result row (files without the analysis count, sites, verdicts, corpus runs
        without their wall time), sorted: equal surveys give equal dumps, whoever ran them."""
        rows: list[tuple[object, ...]] = []
        for table, cols in (("files", "sha256, key, size, status, error"), ("sites", "*"), ("verdicts", "*"),
                            ("paths", "*"), ("runs", "entry, sha256, design, dkey, name, status, error, same_output, "
                                                     "divergence"), ("run_sites", "*")):
            rows += [(table, *r) for r in self.db.execute(f"SELECT {cols} FROM {table}")]
        return sorted(rows, key=repr)
