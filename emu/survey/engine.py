"""Running a survey: find the files, skip what the database already holds, run the rest as tasks.

The client walks the paths (regular files, not following symlinks), reads each file's first bytes
(not an ELF file: counted and skipped) and hashes the ELF ones; a content the store has under the
same designs is not analysed again. The rest go to the executor's pool (emu/dist.py: Dask by
default, or inline). Each result is stored as it arrives, so an interrupted survey keeps what is
done.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from emu.designs import Design
from emu.dist import Pool
from emu.errors import UsageError
from emu.survey.analyze import survey_file
from emu.survey.corpus import Entry
from emu.survey.dynamic import DesignRun, LibrarySites, run_entry
from emu.survey.libraries import Discovery, Reached, discover
from emu.survey.native import Recorded, compare
from emu.survey.store import RunKey, Store, Stored, design_key

ELF_MAGIC = b"\x7fELF"


@dataclass
class Walk:
    """What the paths hold: ELF files to survey (path -> sha256) and the counts of everything else."""

    elf: dict[str, str] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)  # files, not-elf, unreadable, missing, links, special

    def add(self, path: str) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            self.counts["missing"] += 1
            return
        if stat.S_ISLNK(st.st_mode):
            self.counts["links"] += 1
        elif stat.S_ISREG(st.st_mode):
            self.counts["files"] += 1
            self._file(path)
        elif not stat.S_ISDIR(st.st_mode):
            self.counts["special"] += 1

    def _file(self, path: str) -> None:
        try:
            with open(path, "rb") as fh:
                if fh.read(4) != ELF_MAGIC:
                    self.counts["not-elf"] += 1
                    return
                fh.seek(0)
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
        except OSError:
            self.counts["unreadable"] += 1
            return
        self.elf[path] = digest


def walk(paths: Iterable[str]) -> Walk:
    """Every regular file under ``paths`` (a named symlink is followed; one met in a tree is counted)."""
    found = Walk()
    usable = 0
    for top in paths:
        if not os.path.exists(top):
            found.counts["missing"] += 1
            continue
        usable += 1
        top = os.path.realpath(top) if os.path.islink(top) else top
        if not os.path.isdir(top):
            found.add(top)
            continue
        for root, dirs, files in os.walk(top, onerror=lambda _err: found.counts.update(("unreadable",))):
            dirs.sort()
            for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                found.add(os.path.join(root, name))
    if not usable:
        raise UsageError(f"no such file or directory: {', '.join(paths)}")
    return found


@dataclass(frozen=True, slots=True)
class CorpusRun:
    name: str  # the entry's
    binary: str
    run: DesignRun


@dataclass
class Outcome:
    walk: Walk
    results: dict[str, Stored]  # sha256 -> stored result, for every ELF content of this survey
    analysed: int = 0  # files analysed by this run (the rest came from the database)
    complete: bool = True
    runs: list[CorpusRun] = field(default_factory=list)  # the corpus runs (--corpus), stored or new
    ran: int = 0  # corpus runs made by this survey (the rest came from the database)
    entries: dict[str, Entry] = field(default_factory=dict)  # the corpus entries, by name
    # entry name -> its unprobed emulated run against the native record (native.compare)
    fidelity: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def survey(paths: Sequence[str], designs: Sequence[Design], store: Store, pool: Pool,
           max_files: int | None = None, progress: bool = False) -> Outcome:
    """Survey ``paths``; stops after ``max_files`` new analyses (None: all)."""
    found = walk(paths)
    pending: dict[str, str] = {}  # sha256 -> first path
    for path, sha in found.elf.items():
        store.saw(path, sha)
        if not store.done(sha):
            pending.setdefault(sha, path)
    tasks = [(path, sha) for sha, path in pending.items()][:max_files]
    outcome = Outcome(found, {}, complete=len(tasks) == len(pending))
    if tasks:
        bar = _bar(len(tasks), progress)
        try:
            for result in pool.map(survey_file, [(path, sha, list(designs)) for path, sha in tasks]):
                if result.status != "changed":  # its hash no longer names its content
                    store.put(result)
                outcome.analysed += 1
                bar.update(1)
        except KeyboardInterrupt:
            sys.stderr.write(f"survey interrupted: {outcome.analysed} files analysed this run are kept in the "
                             "database; run again to go on\n")
            raise
        finally:
            bar.close()
    for sha in dict.fromkeys(found.elf.values()):
        stored = store.get(sha)
        if stored is not None:
            outcome.results[sha] = stored
    return outcome


def run_corpus(entries: Sequence[Entry], designs: Sequence[Design], store: Store, pool: Pool, outcome: Outcome,
               progress: bool = False, records: dict[str, Recorded] | None = None) -> None:
    """Each entry under each design (the ones the database lacks as tasks); into ``outcome.runs``.
    The entries' binaries must be in ``outcome`` (surveyed statically): "all sites" are theirs, and
    those of the files their processes map, which are surveyed here (into ``outcome`` too). Each
    entry's unprobed run is compared with its native record (``records``, native.py)."""
    keyed: list[tuple[RunKey, Entry, Design, tuple[int, ...] | None, LibrarySites, Reached]] = []
    outcome.entries.update((e.name, e) for e in entries)
    discovered = _discover(entries, pool, outcome, records or {})
    libraries = _library_sites(discovered, designs, store, pool, outcome, progress)
    for entry in entries:
        sha = _digest(entry.binary)
        stored = outcome.results.get(sha)
        if stored is None or stored.status != "ok":
            raise UsageError(f"--corpus: {entry.binary} is not an x86-64 ELF file the survey could read")
        sites = None if entry.probes is not None else _addresses(stored)
        found = entry.run_key()
        libs, reached = libraries.get(found, ()), discovered[found][1].reached if entry.probes is None else {}
        keyed += [((entry.content_key(), sha, d.name, design_key(d)), entry, d, sites, libs, reached) for d in designs]
    keyed = list({k[0]: k for k in keyed}.values())  # an entry given twice runs (and counts) once
    tasks = _per_entry([(entry, key[1], d, sites, libs, reached) for key, entry, d, sites, libs, reached in keyed
                        if not store.run_done(key)])
    names = {k[0]: k[1].name for k in keyed}
    dkeys = {d.name: design_key(d) for d in designs}
    if tasks:
        bar = _bar(sum(len(t[2]) for t in tasks), progress, "run")
        try:
            for runs in pool.map(run_entry, tasks):
                for run in runs:
                    if run.status != "changed":
                        key = (run.entry, run.sha256, run.design, dkeys[run.design])
                        store.put_run(run, key[3], names[key])
                    outcome.ran += 1
                    bar.update(1)
        except KeyboardInterrupt:
            sys.stderr.write(f"survey interrupted: {outcome.ran} corpus runs made this time are kept in the "
                             "database; run again to go on\n")
            raise
        finally:
            bar.close()
    for key, entry, *_rest in keyed:
        got = store.get_run(key)
        if got is not None:
            outcome.runs.append(CorpusRun(got[0], entry.binary, got[1]))


RunTask = tuple[Entry, str, Design, tuple[int, ...] | None, LibrarySites, Reached]  # one design's run
EntryTask = tuple[Entry, str, list[Design], tuple[int, ...] | None, LibrarySites, Reached]  # run_entry's arguments


def _per_entry(runs: list[RunTask]) -> list[EntryTask]:
    """One task per entry and binary, for the designs it still lacks: their runs share one unprobed
    reference run, as `check` of several designs does."""
    grouped: dict[tuple[str, str], EntryTask] = {}
    for entry, sha, design, sites, libs, reached in runs:
        grouped.setdefault((entry.content_key(), sha), (entry, sha, [], sites, libs, reached))[2].append(design)
    return list(grouped.values())


def _addresses(stored: Stored) -> tuple[int, ...]:
    return tuple(dict.fromkeys(s.address for s in stored.sites))


def _discover(entries: Sequence[Entry], pool: Pool, outcome: Outcome,
              records: dict[str, Recorded]) -> dict[str, tuple[Entry, Discovery]]:
    """Each entry run once unprobed (libraries.py): the files its processes map, the code it runs, and
    its output, held against the native record (into ``outcome.fidelity``)."""
    unique = {e.run_key(): e for e in entries}
    found = {d.key: (unique[d.key], d) for d in pool.map(discover, [(entry,) for entry in unique.values()])}
    outcome.fidelity = {entry.name: compare(entry, d.output, records) for entry, d in found.values()}
    return found


def _library_sites(discovered: dict[str, tuple[Entry, Discovery]], designs: Sequence[Design], store: Store,
                   pool: Pool, outcome: Outcome, progress: bool) -> dict[str, LibrarySites]:
    """For each "all sites" entry, every site of the other files its processes map, as the real kernel
    would probe them; those files are surveyed statically into ``outcome`` first."""
    mapped = {key: d.files for key, (entry, d) in discovered.items() if entry.probes is None}
    files = list(dict.fromkeys(path for paths in mapped.values() for path in paths))
    if not files:
        return {}
    static = survey(files, designs, store, pool, progress=progress)
    outcome.walk.counts["files"] += sum(path not in outcome.walk.elf for path in static.walk.elf)
    outcome.walk.elf.update(static.walk.elf)
    outcome.results.update(static.results)
    outcome.analysed += static.analysed
    by_path = {path: stored for path, sha in static.walk.elf.items()
               if (stored := static.results.get(sha)) is not None and stored.status == "ok" and stored.sites}
    return {key: tuple((path, _addresses(by_path[path])) for path in paths if path in by_path)
            for key, paths in mapped.items()}


def _digest(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        raise UsageError(f"--corpus: {path}: {exc.strerror}") from None


def _bar(total: int, show: bool, unit: str = "file"):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, file=sys.stderr, disable=not (show and sys.stderr.isatty()), leave=False)
