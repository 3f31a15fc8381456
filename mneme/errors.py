"""Exception types shared by every component.

Each carries a message that says what went wrong *and what to do about it*;
the CLI prints the message without a traceback (:func:`run_command`).
"""

from __future__ import annotations

from typing import Callable


class MnemeError(Exception):
    """Base of every error mneme raises on purpose."""


class NotAvailableError(MnemeError):
    """A feature that is not built or not possible on this machine (no GPU, no driver...)."""


class RelocationRefusedError(NotAvailableError):
    """The recorded heap cannot have its recorded addresses in this process, and moving it was refused
    (``mneme replay --no-relocate``, ``Replayer(relocate=False)``, ``mneme tune --no-relocate``)."""


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
    prints ``mneme NAME: error: MESSAGE`` on stderr (no traceback) and gives status 2; SIGTERM
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
    except Terminated:
        print(f"mneme {name}: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"mneme {name}: interrupted", file=sys.stderr)
        return 130
