"""How a replay is verified: one settings object, passed whole from the command line to the replayer;
and how its memory is reset between launches, once a proof decided it (:class:`ResetDecision`).

The command line (``mneme replay``, ``mneme tune``) builds a :class:`VerificationSettings`; the
executor sends it with the instance it names (``replay_server.protocol.convert`` is its one
converter to and from the wire); a server keys what it prepares by it and hands it to the
:class:`mneme.replay.Replayer`. Adding a knob means adding a field here, to the converter, and to
the code that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from mneme.errors import ConfigurationError
from mneme.model.settings import Settings

#: The verification modes: the recorded annotations else bitwise (``exact``), or also bounds derived
#: from the baseline's own runs for regions that differ run to run (``auto``).
MODES = ("exact", "auto")
#: Baseline runs that show which regions differ run to run, and derive ``auto``'s bounds.
DEFAULT_RUNS = 8
#: ``auto``'s bound: this factor times the worst deviation the baseline's runs showed.
DEFAULT_SAFETY = 4.0


@dataclass(frozen=True)
class VerificationSettings(Settings):
    """How replays of one instance verify their results against the recorded epilogue.

    Attributes:
        mode: ``exact`` (the recorded annotations, else byte for byte) or ``auto`` (also bounds
            derived for the regions the baseline's own runs show to be nondeterministic).
        runs: launches of the baseline that show the spread (at least 2).
        safety: ``auto``'s bound is ``safety`` x the worst deviation of those runs (at least 1).
        overrides: ``{region selector: policy}`` that win over everything else; a selector is a
            region name, a ``0x`` base address or ``*``; a policy is a ``dtype:mode:threshold[:norm]``
            string or its dict (``mneme replay --tolerance SEL=SPEC``).
        derived: policies of the same form for the regions ``overrides`` does not select, winning
            over the recorded annotations: the bounds a tuner derived on its baseline.
        relocate: None to restore the heap at its recorded addresses and move it, as a reported
            fallback, only where those cannot be had; False to refuse instead
            (``--no-relocate``); True to move it.
        every_iteration: compare after every launch, not after the first and the last.
    """

    mode: str = "exact"
    runs: int = DEFAULT_RUNS
    safety: float = DEFAULT_SAFETY
    overrides: Mapping[str, Any] = field(default_factory=dict)
    derived: Mapping[str, Any] = field(default_factory=dict)
    relocate: bool | None = None
    every_iteration: bool = False
    what = "verification settings"  # (a class attribute: no annotation, not a field)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigurationError(f"tolerance mode {self.mode!r}: use one of {', '.join(MODES)}")
        if int(self.runs) != self.runs or self.runs < 2:
            raise ConfigurationError(f"tolerance runs {self.runs}: at least 2 runs are needed to see a spread")
        if not float(self.safety) >= 1:
            raise ConfigurationError(f"tolerance safety {self.safety}: use a factor of at least 1")
        for name in ("overrides", "derived"):
            if not isinstance(getattr(self, name), Mapping):
                raise ConfigurationError(f"tolerance {name}: expected an object mapping region selectors to policies")
        if self.relocate not in (None, True, False):
            raise ConfigurationError(f"relocate={self.relocate!r}: use None, True or False")
        object.__setattr__(self, "runs", int(self.runs))
        object.__setattr__(self, "safety", float(self.safety))
        object.__setattr__(self, "overrides", dict(self.overrides))
        object.__setattr__(self, "derived", dict(self.derived))

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain JSON-able values (every field).

        Returns:
            ``{field: value}``.
        """
        return {f.name: (dict(getattr(self, f.name)) if f.name in ("overrides", "derived") else getattr(self, f.name))
                for f in fields(self)}


@dataclass(frozen=True)
class ResetDecision:
    """What a proof made elsewhere decided (another process, a cache): the instance's replays reset
    the written memory before every launch (``each_launch``) or only before each configuration's first.

    Attributes:
        each_launch: reset before every launch.
        reason: why (shown in results as ``reset_reason``); '' when not ``each_launch``.
    """

    each_launch: bool
    reason: str = ""
