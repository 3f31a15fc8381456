"""Result files of the benchmarks (bench/results/*.md): one section per measurement, with where and when it ran.

A benchmark run replaces its own section (``## <title>``) and keeps the
others, so one file collects the latest run of every mode; each section opens
with the host, CPU, GPU, date and commit it was measured on, and the command.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (out.stdout.strip() or "unknown") + (" (with local changes)" if dirty else "")


def provenance() -> str:
    """Markdown lines: host, CPU and cores, GPU, date (UTC), commit, and the command that measured."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join(["python", *[os.path.relpath(a, ROOT) if a.startswith(str(ROOT)) else a for a in sys.argv]])
    return (f"* host: {socket.gethostname()}, {_cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}\n"
            f"* GPU: {_gpu()}\n* date: {now}\n* commit: {_commit()}\n* command: `{command}`\n")


def write_section(path: str | os.PathLike[str], title: str, body: str, *, heading: str = "") -> None:
    """Replace section ``## title`` of ``path`` (created with ``heading`` as its first line) with ``body``.

    Args:
        path: the result file.
        title: the section's title (its ``##`` line); an existing section of that title is replaced.
        body: the section's text (tables), written after the provenance lines.
        heading: the file's ``#`` title when the file is new.
    """
    file = Path(path)
    text = file.read_text() if file.exists() else f"# {heading or file.stem}\n"
    section = f"## {title}\n\n{provenance()}\n{body.rstrip()}\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == f"## {title}"), None)
    if start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        text = "".join(lines[:start]) + section + ("\n" + "".join(lines[end:]) if end < len(lines) else "")
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)
