"""Running an application with the apply library: its environment, the plan's lifetime, the report.

The plan and the tuned code live in a private temporary directory that is
removed when the application ends, however it ends (exit, crash, signal,
Ctrl-C of ``mneme run``): nothing outlives the run. The apply library prints
one line per kernel at the application's exit and writes the same as JSON
lines to ``report.jsonl`` in that directory, read here before it goes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from mneme._internal.signals import exit_status, forward_signals, restore_signals, wait_for
from mneme.apply.device import driver_version
from mneme.apply.plan import ApplyOptions, ApplyPlan, build_plan
from mneme.apply.results import read_results
from mneme.errors import ConfigurationError, NotAvailableError

APPLY_ENV = "MNEME_APPLY"
LIBRARY_ENV = "MNEME_APPLY_LIB"
LIBRARY_NAME = "libmneme_apply.so"


def apply_library(env: Mapping[str, str] = os.environ) -> Path:
    """``libmneme_apply.so``: ``MNEME_APPLY_LIB``, else the copy installed in ``mneme/lib``."""
    from mneme._internal.native_libs import native_library

    return native_library(LIBRARY_NAME, LIBRARY_ENV, "mneme_apply", env)


def results_from(arguments: Sequence[str], env: Mapping[str, str] = os.environ) -> list[str]:
    """``--apply`` arguments, else ``MNEME_APPLY`` (paths separated by ':' or whitespace)."""
    if arguments:
        return list(arguments)
    text = env.get(APPLY_ENV, "")
    return [p for part in text.split(os.pathsep) for p in part.split()]


@dataclass
class KernelReport:
    kernel: str
    static_hash: str
    launches: int
    applied: int
    verified: int
    verify_failed: int
    left_alone: dict[str, int] = field(default_factory=dict)


@dataclass
class RunResult:
    exit_code: int
    plan: ApplyPlan
    reports: list[KernelReport] | None  # None: the application ended before the library wrote them


def application_environment(plan_path: Path, report_path: Path, base: Mapping[str, str]) -> dict[str, str]:
    from mneme._internal.native_libs import cupti_library

    library = str(apply_library(base))
    env = dict(base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = library + (" " + preload if preload else "")
    env["CUDA_INJECTION64_PATH"] = library
    # The module-loaded callback must come before a kernel's first launch (design.md section 4).
    env["CUDA_MODULE_LOADING"] = "EAGER"
    cupti = cupti_library(base)
    if cupti is not None:
        env.setdefault("MNEME_CUPTI_PATH", str(cupti))
    env["MNEME_APPLY_PLAN"] = str(plan_path)
    env["MNEME_APPLY_REPORT"] = str(report_path)
    env.pop(APPLY_ENV, None)
    return env


def read_report(path: Path) -> list[KernelReport] | None:
    if not path.is_file():
        return None
    return [KernelReport(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def run_with_apply(command: Sequence[str], results: Sequence[str], options: ApplyOptions,
                   env: Mapping[str, str] | None = None, notes: Callable[[str], None] = lambda text: None) -> RunResult:
    """Build the plan, run ``command`` under the apply library, return its exit status and the report.

    ``notes`` hears about results the plan leaves out, before the application starts.
    """
    if not command:
        raise ConfigurationError("no application given: mneme run --apply RESULTS... -- ./app args")
    base = dict(os.environ if env is None else env)
    work = Path(tempfile.mkdtemp(prefix="mneme-apply-"))
    try:
        kernels = [read_results(r) for r in results]
        plan = build_plan(kernels, options, work, driver_here=driver_version())
        for note in plan.notes:
            notes(note)
        plan_path = plan.write(work / "plan.txt")
        report_path = work / "report.jsonl"
        child_env = application_environment(plan_path, report_path, base)
        try:
            proc = subprocess.Popen(list(command), env=child_env)
        except FileNotFoundError as exc:
            raise NotAvailableError(f"cannot start {command[0]!r}: {exc.strerror}; check the path after '--'") from exc
        previous = forward_signals(proc)  # a batch system's SIGTERM reaches the application; we clean up after it
        try:
            code = wait_for(proc)
        finally:
            restore_signals(previous, proc)
        return RunResult(exit_status(code), plan, read_report(report_path))
    finally:
        shutil.rmtree(work, ignore_errors=True)
