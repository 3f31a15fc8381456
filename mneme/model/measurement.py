"""What a replay measures besides the launch times: one settings object, passed whole from the command
line to the replayer.

``mneme tune --objective energy`` (and ``mneme replay --energy``) build a :class:`MeasurementSettings`;
the executor sends it with the instance it names (``replay_server.protocol.convert`` is its one
converter to and from the wire); a server keys what it prepares by it, as by the verification
settings, and hands it to the :class:`mneme.replay.Replayer`. The GPU's conditions (clocks,
temperature, power, clock-event reasons) are read around every replay where NVML is there; the
energy window runs only when ``energy`` asks for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mneme.errors import ConfigurationError
from mneme.model.settings import Settings

#: The energy window's default length: the configuration's launches run back to back at least this long.
DEFAULT_ENERGY_WINDOW_S = 0.1
#: The longest an energy window runs, extended or not (the replay watchdog's slack covers it).
MAX_ENERGY_WINDOW_S = 2.0
#: The shortest: below it NVML's energy counter does not advance often enough to say anything.
MIN_ENERGY_WINDOW_S = 0.01
#: A conditions reading younger than this is reused (0: every replay reads before and after its launches).
DEFAULT_CONDITIONS_MAX_AGE_S = 0.05


@dataclass(frozen=True)
class MeasurementSettings(Settings):
    """What replays of one instance measure besides the launch times.

    Attributes:
        energy: after a configuration's verified replay, run its launches back to back for an energy
            window and report joules per launch and mean power (``energy_j``, ``power_w``) from NVML's
            energy counter.
        energy_window_s: the window's length at least (it is extended until the counter advanced
            often enough: to 4 x this or 0.5 s, whichever is longer, and ``MAX_ENERGY_WINDOW_S`` at most).
        conditions_max_age_s: a reading of the GPU's conditions younger than this is reused for the
            next replay (0: every replay reads them before and after its launches).
    """

    energy: bool = False
    energy_window_s: float = DEFAULT_ENERGY_WINDOW_S
    conditions_max_age_s: float = DEFAULT_CONDITIONS_MAX_AGE_S
    what = "measurement settings"  # (a class attribute: no annotation, not a field)

    def __post_init__(self) -> None:
        if not isinstance(self.energy, bool):
            raise ConfigurationError(f"energy={self.energy!r}: give true or false")
        window = _seconds(self.energy_window_s, "energy window")
        if not MIN_ENERGY_WINDOW_S <= window <= MAX_ENERGY_WINDOW_S:
            raise ConfigurationError(f"energy window {window:g} s: give {MIN_ENERGY_WINDOW_S:g} to "
                                     f"{MAX_ENERGY_WINDOW_S:g} seconds")
        age = _seconds(self.conditions_max_age_s, "conditions max age")
        if age < 0:
            raise ConfigurationError(f"conditions max age {age:g} s: give 0 or more seconds")
        object.__setattr__(self, "energy_window_s", window)
        object.__setattr__(self, "conditions_max_age_s", age)


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(f"{what} {value!r}: give a number of seconds")
    return float(value)


#: The key of the default settings (no energy window): what a request that names none is served with.
DEFAULT_MEASUREMENT = MeasurementSettings().key()
