"""Exception types shared by every component.

Each carries a message that says what went wrong *and what to do about it*;
the CLI prints the message without a traceback (:func:`run_command`).
"""

from __future__ import annotations

import errno
from collections.abc import Callable


class MnemeError(Exception):
    """Base of every error mneme raises on purpose."""


class NotAvailableError(MnemeError):
    """A feature that is not built or not possible on this machine (no GPU, no driver...)."""


class RelocationRefusedError(NotAvailableError):
    """The recorded heap cannot have its recorded addresses in this process, and moving it was refused
    (``mneme replay --no-relocate``, ``VerificationSettings(relocate=False)``, ``mneme tune --no-relocate``)."""


class ArtifactError(MnemeError):
    """A recording artifact is missing, truncated, corrupt or of an unknown format."""


class UnsupportedInstanceError(MnemeError):
    """A recorded launch the recorder could not capture faithfully: replaying it would not mean anything."""


class ConfigurationError(MnemeError):
    """An experiment configuration or command-line setting is invalid."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (a batch system's time limit, ``kill``): a command that handles it stops as on
    Ctrl-C, keeping what it has done, and exits with status 143."""


def run_command(name: str, action: "Callable[[], int | None]") -> int:
    """Run one command's action and turn the errors mneme raises on purpose into exit statuses.

    The one place that decides what a user sees when a command fails: a :class:`MnemeError`
    prints ``mneme NAME: error: MESSAGE`` on stderr (no traceback) and gives status 2, and so does
    an ``OSError`` no component explained (:func:`os_error_message`); SIGTERM
    (:class:`Terminated`) gives 143 and Ctrl-C 130, each with one line.

    Args:
        name: the command's name as the user typed it (``tune``, ``serve``...).
        action: what the command does; its return value is the exit status (None: 0).

    Returns:
        The process exit status.
    """
    import sys

    try:
        return int(action() or 0)
    except MnemeError as exc:
        print(f"mneme {name}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file-system or network error no component explained: one line, not a traceback
        print(f"mneme {name}: error: {os_error_message(exc)}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"mneme {name}: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"mneme {name}: interrupted", file=sys.stderr)
        return 130


def os_error_message(exc: OSError) -> str:
    """One line for an OS error that no component turned into a MnemeError: the path, then the OS's reason.

    Args:
        exc: the error; its ``filename``/``filename2`` name the paths when the failed OS call had any.

    Returns:
        ``cannot access /out/x: Permission denied`` (with the disk full, what to do), or the reason alone.
    """
    reason = os_error_reason(exc)
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    return f"cannot access {' -> '.join(paths)}: {reason}" if paths else reason


def os_error_reason(exc: OSError) -> str:
    """The OS's reason for ``exc`` without its paths: ``Permission denied``, ``Read-only file system``,
    ``No space left on device; free some space``.

    Args:
        exc: the error.

    Returns:
        The reason, for a message that names the path itself.
    """
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += "; free some space"
    return reason
