"""Replay fidelity: the replayed baseline's kernel time against the same kernel inside an application,
and what each replayed launch costs beyond the kernel itself.

    python bench/replay_fidelity.py [--sizes 65536,1048576,4194304,16777216] [--launches 200] [--recording DB.json ...]

For each recording (the committed real vector-add recording and synthetic
vector adds of several sizes by default, or the given ones) it measures, side
by side in one process on one GPU:

* in-app: the recorded ``app_kernel_time_ns`` when the recorder measured it;
  otherwise the same cubin launched by a stand-in application (CuPy, its own
  buffers with the recorded contents, launches queued behind other work on its
  stream, back to back on the same buffers as an application's loop runs them),
  timed with CUDA events and with CUPTI kernel records;
* replay: ``Replayer.run`` of the baseline in several modes (the default:
  ``reset='auto'``, event timing, queue-ahead; then every launch reset, CUPTI
  timing, an L2 scrub after the resets, no queue-ahead, verification after
  every launch), median of the timed launches;
* the difference in percent against the in-app time taken with the same timer
  (target: within 3 %);
* overhead per launch: GPU time of the whole replay loop (resets, event
  records, launches, comparisons) minus the kernels' time, divided by the
  launches (target: <= 10 us), and the host's wall time the same way.

``--neighbours 1`` measures what a second worker on the same GPU does to the
timing (``mneme serve --workers 2``: two processes, two CUDA contexts that the
GPU time-slices): the default mode is measured alone, then while another
process replays the same recording's baseline without pause on the same GPU
(its own context, as a second worker), and the table gives both times and
their difference (target: within 3 %). ``--modes default`` measures only the
default mode.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # an installed mneme (with its native parts) wins over the checkout


def in_app_time_ns(recording, instance, launches: int) -> dict[str, float]:
    """Median kernel time of the recorded cubin in a stand-in application (CuPy), by events and by CUPTI."""
    if instance.record.app_kernel_time_ns:
        t = float(instance.record.app_kernel_time_ns)
        return {"events": t, "cupti": t}
    import cupy as cp

    from mneme.replay.engine import open_context

    ctx = open_context(0)  # the same primary context CuPy uses

    prologue = instance.load_prologue()
    buffers = {}
    for region in prologue.regions:
        if region.kind == "heap":
            host = region.read(recording.store)
            buf = cp.empty(region.size, dtype=cp.uint8)
            buf.set(__import__("numpy").frombuffer(host, dtype="uint8"))
            buffers[region.base] = buf
    # Rewrite the pointer arguments to the stand-in's buffers; scalars stay.
    args = bytearray(instance.arguments)
    for off in instance.pointer_args:
        ptr = int.from_bytes(args[off : off + 8], "little")
        for base, buf in buffers.items():
            if base <= ptr < base + buf.size:
                args[off : off + 8] = (buf.data.ptr + ptr - base).to_bytes(8, "little")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(recording.load_code("cubin"))
        f.flush()
        module = cp.RawModule(path=f.name)
        kernel = module.get_function(recording.kernel_name)  # loads the file now
    params = [p for p in recording.kernel.params]
    values = []
    for p in params:
        raw = bytes(args[p.offset : p.offset + p.size])
        values.append(__import__("numpy").frombuffer(raw, dtype={8: "uint64", 4: "uint32", 2: "uint16", 1: "uint8"}[p.size])[0])
    grid, block = instance.grid_dim.as_tuple(), instance.block_dim.as_tuple()
    # A busy application stream: launches queue up behind other work and run back to back.
    spin = cp.RawKernel(SPIN_SOURCE, "spin")
    stream = cp.cuda.Stream(non_blocking=True)

    def app_loop(with_events: bool) -> list:
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(launches)]
        with stream:
            spin((1,), (1,), (cp.uint64(launches * 30_000),))
            for start, stop in events:
                if with_events:
                    start.record()
                kernel(grid, block, tuple(values), shared_mem=instance.shared_mem)
                if with_events:
                    stop.record()
            stream.synchronize()
        return events

    # Two passes, so that neither timer disturbs the other.
    events = app_loop(True)
    times = [cp.cuda.get_elapsed_time(a, b) * 1e6 for a, b in events]
    ctx.cupti_begin()
    app_loop(False)
    cupti = ctx.cupti_kernel_times(stream.ptr, recording.kernel_name)
    return {"events": statistics.median(times[5:]), "cupti": statistics.median(cupti[5:])}


SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def replay_times(recording, instance, launches: int, **options) -> dict:
    """Median replayed kernel time and the per-launch overheads of one replay mode (Replayer options)."""
    from mneme.replay import Replayer

    with Replayer(recording, instance.record_id, **options) as replayer:
        replayer.run(replayer.baseline(), iterations=5, warmup=2)  # load, first touch
        result = replayer.run(replayer.baseline(), iterations=launches - 5, warmup=5)
        if not result.verified:
            raise SystemExit(f"baseline did not verify: {result.error}")
        t = replayer.last_timing
    kernels = sum(t["times_ns"])
    return {
        "kernel_ns": statistics.median(result.measured_times),
        # GPU time per launch beyond the kernel: resets, event records, comparisons, gaps.
        "gpu_overhead_ns": (t["gpu_span_ns"] - kernels) / t["launches"],
        # Host wall time per launch beyond the kernel (queue-ahead spin excluded).
        "wall_overhead_ns": (t["wall_ns"] - t["queue_ahead_ns"] - kernels) / t["launches"],
        "reset_each_launch": t["reset_each_launch"],
    }


#: Replay modes measured, (label, Replayer options). The first is the default.
MODES = (
    ("default (reset auto, events, queue-ahead)", {}),
    ("reset every launch", {"reset": "always"}),
    ("CUPTI timing", {"timing": "cupti"}),
    ("CUPTI timing, reset every launch", {"timing": "cupti", "reset": "always"}),
    ("reset every launch, L2 scrub", {"reset": "always", "l2_scrub": True}),
    ("no queue-ahead", {"queue_ahead": False}),
    ("verify every launch", {"verify_every_iteration": True}),
)
FIDELITY_TARGET_PCT = 3.0
OVERHEAD_TARGET_NS = 10_000
COMMITTED = Path(__file__).resolve().parents[1] / "tests" / "data" / "recordings" / "vecadd"


def neighbour_main(path: str, stop_file: str) -> int:
    """A second worker on the GPU: replay the recording's baseline without pause until ``stop_file`` exists."""
    from mneme.recording.execution import RecordedExecution
    from mneme.replay import Replayer

    recording = RecordedExecution.from_json(path)
    instance = recording.single_instance()
    with Replayer(recording, instance.record_id) as replayer:
        baseline = replayer.baseline()
        print("ready", flush=True)
        while not Path(stop_file).exists():
            replayer.run(baseline, iterations=5, warmup=2)
    return 0


def with_neighbours(path: Path, count: int, measure) -> tuple:
    """``measure()`` while ``count`` other processes replay ``path``'s baseline on the same GPU."""
    import subprocess

    stop = Path(tempfile.mkdtemp(prefix="mneme-neighbours-")) / "stop"
    procs = [subprocess.Popen([sys.executable, __file__, "--neighbour", str(path), str(stop)], stdout=subprocess.PIPE,
                              text=True) for _ in range(count)]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a neighbour process did not start")
        return measure()
    finally:
        stop.touch()
        for proc in procs:
            proc.wait(timeout=60)


def neighbours_table(paths: list[Path], launches: int, count: int) -> None:
    """The default mode's replayed kernel time alone and beside ``count`` other contexts on the GPU."""
    from mneme.recording.execution import RecordedExecution

    print(f"\nreplayed kernel time alone and with {count} other process(es) replaying on the same GPU "
          f"(a server's --workers {count + 1})")
    header = ("instance", "alone us", f"with {count} neighbour(s) us", "diff %", f"within {FIDELITY_TARGET_PCT:g} %")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for path in paths:
        recording = RecordedExecution.from_json(str(path))
        instance = recording.single_instance()
        alone = replay_times(recording, instance, launches)["kernel_ns"]
        beside = with_neighbours(path, count, lambda: replay_times(recording, instance, launches))["kernel_ns"]
        diff = 100 * (beside - alone) / alone
        label = f"{recording.kernel_name} grid={instance.grid_dim.x} block={instance.block_dim.x}"
        print(f"{label} | {alone / 1e3:.2f} | {beside / 1e3:.2f} | {diff:+.2f} | "
              f"{'yes' if abs(diff) <= FIDELITY_TARGET_PCT else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="65536,1048576,4194304,16777216", help="vector-add sizes (elements)")
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--recording", action="append", default=[], help="recording databases to measure instead")
    parser.add_argument("--neighbours", type=int, default=0,
                        help="also measure the default mode beside this many processes replaying on the same GPU")
    parser.add_argument("--modes", choices=("all", "default"), default="all", help="replay modes to measure")
    parser.add_argument("--neighbour", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.neighbour:
        return neighbour_main(*args.neighbour)

    from mneme.recording.execution import RecordedExecution

    paths = [Path(p) for p in args.recording]
    tmp = tempfile.TemporaryDirectory(prefix="mneme-bench-")
    if not paths:
        import mneme.testing.synthetic_recordings as synth

        paths += sorted(COMMITTED.glob("*.json"))
        for n in (int(s) for s in args.sizes.split(",")):
            paths.append(synth.vecadd(Path(tmp.name) / f"vecadd-{n}", n=n))
    rows = []
    for path in paths:
        recording = RecordedExecution.from_json(str(path))
        instance = recording.single_instance()
        app = in_app_time_ns(recording, instance, args.launches)
        label = f"{recording.kernel_name} grid={instance.grid_dim.x} block={instance.block_dim.x}"
        for mode, kwargs in (MODES if args.modes == "all" else MODES[:1]):
            m = replay_times(recording, instance, args.launches, **kwargs)
            timer = kwargs.get("timing", "events")  # compare like with like: the same timer in the app
            app_ns = app[timer]
            diff = 100 * (m["kernel_ns"] - app_ns) / app_ns
            rows.append((label, mode, timer, app_ns, m["kernel_ns"], diff, m["gpu_overhead_ns"], m["wall_overhead_ns"],
                         m["reset_each_launch"]))  # fmt: skip
    header = ("instance", "replay mode", "timer (both sides)", "resets/launch", "in-app us", "replay us", "diff %",
              f"within {FIDELITY_TARGET_PCT:g} %", "GPU ovh/launch us", f"<= {OVERHEAD_TARGET_NS / 1e3:g} us",
              "wall ovh/launch us")  # fmt: skip
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for label, mode, how, app, rep, diff, gpu_ovh, wall_ovh, resets in rows:
        fidelity_ok = "yes" if abs(diff) <= FIDELITY_TARGET_PCT else "NO"
        overhead_ok = "yes" if gpu_ovh <= OVERHEAD_TARGET_NS else "NO"
        print(f"{label} | {mode} | {how} | {'yes' if resets else 'no'} | {app / 1e3:.2f} | {rep / 1e3:.2f} | "
              f"{diff:+.2f} | {fidelity_ok} | {gpu_ovh / 1e3:.2f} | {overhead_ok} | {wall_ovh / 1e3:.2f}")  # fmt: skip
    if args.neighbours:
        neighbours_table(paths, args.launches, args.neighbours)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    raise SystemExit(record_output("replay_fidelity", main))
