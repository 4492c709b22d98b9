"""The executor: functions run as tasks on Dask distributed, or inline in this process.

One executor serves the survey (a file per task, then a corpus run per task) and the fuzzer (a
campaign shard per task). ``with executor() as pool`` opens it; ``pool.map(fn, tasks)`` runs
``fn(*task)`` for each task and yields the results as they complete (inline: in order). The Dask
pool starts its cluster on the first ``map`` only, so a survey with nothing left to do starts none,
and keeps it for the next ``map``: the static and the dynamic half share one cluster. Workers of
an existing scheduler (``tcp://HOST:PORT``) need only this package installed (and the same paths).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, TypeVar

from emu.errors import UsageError

R = TypeVar("R")


class Pool(Protocol):
    def map(self, fn: Callable[..., R], tasks: Sequence[tuple[Any, ...]]) -> Iterator[R]: ...


Executor = Callable[[], AbstractContextManager[Pool]]


class InlinePool:
    """Each task in this process, in order (tests, a library caller)."""

    def map(self, fn: Callable[..., R], tasks: Sequence[tuple[Any, ...]]) -> Iterator[R]:
        return (fn(*task) for task in tasks)


@contextmanager
def inline() -> Iterator[Pool]:
    yield InlinePool()


class DaskPool:
    """Tasks on ``scheduler``'s workers, else on a LocalCluster of ``jobs`` single-threaded processes."""

    def __init__(self, scheduler: str | None, jobs: int) -> None:
        self.scheduler = scheduler
        self.jobs = jobs
        self._client: Any = None
        self._cluster: Any = None

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        import logging

        from distributed import Client, LocalCluster

        try:
            if not self.scheduler:
                # distributed's constructors and as_completed carry no annotations
                self._cluster = LocalCluster(n_workers=self.jobs, threads_per_worker=1,  # type: ignore[no-untyped-call]
                                             processes=True, dashboard_address=":0", silence_logs=logging.CRITICAL)
            self._client = Client(self.scheduler or self._cluster, timeout="20s")  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError, ValueError) as exc:
            self.close()
            raise UsageError(f"cannot reach the Dask scheduler {self.scheduler}: {exc}") from None
        return self._client

    def map(self, fn: Callable[..., R], tasks: Sequence[tuple[Any, ...]]) -> Iterator[R]:
        if not tasks:
            return iter(())
        from distributed import as_completed

        client = self._connect()
        futures = [client.submit(fn, *task, pure=False) for task in tasks]
        return _results(futures, as_completed(futures))  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


def _results(futures: list[Any], completed: Any) -> Iterator[Any]:
    try:
        for future in completed:
            yield future.result()
    finally:  # Ctrl-C, or the caller stopped early: the rest need not run
        for future in futures:
            future.cancel()


def dask_executor(scheduler: str | None, jobs: int) -> Executor:
    @contextmanager
    def run() -> Iterator[Pool]:
        pool = DaskPool(scheduler, jobs)
        try:
            yield pool
        finally:
            pool.close()

    return run
