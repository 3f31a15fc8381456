"""Parallel object work with bounded memory, and the progress bar of the store verbs (transfers, check)."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def bounded_parallel(action: Callable[[T], None], items: Iterable[T], workers: int) -> None:
    """Run ``action`` over ``items`` on ``workers`` threads, at most ``2 * workers`` submitted at a time.

    The bound keeps memory proportional to ``workers`` whatever the number of
    items (each action may hold one object's bytes). The first exception an
    action raises is raised here, after the actions in flight finish.

    Args:
        action: called once per item, on a pool thread.
        items: the work; consumed lazily.
        workers: pool size (at least 1).
    """
    workers = max(1, workers)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: set[Future] = set()
        for item in items:
            if len(pending) >= 2 * workers:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
            pending.add(pool.submit(action, item))
        for future in pending:
            future.result()


class Progress:
    """A rich progress bar on stderr (by default only when it is a terminal); nothing otherwise."""

    def __init__(self, enabled: bool | None, label: str):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar = None
        self._lock = threading.Lock()
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[mb]:.1f} MB"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._task = self._bar.add_task(label, total=0, mb=0.0)

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def add_total(self, n: int) -> None:
        if self._bar is not None:
            with self._lock:
                total = self._bar.tasks[0].total or 0
                self._bar.update(self._task, total=total + n)

    def advance(self, nbytes: int = 0) -> None:
        if self._bar is not None:
            with self._lock:
                mb = self._bar.tasks[0].fields["mb"] + nbytes / 1e6
                self._bar.update(self._task, advance=1, mb=mb)
