"""Exception types shared by every component.

Each carries a message that says what went wrong *and what to do about it*;
the CLI prints the message without a traceback.
"""


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
