"""What the tuner's sampler costs per trial as a run grows: TPE (and random) at 1,000-3,000 trials.

    python bench/tpe_cost.py [--trials 3000] [--in-flight 1,56] [--samplers tpe,random]

Runs the tuner's strategy (``tuner.strategies.sample_strategy.OptunaSamplingStrategy``) the way the
tuning loop does, without replays: it keeps ``--in-flight`` candidates asked and not yet told (the
loop keeps the servers' capacity in flight: ``tuner.run.in_flight``), tells the oldest one a
synthetic value (``bench/tpe_efficiency.py``'s cost model) and asks the next. The space is the
built-in space of the ``full`` preset over the reference's vector add (every knob, the launch shape along
x: tens of thousands of points). Each row gives the sampler's CPU milliseconds per trial (ask + tell)
within a window of trials: TPE's grows with the trials it has seen; random's does not.

The tuner asks while the servers replay what is in flight; the sampler keeps a GPU fed as long as its
cost per trial stays under the servers' time per configuration (at 2,400 configurations/s: 0.42 ms).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.append(str(Path(__file__).resolve().parents[1]))  # an installed mneme wins over the checkout
sys.path.append(str(Path(__file__).resolve().parent))

from tpe_efficiency import synthetic_time  # noqa: E402

from mneme.model.experiment import Dim3  # noqa: E402
from tuner.space.builtin import BuiltinSearchSpace, preset_settings  # noqa: E402
from tuner.strategies.sample_strategy import OptunaSamplingStrategy  # noqa: E402

WINDOWS = (0, 250, 500, 1000, 1500, 2000, 2500, 3000)


def full_space():
    """The ``full`` preset's built-in space over the reference's launch (grid 40000 x block 256)."""
    kernel = SimpleNamespace(grid_dim=Dim3(40000), block_dim=Dim3(256), shared_mem=0)
    return BuiltinSearchSpace(kernel, preset_settings("full", {"launch_dim": "x"}))


def cost_per_trial(sampler: str, trials: int, in_flight: int, seed: int = 0) -> dict[tuple[int, int], float]:
    """Milliseconds per trial (ask + tell) in each window of ``WINDOWS``, with ``in_flight`` outstanding."""
    strategy = OptunaSamplingStrategy(full_space(), sampler, seed=seed)
    pending: collections.deque = collections.deque()
    spent: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
    windows = [(a, b) for a, b in zip(WINDOWS, WINDOWS[1:]) if a < trials]
    asked = 0
    while asked < trials:
        start = time.thread_time()  # CPU time: what the sampler costs, whatever else runs on the host
        if len(pending) >= in_flight:
            candidate = pending.popleft()
            value = synthetic_time(candidate.configuration)
            strategy.tell(candidate, None if value is None else [value])
        candidate = strategy.ask()
        seconds = time.thread_time() - start
        if candidate is None:
            break
        pending.append(candidate)
        for low, high in windows:
            if low <= asked < high:
                spent[(low, high)].append(seconds * 1e3)
        asked += 1
    return {window: statistics.fmean(ms) for window, ms in spent.items() if ms}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3000)
    p.add_argument("--in-flight", default="1,32", help="candidates asked and not yet told (default 1,32: one worker's server capacity)")
    p.add_argument("--samplers", default="tpe,random")
    p.add_argument("--results-file", default=str(Path(__file__).resolve().parent / "results" / "tpe_cost.md"))
    p.add_argument("--no-results-file", action="store_true")
    args = p.parse_args(argv)
    space = full_space()
    from tuner.space.search_space import space_size

    print(f"space: the full preset over the reference's vector add, {space_size(space)} points; "
          f"CPU ms per trial (ask + tell) by window of trials\n")
    rows = []
    for sampler in args.samplers.split(","):
        for flight in (int(n) for n in args.in_flight.split(",")):
            rows.append((sampler, flight, cost_per_trial(sampler, args.trials, flight)))
    windows = sorted({w for _, _, costs in rows for w in costs})
    lines = ["| sampler | in flight | " + " | ".join(f"trials {a}-{b}" for a, b in windows) + " |",
             "|---|---|" + "---|" * len(windows)]
    for sampler, flight, costs in rows:
        lines.append(f"| {sampler} | {flight} | "
                     + " | ".join(f"{costs[w]:.2f}" if w in costs else "-" for w in windows) + " |")
    print("\n".join(lines))
    if not args.no_results_file:
        from results_file import write_section

        write_section(args.results_file, f"{args.samplers}, {args.trials} trials",
                      f"CPU ms per trial (ask + tell), the full preset's space ({space_size(space)} points)\n\n"
                      + "\n".join(lines), heading="The sampler's cost per trial (bench/tpe_cost.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
