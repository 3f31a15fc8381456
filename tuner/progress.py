"""What a tuning run shows while it works.

On a terminal: a rich progress bar with trials done, failures and the best so
far. Elsewhere (a pipe, a CI log): one plain line per trial. With
``--quiet``: nothing. The log file gets every line regardless.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def format_ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


def describe_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def trial_line(record: dict[str, Any], done: int, total: int | None) -> str:
    counter = f"[{done}/{total}]" if total else f"[{done}]"
    head = f"{counter} {record['status']:<19} {describe_params(record.get('params') or {})}"
    if record.get("metric") is not None:
        speed = f" speedup={record['speedup']:.3f}" if record.get("speedup") is not None else ""
        return f"{head} metric={format_ns(record['metric'])}{speed}"
    return f"{head} error={(record.get('error') or '').splitlines()[0] if record.get('error') else ''}"


class Reporter:
    """The plain-text reporter (also the base of the others)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.total: int | None = None
        self.done = 0
        self.failed = 0
        self.best: str = "-"

    def start(self, total: int | None) -> None:
        self.total = total

    def message(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def trial(self, record: dict[str, Any], best_text: str) -> None:
        self.done += 1
        self.failed += record["status"] != "verified"
        self.best = best_text
        self.message(trial_line(record, self.done, self.total))

    def finish(self) -> None:
        pass


class QuietReporter(Reporter):
    def message(self, text: str) -> None:
        pass

    def trial(self, record: dict[str, Any], best_text: str) -> None:
        self.done += 1  # counted; no line is made (a trial costs the loop microseconds)
        self.failed += record["status"] != "verified"
        self.best = best_text


class RichReporter(Reporter):
    """A live progress bar; messages print above it."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(file=self.stream)
        self.progress = Progress(
            TextColumn("[bold]tuning"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.task = None

    def start(self, total: int | None) -> None:
        super().start(total)
        self.progress.start()
        self.task = self.progress.add_task("tuning", total=total, failed=0, best="-")

    def message(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def trial(self, record: dict[str, Any], best_text: str) -> None:
        self.done += 1
        self.failed += record["status"] != "verified"
        self.best = best_text
        if self.task is not None:
            self.progress.update(self.task, completed=self.done, failed=self.failed, best=best_text)

    def finish(self) -> None:
        if self.task is not None:
            self.progress.stop()
            self.task = None


def make_reporter(quiet: bool, stream: TextIO | None = None, is_tty: bool | None = None) -> Reporter:
    stream = stream or sys.stdout
    if quiet:
        return QuietReporter(stream)
    tty = stream.isatty() if is_tty is None else is_tty
    return RichReporter(stream) if tty else Reporter(stream)
