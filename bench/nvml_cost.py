"""What reading the GPU's conditions costs a replay, and how often NVML's energy counter steps.

    python bench/nvml_cost.py [--gpu 0] [--reps 2000] [--counter-seconds 2]

Prints, for CUDA device ``--gpu`` (found by its PCI bus id, as the replays find it):

* the time of each NVML call a conditions reading makes (SM and memory clocks, temperature, power,
  clock-event reasons) and of the energy counter, in microseconds (mean, median, 99th percentile over
  ``--reps`` calls);
* a whole ``conditions()`` reading, and what a replay pays per result for the readings around its launches
  (``Measurer.before`` + ``after``) at the default ``conditions_max_age_s`` (readings reused within 50 ms)
  and at 0 (read before and after every replay);
* the energy counter's steps while the GPU is idle for ``--counter-seconds``: how many, and the time between
  them (median, min, max): the energy window must span at least two.

No kernel runs: the costs are the host's. A replay server calls these from its worker processes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # an installed mneme wins over the checkout


def timed_us(call, reps: int) -> list[float]:
    """Microseconds of ``reps`` calls of ``call``."""
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1e6)
    return out


def row(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"| {name} | {statistics.fmean(samples):.1f} | {statistics.median(samples):.1f} | {p99:.1f} |"


def counter_steps(device, seconds: float) -> list[float]:
    """The times (s) between the energy counter's steps over ``seconds`` of polling every 0.5 ms."""
    steps, last, end = [], device.energy_mj(), time.monotonic() + seconds
    while time.monotonic() < end:
        value = device.energy_mj()
        if value != last:
            steps.append(time.monotonic())
            last = value
        time.sleep(0.0005)
    return [b - a for a, b in zip(steps, steps[1:])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="CUDA device ordinal (default 0)")
    parser.add_argument("--reps", type=int, default=2000, help="calls per measurement (default 2000)")
    parser.add_argument("--counter-seconds", type=float, default=2.0,
                        help="how long to watch the energy counter step (default 2 s)")
    args = parser.parse_args(argv)

    from mneme._internal import nvml
    from mneme.model.measurement import MeasurementSettings
    from mneme.replay.measurement import Measurer

    reason = nvml.unavailable_reason()
    if reason:
        print(f"NVML is not usable here: {reason}", file=sys.stderr)
        return 2
    device = nvml.cuda_device(args.gpu)
    lib, handle = device._nvml, device.handle
    calls = {
        "nvmlDeviceGetClockInfo(SM)": lambda: lib.nvmlDeviceGetClockInfo(handle, nvml.CLOCK_SM),
        "nvmlDeviceGetClockInfo(MEM)": lambda: lib.nvmlDeviceGetClockInfo(handle, nvml.CLOCK_MEM),
        "nvmlDeviceGetTemperature": lambda: lib.nvmlDeviceGetTemperature(handle, nvml.TEMPERATURE_GPU),
        "nvmlDeviceGetPowerUsage": lambda: lib.nvmlDeviceGetPowerUsage(handle),
        "clock-event reasons": device._reasons,
        "energy counter (nvmlDeviceGetTotalEnergyConsumption)": device.energy_mj,
        "conditions() (the five reads above)": device.conditions,
    }
    print(f"GPU {args.gpu} ({device.pci_bus_id}), {args.reps} calls each\n")
    print("| call | mean (us) | median (us) | p99 (us) |\n| --- | --- | --- | --- |")
    for name, call in calls.items():
        print(row(name, timed_us(call, args.reps)))
    for label, age in (("per replay, readings reused within 50 ms (default)", None), ("per replay, max age 0", 0.0)):
        settings = MeasurementSettings() if age is None else MeasurementSettings(conditions_max_age_s=age)
        measurer = Measurer(args.gpu, settings)
        print(row(f"Measurer before+after, {label}", timed_us(lambda: measurer.after(measurer.before()), args.reps)))
    gaps = counter_steps(device, args.counter_seconds)
    print(f"\nenergy counter, GPU idle, {args.counter_seconds:g} s: {len(gaps) + 1 if gaps else 0} steps", end="")
    if gaps:
        print(f"; between steps: median {statistics.median(gaps) * 1e3:.2f} ms, min {min(gaps) * 1e3:.2f} ms, "
              f"max {max(gaps) * 1e3:.2f} ms")
    else:
        print(" (the counter did not step: an energy window cannot measure on this GPU)")
    return 0


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    sys.exit(record_output("nvml_cost", main))
