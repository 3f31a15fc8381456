"""Result files of the benchmarks (bench/results/NAME.md): one section per measurement, with where and when it ran.

A benchmark run replaces its own section (``## <title>``) and keeps the
others, so one file collects the latest run of every mode (``append=True``
keeps every run instead); each section opens with the host, CPU, GPU, date
and commit it was measured on, and the command.

``$MNEME_BENCH_RESULTS`` names another folder for the files (the tests point
it at a temporary one; ``off`` writes none); ``$MNEME_COMMIT`` gives the
commit where the tree is not a git checkout (a copy on a GPU machine).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _gpu() -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "no GPU"
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"
    return "; ".join(sorted(set(out.splitlines()))) or "unknown GPU"


def _gpu_names() -> str:
    """The GPUs' names without the driver ("no GPU" where there is none)."""
    return "; ".join(sorted({part.split(",")[0].strip() for part in _gpu().split(";")}))


def _commit() -> str:
    if os.environ.get("MNEME_COMMIT"):
        return os.environ["MNEME_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (out.stdout.strip() or "unknown") + (" (with local changes)" if dirty else "")


def provenance(command: Sequence[str] | None = None) -> str:
    """Markdown lines: host, CPU and cores, GPU, date (UTC), commit, and the command that measured.

    Args:
        command: the command line to name (default: this process's ``sys.argv``, paths relative to the checkout).

    Returns:
        The lines, each a markdown list item, ending in a newline.
    """
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    argv = sys.argv if command is None else list(command)
    command_line = " ".join(["python", *[os.path.relpath(a, ROOT) if a.startswith(str(ROOT)) else a for a in argv]])
    return (f"* host: {socket.gethostname()}, {_cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}\n"
            f"* GPU: {_gpu()}\n* date: {now}\n* commit: {_commit()}\n* command: `{command_line}`\n")


def write_section(path: str | os.PathLike[str], title: str, body: str, *, heading: str = "",
                  command: Sequence[str] | None = None, append: bool = False) -> None:
    """Replace section ``## title`` of ``path`` (created with ``heading`` as its first line) with ``body``.

    Args:
        path: the result file.
        title: the section's title (its ``##`` line); an existing section of that title is replaced.
        body: the section's text (tables), written after the provenance lines.
        heading: the file's ``#`` title when the file is new.
        command: the command line the provenance names (default: ``sys.argv``).
        append: add the section at the end even where one of that title exists (a history of runs).
    """
    file = Path(path)
    text = file.read_text() if file.exists() else f"# {heading or file.stem}\n"
    section = f"## {title}\n\n{provenance(command)}\n{body.rstrip()}\n"
    lines = text.splitlines(keepends=True)
    start = None if append else next((i for i, line in enumerate(lines) if line.rstrip("\n") == f"## {title}"), None)
    if start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        text = "".join(lines[:start]) + section + ("\n" + "".join(lines[end:]) if end < len(lines) else "")
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)


def result_path(name: str) -> Path | None:
    """Where bench ``name``'s result file goes: ``bench/results/NAME.md``, or under ``$MNEME_BENCH_RESULTS``.

    Args:
        name: the benchmark's name (its file's stem).

    Returns:
        The file's path, or None when ``$MNEME_BENCH_RESULTS`` is ``off``.
    """
    folder = os.environ.get("MNEME_BENCH_RESULTS")
    if folder == "off":
        return None
    return (Path(folder) if folder else RESULTS_DIR) / f"{name}.md"


def write_result(name: str, title: str, body: str, *, heading: str = "", command: Sequence[str] | None = None,
                 append: bool = False) -> Path | None:
    """Write a section of bench ``name``'s result file (:func:`result_path`), with where and when it ran.

    Args:
        name: the benchmark's name; the file is ``NAME.md``.
        title: the section's title; a section of that title is replaced unless ``append``.
        body: the section's text (markdown tables, or the printed output in a text block).
        heading: the file's ``#`` title when the file is new (default: ``bench/NAME.py``).
        command: the command line the provenance names (default: ``sys.argv``).
        append: keep earlier sections of the same title (a history of runs).

    Returns:
        The file written, or None when result files are off.
    """
    path = result_path(name)
    if path is None:
        return None
    write_section(path, title, body, heading=heading or f"bench/{name}.py", command=command, append=append)
    return path


_PROGRESS = re.compile(r"^\[[\w.-]+ \d\d:\d\d:\d\d\]")  # a benchmark's progress lines: "[headline 12:00:00] ..."


def as_markdown(printed: str) -> str:
    """A benchmark's printed output as a result section: markdown as it is, other text in a text block.

    Args:
        printed: what the benchmark printed (progress lines ``[name HH:MM:SS] ...`` are left out).

    Returns:
        The section's body.
    """
    lines = [line for line in printed.splitlines() if not _PROGRESS.match(line)]
    text = "\n".join(lines).strip("\n")
    if any(line.startswith("|") for line in lines):
        return text
    return f"```text\n{text}\n```"


class _Tee(io.TextIOBase):
    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def tee_stdout():
    """Print as usual and keep a copy: ``with tee_stdout() as printed: ...; printed.getvalue()``."""
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield tee.copy


def record_output(name: str, main: Callable[[], int | None], *, title: str = "", heading: str = "") -> int:
    """Run a benchmark's ``main`` as it prints, then write what it printed to its result file.

    Written only when ``main`` succeeds (returns 0 or None) and printed something; a failed run
    leaves the file as it was.

    Args:
        name: the benchmark's name; the file is ``bench/results/NAME.md``.
        main: the benchmark's entry point, called without arguments (it reads ``sys.argv``).
        title: the section this run replaces (default: ``latest run on GPU``, so that each kind of GPU, or
            ``no GPU``, keeps its own latest run).
        heading: the file's ``#`` title when the file is new.

    Returns:
        ``main``'s exit status (0 for None).
    """
    with tee_stdout() as copy:
        status = main() or 0
    printed = copy.getvalue()
    if status == 0 and printed.strip():
        path = write_result(name, title or f"latest run on {_gpu_names()}", as_markdown(printed), heading=heading)
        if path is not None:
            print(f"results: {os.path.relpath(path)}")
    return status
