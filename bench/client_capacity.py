"""Client capacity: results per second one tuning process takes from 1, 2, 4, 8 and 16 replay servers.

The servers run the test engine (``replay_server/testing/fake_engine.py``: a replay costs ``--replay-us`` of
sleep, no GPU), on loopback, so the servers answer as fast as a client asks and the client is what
is measured. Two levels, each over the same servers:

* ``executor``: ``AsyncReplayExecutor`` alone (submit, gRPC stream, result, ``results.jsonl``), kept
  full (as many configurations outstanding as the servers hold);
* ``tuner``: the whole ``mneme tune`` loop in this process (exhaustive sampling of a launch-shape
  space, scoring, ``trials.jsonl``, the executor as above).

Rates are taken over the steady part (after ``--settle`` seconds); "client CPU" is this process's CPU
time over that wall time (100% = one core), and "us/result" the client CPU per result (at the tuner
level over the same steady part, sampled every 20 ms: the run's start-up, baseline and summary left
out). The client runs this checkout's code, as the servers do.

``--hold-responses SECONDS`` sets how long the servers may hold a ready result to send it with others
(``ReplayBatch.hold_responses_seconds``; default ``ConnectionSettings``' ``HOLD_RESPONSES_SECONDS``); 0 sends
each as soon as it is ready, as servers did before the field existed.

``--echo-servers``: instead of ``mneme serve`` processes, one process of minimal servers (grpc.aio, one
port each) that answer every request at once with a canned verified result, at a few microseconds
of CPU each: the client is then the limit even where the machine has few cores (on 2 cores the real
servers take most of the CPU and set the rate, so only the client's CPU per result says anything).

``--mode loop``: the tuner loop alone, against an executor that answers at once in this process (no
servers, no gRPC): what the loop itself costs per trial, without servers competing for the cores.

``--mode shared-study``: tuner processes (``--tuners``, default 1 then 2) share one Optuna study and
the same servers; their trial rate together against one process's, where the servers are not
saturated, and whether any configuration was evaluated twice. ``--storage`` says where the study is:
``study-server`` (default: ``mneme study-server`` over a journal file of its own, tuners on
``grpc://127.0.0.1:PORT``), ``study-server:URL`` (the study server over that storage: ``sqlite:///...``,
``postgresql://...``), ``journal`` (a journal file the tuners share), or any ``--optuna-storage`` URL. Every tuner
keeps the same number of configurations in flight in every row (``--tuner-in-flight``, default ``same``: half the
servers' capacity split among the most tuners compared), so that the rows compare tuners run alike; the table
adds how busy the machine's CPUs were, and each process's first and last trial. ``--own-studies`` puts each tuner on a study
of its own on the same storage: what that many tuner processes make on the machine with nothing shared, the ceiling
of the ratios. The tables go to ``--results-file`` too (default
``bench/results/client_capacity.md``, appended with the host, GPU, date, commit and command).

    python bench/client_capacity.py                         # the curve, executor and tuner levels
    python bench/client_capacity.py --servers 16 --seconds 5
    python bench/client_capacity.py --mode shared-study --servers 8 --tuners 1,2,4 --echo-servers
    python bench/client_capacity.py --servers 1,4 --hold-responses 0   # what holding results saves
    python bench/client_capacity.py --mode loop                        # the tuning loop's own CPU per trial

Targets: >= 10,000 results/s from 16 servers in one process; >= 1.8x one process's trial rate with
two processes sharing a study, >= 3.2x with four.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
# The checkout first: the client runs the code of the servers it starts (PYTHONPATH=REPO), not an older
# installed mneme (the test engine and the client are pure Python: no native parts needed).
sys.path.insert(0, str(REPO))

from results_file import result_path, write_section  # noqa: E402

import replay_server.client.connection  # noqa: E402
from mneme.model.experiment import ExperimentConfiguration  # noqa: E402
from mneme.testing.synthetic import write_vecadd_recording  # noqa: E402
from replay_server.client.executor import AsyncReplayExecutor, server_capacity  # noqa: E402

TARGET_RESULTS = 10_000
TARGET_SHARED = {2: 1.8, 4: 3.2}  # tuner processes: their rate together / one process's
RESULTS_FILE = result_path("client_capacity")
#: Grid sizes of the shared-study space (1024 x 65,536 shapes). In the curve's space (65,536 shapes) random
#: draws meet more often the more of it is drawn: four tuners of 5,000 trials each drew it a third full, and a
#: draw that meets a known shape costs a trial's work without a result, so the rate of four tuners fell for
#: a reason that has nothing to do with sharing.
SHARED_GRIDS = 65536
SPACE = '''
from mneme.model.experiment import ExperimentConfiguration
from tuner.space.search_space import IntRangeParam, SearchSpace


class LaunchGrid(SearchSpace):
    """Launch shapes only (no code variants, so no compiles): 1024 block sizes x GRIDS grid sizes."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.dims = {"block_dim_x": IntRangeParam("block_dim_x", 1, 1024),
                     "grid_dim_x": IntRangeParam("grid_dim_x", 1, GRIDS)}

    def dimensions(self):
        return self.dims

    def derived(self, params):
        return ExperimentConfiguration.from_dict({"grid": {"x": params["grid_dim_x"]},
                                                  "block": {"x": params["block_dim_x"]}})

    def baseline(self):
        return ExperimentConfiguration.from_dict({"grid": {"x": self.kernel.grid_dim.x},
                                                  "block": {"x": self.kernel.block_dim.x}})
'''


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuSampler:
    """This process's CPU time every ``period`` seconds (wall-clock stamped), so that the CPU of a window
    known only afterwards (the tuner's steady part, from its trials' timestamps) can be read off."""

    def __init__(self, period: float = 0.02) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), cpu_seconds()))
            self._stop.wait(period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), cpu_seconds()))

    def between(self, start: float, end: float) -> tuple[float, float, float]:
        """(from, to, CPU seconds): the window ``start``..``end`` widened to the samples around it (from the
        last sample at or before ``start`` to the first at or after ``end``), and the CPU time in it."""
        before = max((s for s in self.samples if s[0] <= start), default=self.samples[0])
        after = min((s for s in self.samples if s[0] >= end), default=self.samples[-1])
        return before[0], after[0], after[1] - before[1]


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()


class EchoServers:
    """``count`` minimal replay servers in ``processes`` child processes (``--echo-process``; default one each,
    as real servers run): see ``echo_serve``."""

    def __init__(self, count: int, processes: int | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        processes = max(1, min(count, processes or count))
        shares = [count // processes + (i < count % processes) for i in range(processes)]
        self.processes = [subprocess.Popen([sys.executable, __file__, "--echo-process", str(share)],
                                           stdout=subprocess.PIPE, text=True, env=env) for share in shares]
        self.addresses: list[str] = []
        for process in self.processes:
            line = process.stdout.readline()
            if not line.startswith("listening"):
                self.stop()
                raise SystemExit(f"the echo servers did not start: {line!r}")
            self.addresses += line.split()[1:]
        # (server i of a row is in process i mod processes: a row of n servers spreads over the processes)
        self.addresses = [self.addresses[sum(shares[:p]) + k] for k in range(max(shares)) for p in range(processes)
                          if k < shares[p]]

    def cpu_seconds(self) -> list[float]:
        """Each echo process's CPU time so far."""
        return [_process_cpu(process.pid) for process in self.processes]

    def stop(self) -> None:
        for process in self.processes:
            stop_process(process)


def echo_serve(count: int) -> int:
    """Serve ``count`` loopback ports with a replay service that answers every request at once with one
    verified result (1 us): Prepare, GetServerInfo (2 workers), Replay and ReplayBatchStream."""
    import asyncio

    import grpc

    from replay_server.protocol import replay_pb2, replay_pb2_grpc

    result = replay_pb2.Result(exec_time=[1000], verified=True, executed=True, status="verified")

    class Echo(replay_pb2_grpc.ReplayServiceServicer):
        async def GetServerInfo(self, request, context):
            return replay_pb2.ServerInfo(workers=2, workers_ready=2)

        async def Prepare(self, request, context):
            return replay_pb2.PrepareResponse(workers_prepared=2, compile_errors=[""] * len(request.compile))

        async def Replay(self, request, context):
            return replay_pb2.ReplayResponse(request_id=request.request_id, result=result, worker="echo/w0")

        async def ReplayBatchStream(self, batches, context):
            async for batch in batches:
                yield replay_pb2.ReplayResponseBatch(responses=[
                    replay_pb2.ReplayResponse(request_id=r.request_id, result=result, worker="echo/w0")
                    for r in batch.requests])

    async def serve() -> None:
        server = grpc.aio.server()
        replay_pb2_grpc.add_ReplayServiceServicer_to_server(Echo(), server)
        ports = [server.add_insecure_port("127.0.0.1:0") for _ in range(count)]
        await server.start()
        print("listening", *(f"127.0.0.1:{port}" for port in ports), flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())
    return 0


class Servers:
    """``count`` ``mneme serve`` processes with the test engine on loopback."""

    def __init__(self, count: int, store: Path, workers: int, replay_us: float, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "MNEME_FAKE_ENGINE": json.dumps({"log_dir": str(log_dir), "replay_seconds": replay_us / 1e6,
                                                "with_compiler": False})}
        self.processes = [subprocess.Popen(
            [sys.executable, "-m", "replay_server", "--gpu", "0", "--port", "0", "--host", "127.0.0.1",
             "--store", str(store), "--workers", str(workers), "--log-level", "WARNING", "--compile-processes", "-1",
             "--engine", "replay_server.testing.fake_engine:spec_from_env"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env) for _ in range(count)]
        self.addresses = []
        for process in self.processes:
            line = process.stdout.readline()
            if "listening on" not in line:
                self.stop()
                raise SystemExit(f"a test-engine server did not start: {line!r}")
            self.addresses.append(line.split("listening on ", 1)[1].split()[0])

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()


def executor_rate(db: str, rid: str, servers: list[str], workers: int, seconds: float, settle: float,
                  results_dir: Path) -> dict:
    """Keep the executor full for ``settle + seconds``; the rate over the last ``seconds``."""
    window = server_capacity(workers) * len(servers)
    free = threading.Semaphore(window)
    done = [0]

    def finished(_future) -> None:
        done[0] += 1
        free.release()

    configs = [ExperimentConfiguration.from_dict({"grid": {"x": 1 + i % 64}, "block": {"x": 1 + i % 1024}})
               for i in range(4096)]
    with AsyncReplayExecutor(db, rid, iterations=1, warmup=0, servers=servers,
                             results_db_dir=str(results_dir)) as executor:
        executor.wait_prepared(timeout=120)
        start = time.monotonic()
        mark = None
        i = 0
        while True:
            now = time.monotonic()
            if mark is None and now - start >= settle:
                mark = (now, done[0], cpu_seconds())
            if now - start >= settle + seconds:
                break
            free.acquire()
            executor.submit(configs[i % len(configs)]).add_done_callback(finished)
            i += 1
        end = (time.monotonic(), done[0], cpu_seconds())
    wall = end[0] - mark[0]
    results = end[1] - mark[1]
    return {"results": results, "rate": results / wall, "cpu": (end[2] - mark[2]) / wall,
            "us_per_result": 1e6 * (end[2] - mark[2]) / max(results, 1)}


def trial_times(directory: Path) -> list[float]:
    return [datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
            for line in (directory / "trials.jsonl").read_text().splitlines()]


def tuner_rate(db: str, rid: str, servers: list[str], workers: int, seconds: float, settle: float,
               work: Path) -> dict:
    """The ``mneme tune`` loop in this process for ``settle + seconds``; trials/s over the last part."""
    from tuner.options import resolve_options
    from tuner.run import run_tune

    space = work / "launch_grid.py"
    space.write_text(SPACE.replace("GRIDS", "64"))
    results = work / f"tune-{len(servers)}"
    options = resolve_options({
        "record_database": db, "record_id": rid, "servers": servers, "space_module": f"{space}:LaunchGrid",
        "results_dir": str(results), "timeout": settle + seconds, "quiet": True, "iterations": 1, "warmup": 0,
        "workers": max(1, server_capacity(workers) * len(servers) // 2),  # in flight: 2 x workers
        "tolerance": "exact", "proteus_output": False,
    })
    sampler = CpuSampler()
    try:
        run_tune(options, out=io.StringIO(), is_tty=False)
    finally:
        sampler.stop()
    return steady_rate(trial_times(results), sampler, settle)


def steady_rate(times: list[float], sampler: CpuSampler, settle: float) -> dict:
    """Trials/s from the trials' timestamps after ``settle`` seconds, and the CPU per trial over that part
    only (not the run's start-up, baseline and summary)."""
    steady = [t for t in times if t >= times[0] + settle]
    wall = (steady[-1] - steady[0]) if len(steady) > 1 else float("nan")
    first, last, cpu = sampler.between(steady[0], steady[-1])
    in_window = sum(1 for t in times if first <= t <= last)
    return {"results": len(steady), "rate": (len(steady) - 1) / wall, "cpu": cpu / (last - first),
            "us_per_result": 1e6 * cpu / max(in_window, 1)}


class InstantExecutor:
    """Answers every configuration at once, in the caller's thread, with one verified result: what is
    left to measure is the tuning loop's own cost per trial (``--mode loop``). Its futures carry the
    result's dict and JSON text as ``AsyncReplayExecutor``'s do (in a checkout that has them)."""

    def __init__(self) -> None:
        from mneme.model.experiment import ExperimentResult

        self.result = ExperimentResult(exec_time=[1000], verified=True, executed=True, status="verified",
                                       warmup=0, gpu_id=0)
        self.record = self.result.to_dict()
        self.text = json.dumps(self.record)
        try:
            from replay_server.client.executor import ReplayFuture as future_class
        except ImportError:  # a checkout before ReplayFuture
            from concurrent.futures import Future as future_class
        self.future_class = future_class

    def submit(self, config):
        future = self.future_class()
        future.set_running_or_notify_cancel()
        future.result_dict, future.result_json = self.record, self.text
        future.set_result(self.result)
        return future

    def evaluate(self, config):
        return self.result

    def shutdown(self) -> None:
        pass


def loop_rate(db: str, rid: str, seconds: float, settle: float, work: Path) -> dict:
    """The ``mneme tune`` loop against ``InstantExecutor`` for ``settle + seconds``: its CPU per trial."""
    from tuner.options import resolve_options
    from tuner.run import run_tune

    space = work / "launch_grid.py"
    space.write_text(SPACE.replace("GRIDS", "64"))
    results = work / "tune-loop"
    options = resolve_options({
        "record_database": db, "record_id": rid, "servers": ["127.0.0.1:1"], "space_module": f"{space}:LaunchGrid",
        "results_dir": str(results), "timeout": settle + seconds, "quiet": True, "iterations": 1, "warmup": 0,
        "workers": 24, "tolerance": "exact", "proteus_output": False,
    })
    executor = InstantExecutor()
    sampler = CpuSampler()
    try:
        run_tune(options, out=io.StringIO(), is_tty=False, executor_factory=lambda *_, **__: executor)
    finally:
        sampler.stop()
    return steady_rate(trial_times(results), sampler, settle)


def print_curve(rows: list[tuple[str, int, dict]]) -> str:
    """Print the curve's table and verdicts; return them (markdown)."""
    lines = ["| level | servers | results/s | results timed | client CPU | client CPU per result |", "|---|---|---|---|---|---|"]
    for level, n, r in rows:
        lines.append(f"| {level} | {n} | {r['rate']:.0f} | {r['results']} | {100 * r['cpu']:.0f}% | {r['us_per_result']:.0f} us |")
    lines.append("")
    best = {level: r["rate"] for level, n, r in rows if n == max(m for _, m, _ in rows)}
    for level, rate in best.items():
        verdict = "met" if rate >= TARGET_RESULTS else "not met"
        lines.append(f"target >= {TARGET_RESULTS}/s at {max(m for _, m, _ in rows)} servers, {level}: {rate:.0f}/s ({verdict})")
    print("\n".join(lines))
    return "\n".join(lines)


# -- shared studies ----------------------------------------------------------------------------------
def tuner_process(settings: dict) -> int:
    """One tuner of ``--mode shared-study`` (run as a child process)."""
    from tuner.options import resolve_options
    from tuner.run import run_tune

    return run_tune(resolve_options(settings), out=io.StringIO(), is_tty=False)


class StudyServer:
    """``mneme study-server URL --port 0`` (this checkout's code) for one shared-study measurement."""

    def __init__(self, url: str, fronts: int | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen([sys.executable, "-m", "mneme", "study-server", url, "--port", "0",
                                         *(["--fronts", str(fronts)] if fronts is not None else [])],
                                        stdout=subprocess.PIPE, text=True, env=env)
        line = self.process.stdout.readline()
        if "grpc://" not in line:
            self.stop()
            raise SystemExit(f"the study server did not start: {line!r}")
        self.url = line.rsplit("--optuna-storage ", 1)[1].rstrip(")\n ")

    def cpu_seconds(self) -> float:
        """The server process's CPU time so far (user + system, from ``/proc``): with front processes, the core's."""
        return _process_cpu(self.process.pid)

    def children_cpu_seconds(self) -> float:
        """The CPU time so far of the server's child processes (its fronts)."""
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.process.pid:
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> None:
        stop_process(self.process)


def _process_cpu(pid: int) -> float:
    """A process's CPU time so far (user + system, from ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def study_storage(storage: str, work: Path, count: int, fronts: int | None = None) -> tuple[str, StudyServer | None]:
    """(the tuners' --optuna-storage, the study server started for it or None) of ``--storage``."""
    if storage == "journal":
        return f"journal:{work / f'study-{count}.log'}", None
    if storage == "study-server" or storage.startswith("study-server:"):
        url = storage.partition(":")[2] or f"journal:{work / f'study-{count}.log'}"
        server = StudyServer(url, fronts)
        return server.url, server
    return storage, None


def tuner_in_flight(option: str, workers: int, servers: int, tuners: list[int]) -> Callable[[int], int]:
    """Each tuner's configurations in flight, by the row's tuner count, of ``--tuner-in-flight``: a number, ``same``
    (half the servers' capacity split among the most tuners compared, in every row: each tuner runs the same
    settings) or ``split`` (half the capacity split among the row's tuners)."""
    half = server_capacity(workers) * servers // 2
    if option == "same":
        return lambda count: max(1, half // max(tuners))
    if option == "split":
        return lambda count: max(1, half // count)
    if not option.isdigit() or int(option) < 1:
        raise SystemExit(f"--tuner-in-flight {option!r}: give a positive number, same or split")
    return lambda count: int(option)


class HostCpu:
    """The machine's CPU time, busy and all, from ``/proc/stat`` (None where there is none)."""

    @staticmethod
    def read() -> tuple[float, float] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]) - idle, sum(fields[:8])

    @staticmethod
    def busy(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
        """The share of the machine's CPUs busy between two reads."""
        if before is None or after is None or after[1] <= before[1]:
            return None
        return (after[0] - before[0]) / (after[1] - before[1])


def shared_study(db: str, rid: str, servers: list[str], workers: int, trials: int, tuners: list[int],
                 storage: str, work: Path, fronts: int | None = None,
                 servers_cpu: Callable[[], list[float]] | None = None,
                 in_flight: Callable[[int], int] | None = None, own_studies: bool = False) -> list[dict]:
    work.mkdir(parents=True, exist_ok=True)
    in_flight = in_flight or tuner_in_flight("same", workers, len(servers), tuners)
    space = work / "wide_launch_grid.py"
    space.write_text(SPACE.replace("GRIDS", str(SHARED_GRIDS)))  # (draws seldom meet: see SHARED_GRIDS)
    rows = []
    for count in tuners:
        study, study_server = study_storage(storage, work, count, fronts)
        dirs = [work / f"shared-{count}-{i}" for i in range(count)]
        per = in_flight(count)
        procs = []
        tuner_cpu = 0.0
        server_cpu = None
        started_cpu = study_server.cpu_seconds() if study_server is not None else 0.0  # its start-up, left out
        started_fronts = study_server.children_cpu_seconds() if study_server is not None else 0.0
        fronts_cpu = 0.0
        echo_before, began = (servers_cpu() if servers_cpu else None), time.monotonic()
        host_before = HostCpu.read()
        try:
            for d in dirs:
                settings = {"record_database": db, "record_id": rid, "servers": servers,
                            "space_module": f"{space}:LaunchGrid", "results_dir": str(d), "quiet": True,
                            "iterations": 1, "warmup": 0, "workers": per, "sampler": "random", "trials": trials,
                            "seed": len(procs), "optuna_storage": study,
                            "study_name": f"capacity-{count}" + (f"-{len(procs)}" if own_studies else ""),
                            "tolerance": "exact", "proteus_output": False}
                procs.append(subprocess.Popen([sys.executable, __file__, "--tuner-process", json.dumps(settings)]))
            for p in procs:
                _, status, usage = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                tuner_cpu += usage.ru_utime + usage.ru_stime
            echo = None
            if echo_before is not None:  # the replay servers' CPU: (a trial's, their busiest process's share)
                spent = [after - before for before, after in zip(echo_before, servers_cpu())]
                echo = (sum(spent), max(spent) / max(time.monotonic() - began, 1e-9))
            host = HostCpu.busy(host_before, HostCpu.read())
            if study_server is not None:
                server_cpu = study_server.cpu_seconds() - started_cpu
                fronts_cpu = study_server.children_cpu_seconds() - started_fronts
        finally:
            if study_server is not None:
                study_server.stop()
        times = sorted(t for d in dirs for t in trial_times(d))
        # Steady part: from the moment every process has started trials to the first that finished.
        first = max(trial_times(d)[0] for d in dirs)
        last = min(trial_times(d)[-1] for d in dirs)
        steady = [t for t in times if first <= t <= last]
        hashes = [json.loads(line)["hash"] for d in dirs for line in (d / "trials.jsonl").read_text().splitlines()]
        began_at = min(trial_times(d)[0] for d in dirs)
        spans = [(trial_times(d)[0] - began_at, trial_times(d)[-1] - began_at) for d in dirs]
        rows.append({"tuners": count, "trials": len(times), "rate": (len(steady) - 1) / max(last - first, 1e-9),
                     "spans": spans, "steady_s": last - first,
                     "per_process": [len(trial_times(d)) for d in dirs],
                     "twice": None if own_studies else len(hashes) - len(set(hashes)),
                     # CPU per trial over the whole run (start-up included): the server's sets its ceiling
                     "tuner_ms": 1e3 * tuner_cpu / max(len(times), 1),
                     "server_ms": None if server_cpu is None else 1e3 * (server_cpu + fronts_cpu) / max(len(times), 1),
                     "core_ms": None if server_cpu is None else 1e3 * server_cpu / max(len(times), 1),
                     "echo_ms": None if echo is None else 1e3 * echo[0] / max(len(times), 1),
                     "echo_busiest": None if echo is None else echo[1], "in_flight": per, "host_busy": host})
    return rows


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per tuner count, the row of the run with the median rate (the rates of all runs beside it)."""
    rows = []
    for position, row in enumerate(runs[0]):
        candidates = sorted((run[position] for run in runs), key=lambda r: r["rate"])
        rows.append({**candidates[(len(candidates) - 1) // 2], "rates": [r["rate"] for r in (run[position] for run in runs)]})
    return rows


def shared_study_report(rows: list[dict], storage: str, servers: int, echo: bool, trials: int) -> str:
    """The shared-study table and verdicts (markdown)."""
    kind = "echo servers" if echo else "test-engine servers"
    lines = [f"shared study ({storage}), {servers} {kind}, {trials} random-sampler trials per process:", "",
             "| tuner processes | trials/s together | x one process | trials (per process) | evaluated twice "
             "| in flight a tuner | tuner CPU per trial | study server CPU per trial | its core's | server ceiling "
             "| replay servers' CPU per trial | their busiest process | machine CPU busy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    one = next((r["rate"] for r in rows if r["tuners"] == 1), None)
    for r in rows:
        ratio = f"{r['rate'] / one:.2f}x" if one else "-"
        server = "-" if r.get("server_ms") is None else f"{r['server_ms']:.2f} ms"
        core = "-" if r.get("core_ms") is None else f"{r['core_ms']:.2f} ms"
        ceiling = "-" if not r.get("core_ms") else f"{1e3 / r['core_ms']:.0f} trials/s"
        rate = f"{r['rate']:.0f}" if len(r.get("rates", ())) < 2 else \
            f"{r['rate']:.0f} (runs: {', '.join(f'{x:.0f}' for x in r['rates'])})"
        lines.append(f"| {r['tuners']} | {rate} | {ratio} | {r['trials']} "
                     f"({', '.join(map(str, r['per_process']))}) | {'-' if r['twice'] is None else r['twice']} | {r.get('in_flight', '-')} "
                     f"| {r['tuner_ms']:.2f} ms | {server} | {core} | {ceiling} | {_ms(r.get('echo_ms'))} "
                     f"| {_share(r.get('echo_busiest'))} | {_share(r.get('host_busy'))} |")
    lines += ["", "CPU per trial: the user + system time over the trials of the run of the tuner processes (their "
              "start-up included) and of the study server (from its start-up line on: its core process and its "
              "front processes, if any; its core's alone beside it); server ceiling: the trials a second one core "
              "running the study server's core could take at that cost; the replay servers' CPU: the echo "
              "processes' over the run, and the busiest one's share of a core (under 100%: the servers were not "
              "the limit); in flight a tuner: the configurations each tuner keeps replaying (``--tuner-in-flight``); machine "
              "CPU busy: the share of all the machine's CPUs busy over the row's run (``/proc/stat``).", ""]
    for r in rows:
        if r.get("spans"):
            lines.append(f"{r['tuners']} processes: their trials from/to (s after the first) "
                         f"{', '.join(f'{a:.1f}-{b:.1f}' for a, b in r['spans'])}; the rate's steady part "
                         f"{r['steady_s']:.1f} s (all processes running)")
    lines.append("")
    for r in rows:
        target = TARGET_SHARED.get(r["tuners"])
        if one and target:
            ratio = r["rate"] / one
            lines.append(f"{r['tuners']} processes / 1: {ratio:.2f}x (target >= {target}x: "
                         f"{'met' if ratio >= target else 'not met'})")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def record(args: argparse.Namespace, title: str, body: str) -> None:
    """Append a table to ``--results-file`` with the host, GPU, date, commit and command (bench/results_file.py)."""
    if args.results_file:
        write_section(args.results_file, title, body, heading="bench/client_capacity.py results", append=True)
        print(f"appended to {args.results_file}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("curve", "shared-study", "all", "loop"), default="curve")
    p.add_argument("--servers", default="1,2,4,8,16", help="server counts of the curve (default 1,2,4,8,16)")
    p.add_argument("--levels", default="executor,tuner", help="executor, tuner or both (default both)")
    p.add_argument("--workers", type=int, default=2, help="worker processes per server (default 2)")
    p.add_argument("--replay-us", type=float, default=0.0, help="what one replay costs a server (sleep, us)")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per point (default 3)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds before timing starts (default 1)")
    p.add_argument("--hold-responses", type=float, default=None,
                   help="how long servers may hold a result to send it with others (ConnectionSettings' "
                        "HOLD_RESPONSES_SECONDS; 0: each at once, as before the hold existed)")
    p.add_argument("--trials", type=int, default=3000, help="--mode shared-study: trials per tuner process")
    p.add_argument("--tuners", default="1,2", help="--mode shared-study: tuner processes to compare (default 1,2)")
    p.add_argument("--repeat", type=int, default=1,
                   help="--mode shared-study: runs of the whole comparison, one after another; each row is the run "
                        "with the median rate (default 1)")
    p.add_argument("--tuner-in-flight", default="same",
                   help="--mode shared-study: each tuner's configurations in flight: a number, same (default: half "
                        "the servers' capacity split among the most tuners compared, the same in every row) or split "
                        "(half the capacity split among the row's tuners)")
    p.add_argument("--study-fronts", type=int, default=None,
                   help="--mode shared-study: the study server's --fronts (default: the server's)")
    p.add_argument("--storage", default="study-server",
                   help="--mode shared-study: study-server (default: mneme study-server over a journal file), "
                        "study-server:URL, journal, or an --optuna-storage URL")
    p.add_argument("--own-studies", action="store_true",
                   help="--mode shared-study: each tuner on a study of its own (same storage, nothing shared): what "
                        "that many tuner processes make on this machine without sharing trials")
    p.add_argument("--results-file", default=str(RESULTS_FILE or ""),
                   help="markdown file the tables are appended to (default bench/results/client_capacity.md; '' for none)")
    p.add_argument("--echo-servers", action="store_true",
                   help="minimal servers in one process that answer at once (the client alone is measured)")
    p.add_argument("--tuner-process", help=argparse.SUPPRESS)
    p.add_argument("--echo-process", type=int, help=argparse.SUPPRESS)
    p.add_argument("--echo-processes", type=int, default=None,
                   help="--echo-servers: processes they run in (default: one a server, as real servers run)")
    args = p.parse_args(argv)
    if args.tuner_process:
        return tuner_process(json.loads(args.tuner_process))
    if args.echo_process:
        return echo_serve(args.echo_process)
    counts = [int(n) for n in args.servers.split(",")]
    if args.hold_responses is not None:  # both levels (the tuner makes its executor with the default)
        replay_server.client.connection.HOLD_RESPONSES_SECONDS = args.hold_responses
    hold = replay_server.client.connection.HOLD_RESPONSES_SECONDS
    with tempfile.TemporaryDirectory(prefix="mneme-capacity-") as tmp:
        work = Path(tmp)
        recording = write_vecadd_recording(work / "store", n=40000 * 256 // 1000, block=256)
        db, rid = str(work / "store" / recording.database), recording.dynamic_hash
        if args.mode == "loop":
            r = loop_rate(db, rid, args.seconds, args.settle, work)
            print("the tuning loop alone (an executor that answers at once, in this process):")
            print("| level | trials/s | trials timed | CPU | CPU per trial |")
            print("|---|---|---|---|---|")
            print(f"| loop | {r['rate']:.0f} | {r['results']} | {100 * r['cpu']:.0f}% | {r['us_per_result']:.0f} us |")
            return 0
        if args.echo_servers:
            servers = EchoServers(max(counts), args.echo_processes)
            print(f"{max(counts)} echo servers in {len(servers.processes)} process(es) (answers at once, 2 workers "
                  f"each); client: one process, {os.cpu_count()} CPUs on the machine")
        else:
            servers = Servers(max(counts), work / "store", args.workers, args.replay_us, work / "log")
            print(f"{max(counts)} test-engine servers, {args.workers} workers each, replay {args.replay_us:g} us, "
                  f"responses held {1e3 * hold:g} ms at most; client: one process, {os.cpu_count()} CPUs on the "
                  "machine")
        try:
            if args.mode in ("curve", "all"):
                rows = []
                for n in counts:
                    for level in args.levels.split(","):
                        measure = executor_rate if level == "executor" else tuner_rate
                        target = work / f"{level}-{n}"
                        target.mkdir()
                        rows.append((level, n, measure(db, rid, servers.addresses[:n], args.workers, args.seconds,
                                                       args.settle, target)))
                        r = rows[-1][2]
                        print(f"  {level} x{n}: {r['rate']:.0f}/s", flush=True)
                curve = print_curve(rows)
                record(args, f"curve, {max(counts)} {'echo' if args.echo_servers else 'test-engine'} servers", curve)
            if args.mode in ("shared-study", "all"):
                n = max(counts)
                tuners = [int(t) for t in args.tuners.split(",")]
                in_flight = tuner_in_flight(args.tuner_in_flight, args.workers, n, tuners)
                runs = [shared_study(db, rid, servers.addresses[:n], args.workers, args.trials, tuners, args.storage,
                                     work / f"run-{i}", args.study_fronts, getattr(servers, "cpu_seconds", None),
                                     in_flight, args.own_studies)
                        for i in range(args.repeat)]
                rows = median_rows(runs)
                fronts = args.study_fronts
                if fronts is None and args.storage.startswith("study-server"):
                    from tuner.study_server import DEFAULT_FRONTS

                    fronts = DEFAULT_FRONTS if args.storage in ("study-server", "study-server:") or \
                        args.storage.startswith("study-server:journal:") else 0
                storage = args.storage + (f", {fronts} front processes" if fronts else "") + \
                    (", a study per tuner" if args.own_studies else "")
                report = shared_study_report(rows, storage, n, args.echo_servers, args.trials)
                print("\n" + report)
                record(args, f"shared study ({storage}), {n} {'echo' if args.echo_servers else 'test-engine'} servers",
                       report)
        finally:
            servers.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
