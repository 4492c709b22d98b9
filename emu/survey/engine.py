"""Running a survey: find the files, skip what the database already holds, run the rest as tasks.

The client walks the paths (regular files, not following symlinks), reads each file's first bytes
(not an ELF file: counted and skipped) and hashes the ELF ones; a content the store has under the
same designs is not analysed again. The rest go to an executor: Dask distributed by default (an
in-process LocalCluster of ``jobs`` worker processes, or an existing scheduler's workers, which
need only this package installed and the same paths), or inline in this process (tests, a library
caller). Each result is stored as it arrives, so an interrupted survey keeps what is done.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from emu.designs import Design
from emu.errors import UsageError
from emu.survey.analyze import FileSurvey, survey_file
from emu.survey.store import Store, Stored

Task = tuple[str, str]  # (path, sha256)
Executor = Callable[[Sequence[Task], Sequence[Design]], AbstractContextManager[Iterator[FileSurvey]]]
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


@contextmanager
def inline(tasks: Sequence[Task], designs: Sequence[Design]) -> Iterator[Iterator[FileSurvey]]:
    yield (survey_file(path, sha, designs) for path, sha in tasks)


def dask_executor(scheduler: str | None, jobs: int) -> Executor:
    """Tasks on a Dask cluster: ``scheduler`` (tcp://HOST:PORT), else a LocalCluster of ``jobs`` processes."""

    @contextmanager
    def run(tasks: Sequence[Task], designs: Sequence[Design]) -> Iterator[Iterator[FileSurvey]]:
        import logging

        from distributed import Client, LocalCluster, as_completed

        try:
            cluster = None if scheduler else LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                                          dashboard_address=":0", silence_logs=logging.CRITICAL)
            client = Client(scheduler or cluster, timeout="20s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise UsageError(f"cannot reach the Dask scheduler {scheduler}: {exc}") from None
        try:
            futures = [client.submit(survey_file, path, sha, list(designs), key=f"survey-{sha}-{i}", pure=False)
                       for i, (path, sha) in enumerate(tasks)]
            yield (future.result() for future in as_completed(futures))
        finally:
            client.close()
            if cluster is not None:
                cluster.close()

    return run


@dataclass
class Outcome:
    walk: Walk
    results: dict[str, Stored]  # sha256 -> stored result, for every ELF content of this survey
    analysed: int = 0  # files analysed by this run (the rest came from the database)
    complete: bool = True


def survey(paths: Sequence[str], designs: Sequence[Design], store: Store, executor: Executor,
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
            with executor(tasks, designs) as results:
                for result in results:
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


def _bar(total: int, show: bool):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    return tqdm(total=total, unit="file", file=sys.stderr, disable=not (show and sys.stderr.isatty()), leave=False)
