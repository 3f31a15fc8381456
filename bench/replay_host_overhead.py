"""Host time of ``Replayer.run``: the Python work around the engine's launch loop, without a GPU.

    python bench/replay_host_overhead.py [--runs 400] [--rounds 5] [--compare-tree DIR] [--json]

Runs the replayer against the fake native engine (mneme/testing/fake_native_engine.py with a
``FakeKernel``: modules load, an engine call returns at once with its statistics), so what is
timed is the replayer's own work per configuration: validation, the compile cache's answer
(the recorded cubin), the module cache, the launch checks, the comparisons it asks for, the
verdict and the result. The launches themselves run in the engine's loop and are not Python
work. Scenarios (the vector add, 4096 elements, 3 launches + 2 warm-ups):

* ``baseline``: the recorded launch, proven idempotent (no resets), verified bitwise;
* ``compiled``: the same with the code handed over (as a server's compile pool does);
* ``always``: ``reset="always"`` (the resets built for every run);
* ``auto bound``: ``tolerance auto``, a region verified within its derived bound (``verified_within``);
* ``mismatch``: another grid, failing verification (the mismatch report, 16 bytes read back).

``--compare-tree DIR`` times another source tree of mneme beside this one, round by round
interleaved (each round a child process per tree): a before/after of a change to the replayer.
Each cell is the thread CPU time per ``run`` call in microseconds, of the least disturbed batch
(``--runs`` calls) over every round (5 batches a round): on a shared host, CPU time and the
minimum are what a change moves, not the scheduler. ``calls/run`` counts the Python and C
function calls of one ``run`` (the fake engine's included): the same on any host.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
SCENARIOS = ("baseline", "compiled", "always", "auto bound", "mismatch")
BATCHES = 5


def measure(runs: int) -> dict[str, float]:
    """Microseconds per ``run`` call of each scenario, in this process (mneme from the tree on PYTHONPATH)."""
    os.environ["MNEME_CACHE_DIR"] = tempfile.mkdtemp(prefix="mneme-bench-")
    import mneme.testing.synthetic_recordings as synth
    from mneme.model.verification import VerificationSettings
    from mneme.recording.execution import RecordedExecution
    from mneme.replay import Replayer, placement
    from mneme.replay import engine as eng
    from mneme.replay.placement import ProcessReservations
    from mneme.testing.fake_native_engine import AddressSpace, FakeKernel, native_module

    work = Path(tempfile.mkdtemp(prefix="mneme-bench-"))
    out: dict[str, float] = {}
    c_check = 2  # the vector add's output region

    def timed(name, db, config_of, differs=None, **options):
        space = AddressSpace(kernel=FakeKernel(differs=differs))
        eng._engine = native_module(space)
        placement._process = ProcessReservations()
        rec = RecordedExecution.from_json(str(db))
        with Replayer(rec, rec.single_instance().record_id, **options) as replayer:
            config, extra = config_of(replayer)
            replayer.get_ready()
            for _ in range(20):  # warm: caches, the derived bound, the first module load
                replayer.run(config, iterations=3, warmup=2, **extra)
            best = float("inf")
            for _ in range(BATCHES):  # the least disturbed batch: the host is shared
                space.kernel.runs.clear()
                start = time.thread_time()
                for _ in range(runs):
                    result = replayer.run(config, iterations=3, warmup=2, **extra)
                best = min(best, (time.thread_time() - start) / runs * 1e6)
            out[name] = best
            out[f"{name} calls"] = calls_per_run(lambda: replayer.run(config, iterations=3, warmup=2, **extra))
            space.kernel.runs.clear()
        assert result.status in ("verified", "failed_verification"), result.error

    db = synth.vecadd(work / "vecadd", n=4096, block=256)
    baseline = lambda r: (r.baseline(), {})  # noqa: E731
    timed("baseline", db, baseline)
    timed("compiled", db, lambda r: (r.baseline(), {"compiled": r.compile(r.baseline())}))
    timed("always", db, baseline, reset="always")
    timed("auto bound", synth.vecadd(work / "auto", n=4096, block=256), baseline,
          differs=lambda run, launch, check: (launch % 3 + 1) if check == c_check else 0,
          verification=VerificationSettings(mode="auto"))  # fmt: skip
    timed("mismatch", db, lambda r: (r.baseline().replace(grid={"x": 8, "y": 1, "z": 1}), {}),
          differs=lambda run, launch, check: 12 if check == c_check and run.grid == (8, 1, 1) else 0)  # fmt: skip
    return out


def calls_per_run(run: Any, runs: int = 20) -> float:
    """Python and C function calls per ``run()``, the replayer's and the fake engine's (deterministic)."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        for _ in range(runs):
            run()
    finally:
        sys.setprofile(None)
    return calls / runs


def child(tree: Path, runs: int) -> dict[str, float]:
    """One round in a child process that imports mneme from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(HERE), "--child", "--runs", str(runs)], env=env,
                         capture_output=True, text=True, cwd=tree)  # fmt: skip
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="run calls per scenario and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare-tree", type=Path, help="another mneme source tree, timed beside this one")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.runs)))
        return
    trees = {"this tree": HERE.parents[1]}
    if args.compare_tree:
        trees = {"compared": args.compare_tree.resolve(), **trees}
    rounds: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            rounds[label].append(child(tree, args.runs))
    table = {label: {s: min(r[s] for r in per) for s in per[0]} for label, per in rounds.items()}
    if args.json:
        print(json.dumps(table, indent=1))
        return
    labels = list(trees)
    columns = [f"{label} us/run" for label in labels] + (["ratio"] if len(labels) == 2 else [])
    columns += [f"{label} calls/run" for label in labels]
    print("| scenario | " + " | ".join(columns) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    for s in SCENARIOS:
        cells = [f"{table[label][s]:.1f}" for label in labels]
        cells += [f"{table[labels[1]][s] / table[labels[0]][s]:.3f}"] if len(labels) == 2 else []
        cells += [f"{table[label][s + ' calls']:.0f}" for label in labels]
        print(f"| {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    main() if "--child" in sys.argv or "--json" in sys.argv else record_output("replay_host_overhead", main)
