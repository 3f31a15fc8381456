"""What a replay measures besides its launch times: the GPU's conditions around them, and energy.

One job, over :mod:`mneme._internal.nvml`: a :class:`Measurer` per replayer reads the GPU's clocks,
temperature, power and clock-event reasons before and after a replay's measured launches (a reading
younger than ``conditions_max_age_s`` is reused, so that replays of a few microseconds do not pay for
NVML calls each) and says whether the GPU throttled meanwhile; and, when the settings ask for energy,
runs an *energy window*: the configuration's launches back to back, in batches, for at least
``energy_window_s``, while a thread polls NVML's energy counter. The counter advances in steps (every
few to tens of milliseconds, by GPU), so the window is measured between two of its steps: mean power is
the energy between the first and the last step the poller saw, over the time between them; joules per
launch is that energy over the launches that ran between them (each batch's launches spread evenly over
its time). Where NVML, the GPU or its counter cannot say, the result carries why, never a zero.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mneme._internal import nvml
from mneme.errors import NotAvailableError
from mneme.model.measurement import MAX_ENERGY_WINDOW_S, MeasurementSettings

#: A batch of the energy window runs about this long (one engine call: its launches back to back).
BATCH_S = 0.02
#: Launches of one batch at most (the engine keeps two events per launch).
MAX_BATCH_LAUNCHES = 4096
#: Steps of the energy counter the window waits for (the first and the last bound the measured span).
MIN_COUNTER_STEPS = 3
#: How often the poller reads the counter.
POLL_S = 0.0005

Clock = Callable[[], float]


@dataclass
class EnergyReading:
    """An energy window's outcome.

    Attributes:
        energy_j: joules per launch (-1: not measured).
        power_w: mean power over the window, watts (-1: not measured).
        details: ``window_s`` (between the counter's first and last step), ``launches`` (that ran
            between them), ``counter_steps``, ``batches``, ``launches_run``; or ``error`` (why not).
    """

    energy_j: float = -1.0
    power_w: float = -1.0
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def unmeasured(cls, reason: str) -> "EnergyReading":
        """A window that measured nothing, and why.

        Args:
            reason: why.

        Returns:
            The reading.
        """
        return cls(details={"error": reason})


class CounterPoller:
    """Reads an energy counter every ``period`` seconds on a thread of its own and keeps each step:
    ``samples`` starts with the value read when polling started, then (time, value) each time the
    value changed (the time is the middle of the read that saw the change)."""

    def __init__(self, read: Callable[[], int], clock: Clock = time.monotonic, period: float = POLL_S) -> None:
        self._read, self._clock, self._period = read, clock, period
        self.samples: list[tuple[float, int]] = []
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Read the counter now and keep reading it until :meth:`stop`."""
        self.samples = [(self._clock(), self._read())]
        self._thread = threading.Thread(target=self._loop, name="energy-poller", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last = self.samples[-1][1]
        while not self._stop.wait(self._period):
            before = self._clock()
            try:
                value = self._read()
            except NotAvailableError as exc:
                self.error = str(exc)
                return
            if value != last:
                self.samples.append(((before + self._clock()) / 2, value))
                last = value

    def steps_since(self, since: float) -> int:
        """How many steps the counter made after ``since``.

        Args:
            since: a time of ``clock``.

        Returns:
            The count.
        """
        return sum(1 for t, _ in self.samples[1:] if t >= since)

    def stop(self) -> None:
        """Stop polling (waits for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def batch_launches(per_launch_s: float) -> int:
    """Launches of one energy-window batch: about ``BATCH_S`` of them, ``MAX_BATCH_LAUNCHES`` at most.

    Args:
        per_launch_s: a launch's time (the timed replay's).

    Returns:
        The count (at least 1).
    """
    if not per_launch_s > 0 or not math.isfinite(per_launch_s):
        return 1
    return max(1, min(MAX_BATCH_LAUNCHES, math.ceil(BATCH_S / per_launch_s)))


def window_limit(window_s: float) -> float:
    """How long a window may run while the counter has not stepped ``MIN_COUNTER_STEPS`` times.

    Args:
        window_s: the window asked for.

    Returns:
        Seconds: 4 x the window or 0.5 s, whichever is longer, ``MAX_ENERGY_WINDOW_S`` at most.
    """
    return min(max(4 * window_s, 0.5), MAX_ENERGY_WINDOW_S)


def energy_window(run_batch: Callable[[int], None], per_launch_s: float, read_mj: Callable[[], int],
                  window_s: float, *, clock: Clock = time.monotonic, poll_s: float = POLL_S) -> EnergyReading:
    """Run batches of launches back to back for at least ``window_s`` (longer while the counter has made
    fewer than ``MIN_COUNTER_STEPS`` steps, up to :func:`window_limit`) with the counter polled meanwhile.

    Args:
        run_batch: launches that many launches and returns when they are done (raises what the
            launches raise).
        per_launch_s: a launch's time, which sizes the batches.
        read_mj: reads the energy counter (millijoules).
        window_s: the window's length at least.
        clock: the clock the poller and the batches are timed with.
        poll_s: the poller's period.

    Returns:
        The reading (:func:`energy_from_samples`).
    """
    launches = batch_launches(per_launch_s)
    limit = window_limit(window_s)
    poller = CounterPoller(read_mj, clock, poll_s)
    poller.start()
    spans: list[tuple[float, float, int]] = []
    try:
        begin = clock()
        while True:
            start = clock()
            run_batch(launches)
            end = clock()
            spans.append((start, end, launches))
            elapsed = end - begin
            if elapsed >= window_s and poller.steps_since(begin) >= MIN_COUNTER_STEPS:
                break
            if elapsed >= limit or poller.error:
                break
    finally:
        poller.stop()
    if poller.error:
        return EnergyReading.unmeasured(poller.error)
    return energy_from_samples(poller.samples, spans)


def energy_from_samples(samples: Sequence[tuple[float, int]], spans: Sequence[tuple[float, float, int]]
                        ) -> EnergyReading:
    """Joules per launch and mean power from the counter's steps and the batches' times.

    Args:
        samples: (time, millijoules): the counter when polling began, then each step.
        spans: (start, end, launches) of each batch.

    Returns:
        The reading; unmeasured (with why) when the counter made fewer than two steps while the launches
        ran, or went backwards.
    """
    if not spans:
        return EnergyReading.unmeasured("no launches ran in the energy window")
    begin, end = spans[0][0], spans[-1][1]
    steps = [(t, e) for t, e in samples[1:] if begin <= t <= end]
    ran = sum(n for _, _, n in spans)
    if len(steps) < 2:
        return EnergyReading.unmeasured(
            f"NVML's energy counter stepped {len(steps)} time(s) during {end - begin:.3f} s of launches ({ran} "
            "launches); two steps are needed: a longer energy window (--energy-window) may do, or this GPU's "
            "counter is not updated while it runs")
    (t1, e1), (t2, e2) = steps[0], steps[-1]
    if e2 <= e1:
        return EnergyReading.unmeasured(f"NVML's energy counter went backwards ({e1} mJ, then {e2} mJ)")
    launches = sum(n * _overlap(start, stop, t1, t2) / (stop - start) for start, stop, n in spans if stop > start)
    if not launches > 0:
        return EnergyReading.unmeasured("no launch ran between the energy counter's steps")
    joules, seconds = (e2 - e1) / 1000.0, t2 - t1
    return EnergyReading(energy_j=joules / launches, power_w=joules / seconds, details={
        "window_s": round(seconds, 6), "launches": round(launches, 3), "counter_steps": len(steps),
        "batches": len(spans), "launches_run": ran})


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


class Measurer:
    """What one replayer measures besides times, on CUDA device ``ordinal``.

    Args:
        ordinal: the CUDA device the replays run on.
        settings: what to measure (:class:`mneme.model.measurement.MeasurementSettings`).
        device_of: finds the NVML device of a CUDA ordinal (:func:`mneme._internal.nvml.cuda_device`).
        clock: the clock readings are aged with.
    """

    def __init__(self, ordinal: int, settings: MeasurementSettings | None = None, *,
                 device_of: Callable[[int], nvml.Device] | None = None, clock: Clock = time.monotonic) -> None:
        self.ordinal = ordinal
        self.settings = settings or MeasurementSettings()
        self._device_of = device_of or nvml.cuda_device
        self._clock = clock
        self._device: nvml.Device | None = None
        self._unavailable: str | None = None  # None: not looked yet
        self._last: tuple[float, dict[str, Any]] | None = None  # the latest reading and when it was taken

    @property
    def unavailable(self) -> str:
        """Why the GPU's conditions cannot be read ('' when they can; NVML is initialized on first use)."""
        self.device()
        return self._unavailable or ""

    def device(self) -> nvml.Device | None:
        """The NVML device (looked up once; None where NVML cannot be used, said once per process).

        Returns:
            The device, or None.
        """
        if self._unavailable is None:
            try:
                self._device = self._device_of(self.ordinal)
                self._unavailable = ""
            except NotAvailableError as exc:
                self._unavailable = str(exc)
                nvml.say_once(f"the GPU's conditions are not recorded: {exc}")
        return self._device

    def _reading(self, now: float, fresh: bool) -> tuple[float, dict[str, Any]]:
        last = self._last
        if fresh or last is None or now - last[0] >= self.settings.conditions_max_age_s:
            last = self._last = (now, self._device.conditions())
        return last

    def before(self) -> Any:
        """Read the conditions before the measured launches (or reuse a reading young enough).

        Returns:
            What :meth:`after` takes.
        """
        if self.device() is None:
            return None
        now = self._clock()
        return self._reading(now, False), now

    def after(self, before: Any) -> dict[str, Any]:
        """The conditions around the measured launches: ``before`` (with ``age_s``: how long before the
        launches it was read), ``after`` (read after them; absent when the latest reading is younger than
        ``conditions_max_age_s``), ``throttled`` and ``throttle_reasons`` (those of either reading); or
        ``unavailable`` (why NVML cannot say).

        Args:
            before: what :meth:`before` returned.

        Returns:
            The result's ``conditions``.
        """
        if before is None:
            return {"unavailable": self.unavailable or "the GPU's conditions were not read"}
        (read_at, values), started = before
        out: dict[str, Any] = {"before": {**values, "age_s": round(max(started - read_at, 0.0), 6)}}
        readings = [values]
        now = self._clock()
        if now - self._last[0] >= self.settings.conditions_max_age_s:
            after = self._reading(now, True)[1]
            out["after"] = dict(after)
            readings.append(after)
        reasons: list[str] = []
        for reading in readings:
            reasons += [r for r in nvml.throttling(reading.get("clock_event_reasons", [])) if r not in reasons]
        out["throttled"] = bool(reasons)
        out["throttle_reasons"] = reasons
        return out

    def energy(self, run_batch: Callable[[int], None], per_launch_s: float) -> EnergyReading:
        """The energy window (:func:`energy_window`), when NVML and its counter can be used here.

        Args:
            run_batch: launches that many launches of the configuration back to back.
            per_launch_s: a launch's time.

        Returns:
            The reading (unmeasured with the reason where the counter cannot be read).
        """
        device = self.device()
        reason = self._unavailable if device is None else device.energy_unavailable_reason()
        if reason:
            nvml.say_once(f"energy is not measured: {reason}")
            return EnergyReading.unmeasured(reason)
        return energy_window(run_batch, per_launch_s, device.energy_mj, self.settings.energy_window_s,
                             clock=self._clock)
