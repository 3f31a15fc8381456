"""Errors of a tuning run that are neither bad settings nor bad artifacts."""

from __future__ import annotations

from pathlib import Path

from mneme.errors import MnemeError, os_error_reason


class TuningError(MnemeError):
    """The run cannot go on (the baseline does not verify, the executor keeps failing...)."""


class ResultsDirectoryError(TuningError):
    """A results directory (or a file a run writes beside it) cannot be written: the path and the OS's reason."""


class ServersUnreachableError(TuningError):
    """No replay server of ``--servers`` answers a connection: each address with the transport's reason."""


def cannot_write(path: str | Path, exc: OSError) -> ResultsDirectoryError:
    """The error for a failed write under ``path``.

    Args:
        path: the results directory (or the file outside it) the run was writing.
        exc: the OS's error.

    Returns:
        ``cannot write PATH: REASON`` (e.g. ``Read-only file system``), to raise ``from exc``.
    """
    return ResultsDirectoryError(f"cannot write {path}: {os_error_reason(exc)}")
