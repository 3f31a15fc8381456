"""Errors of a tuning run that are neither bad settings nor bad artifacts."""

from mneme.errors import MnemeError


class TuningError(MnemeError):
    """The run cannot go on (the baseline does not verify, the executor keeps failing...)."""
