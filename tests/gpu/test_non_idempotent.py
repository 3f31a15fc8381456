"""Kernels that are not idempotent, recorded unmodified: a replay never hangs on them or loses its context.

The replayer's idempotence proof (``--reset auto``, the default) launches the recorded baseline
twice with no reset between. Five programs of ours (tests/gpu/programs/idempotence/, README.md
there) consume their own state, so that a second launch without reset spins forever (a decoupled
look-back scan, a level-scheduled triangular solve, a worklist colouring), faults (a lock-based
hash insert whose node pool runs out: a device-side assert) or does nothing but advance a counter
(a persistent kernel draining a ticket queue). Each is recorded with ``mneme record``; then, per
program:

* ``mneme replay --reset always`` verifies (the precondition: the recording is right);
* ``mneme replay`` with the defaults verifies too, says in its result that the written memory was
  reset before every launch (``reset_each_launch``) and why (``reset_reason``), and costs at most
  ``EXTRA_S`` more than ``--reset always`` (the issue's target: a hang costs less than 2 s), both
  replays well within ``OVERALL_S``;
* ``mneme tune`` over launch shapes completes, the baseline and several trials verified, no trial
  timed out or faulted, and every verified trial reset before each of its launches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_record import PROGRAMS, _nvcc, mneme_record, recorder_lib  # noqa: F401 (fixture)

from mneme.format.database import DATABASE_NAME
from mneme.recording.execution import RecordedExecution
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu

#: program -> (its kernel, a substring of the mangled name; what a second launch without reset does)
NON_IDEMPOTENT = {
    "lookback_scan": ("lookback_scan", "spins: tile T waits on a status word its launch never publishes"),
    "ticket_queue": ("drain_queue", "does nothing: the ticket counter is exhausted, only the counter moves"),
    "trisolve_levels": ("trisolve", "spins on a wrapped dependency counter, or solves from stale values"),
    "hash_insert": ("hash_insert", "faults: the node pool's device-side assert (cudaErrorAssert)"),
    "jp_coloring": ("jp_color", "spins: every thread waits on a worklist slot nothing will fill"),
}

#: How much longer the default replay may take than `--reset always`: the issue's target (a hang costs
#: less than 2 s), plus a fresh context where the proof's hang or fault took the first one.
EXTRA_S = 5.0
#: Each replay of one instance, whatever its kernel does on a second launch, takes well under this.
OVERALL_S = 40.0
#: A replay still running after this is stopped (and the test fails with the timings): a hang.
REPLAY_LIMIT_S = 150
TUNE_LIMIT_S = 600


@dataclass(frozen=True)
class Recorded:
    db: str
    record_id: str
    seconds: float


@dataclass(frozen=True)
class Run:
    """One `mneme` process: exit status (None: stopped at the limit), output, wall time."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    def tail(self) -> str:
        return (f"exit {self.returncode} after {self.seconds:.1f} s\n"
                f"stdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}")

    def result(self) -> dict:
        """The "Result" of `mneme replay --json` (the JSON object is the last thing on stdout; a kernel's own
        device-side messages, such as a failed assert, may come before it)."""
        start = self.stdout.rfind('{\n  "Replay-config"')
        assert start >= 0, f"no replay JSON on stdout\n{self.tail()}"
        return json.JSONDecoder().raw_decode(self.stdout[start:])[0]["Result"]


def mneme(*argv: str, cwd: Path, limit_s: float) -> Run:
    """A fresh `mneme` process in its own process group, all of which is killed if it runs past ``limit_s``."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "mneme", *argv], cwd=cwd,
                            env=child_env(MNEME_CACHE_DIR=str(cwd / "cache")), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return Run(code, out, err, time.monotonic() - start)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("idempotence")
    subprocess.run(["make", "-s", "-j4", "-C", PROGRAMS, "idempotence", f"OUTDIR={out}", f"NVCC={_nvcc()}"],
                   check=True)
    return out


@pytest.fixture(scope="module")
def recorded(recorder_lib, built, tmp_path_factory):  # noqa: F811
    """program -> its recording (made once per module): the one instance of its kernel."""
    done: dict[str, Recorded] = {}

    def get(program: str) -> Recorded:
        if program not in done:
            kernel = NON_IDEMPOTENT[program][0]
            rdb = tmp_path_factory.mktemp(f"rdb-{program}")
            start = time.monotonic()
            proc = mneme_record(recorder_lib, rdb, [built / program])
            seconds = time.monotonic() - start
            assert f"{program}: ok" in proc.stdout, proc.stdout  # the program's own check, under the recorder
            recordings = [RecordedExecution.from_json(db) for db in sorted(rdb.glob("*.json"))
                          if DATABASE_NAME.fullmatch(db.name)]
            found = [rec for rec in recordings if kernel in rec.kernel_name]
            names = [r.kernel_name for r in recordings]
            assert len(found) == 1, f"{program}: expected one database of {kernel}: {names}"
            rec = found[0]
            assert len(rec.instances) == 1, f"{program}: {list(rec.instances)}"
            inst = next(iter(rec.instances.values()))
            assert inst.supported, (program, inst.unsupported)
            done[program] = Recorded(rec.path, inst.record_id, seconds)
        return done[program]

    return get


def replay(rec: Recorded, *flags: str, cwd: Path) -> Run:
    return mneme("replay", "-rdb", rec.db, "-rid", rec.record_id, "--json", *flags, cwd=cwd, limit_s=REPLAY_LIMIT_S)


@pytest.mark.parametrize("program", sorted(NON_IDEMPOTENT))
def test_replay_with_a_reset_before_every_launch_verifies(recorded, tmp_path, program):
    rec = recorded(program)
    always = replay(rec, "--reset", "always", cwd=tmp_path)
    assert always.returncode == 0, f"{program} (recorded in {rec.seconds:.1f} s): {always.tail()}"
    result = always.result()
    assert result["verified"] and result["status"] == "verified", (program, result)


@pytest.mark.parametrize("program", sorted(NON_IDEMPOTENT))
def test_default_replay_verifies_resets_every_launch_and_a_hang_costs_little(recorded, tmp_path, program):
    rec = recorded(program)
    always = replay(rec, "--reset", "always", cwd=tmp_path)
    default = replay(rec, cwd=tmp_path)
    timings = (f"{program} ({NON_IDEMPOTENT[program][1]}): recorded in {rec.seconds:.1f} s; "
               f"replay --reset always {always.seconds:.1f} s, default replay {default.seconds:.1f} s")
    assert always.returncode == 0 and always.result()["verified"], f"{timings}\n--reset always: {always.tail()}"
    assert default.returncode is not None, (
        f"{timings}: the default replay was stopped after {REPLAY_LIMIT_S} s (a hang)\n{default.tail()}")
    assert default.returncode == 0, f"{timings}\ndefault replay: {default.tail()}"
    result = default.result()
    assert result["verified"] and result["status"] == "verified", (timings, result)
    # The idempotence proof failed (the second launch spun, faulted or differed): every launch was reset, and the
    # result says so and why.
    said = {key: result.get(key) for key in ("reset_each_launch", "reset_reason")}
    assert result.get("reset_each_launch") is True, (timings, said)
    reason = result.get("reset_reason")
    assert isinstance(reason, str) and reason.strip(), (timings, reason)
    assert default.seconds < OVERALL_S and always.seconds < OVERALL_S, timings
    extra = default.seconds - always.seconds
    assert extra < EXTRA_S, f"{timings}: the default replay took {extra:.1f} s more (at most {EXTRA_S} s); {reason}"


@pytest.mark.parametrize("program", sorted(NON_IDEMPOTENT))
def test_tune_completes_with_verified_trials(recorded, tmp_path, program):
    rec = recorded(program)
    run = tmp_path / "run"
    tune = mneme("tune", "-rdb", rec.db, "-rid", rec.record_id, "--space-preset", "launch", "--launch-dim", "x",
                 "--sampler", "exhaustive", "--iterations", "3", "--warmup", "1", "--workers", "1",
                 "--results-dir", str(run), cwd=tmp_path, limit_s=TUNE_LIMIT_S)
    where = f"{program} ({NON_IDEMPOTENT[program][1]}): mneme tune"
    assert tune.returncode == 0, f"{where}: {tune.tail()}"
    baseline = json.loads((run / "baseline.json").read_text())
    assert baseline["verified"], (where, baseline)
    trials = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    statuses = Counter(t["status"] for t in trials)
    summary = f"{where} took {tune.seconds:.1f} s, trials by status: {dict(statuses)}"
    verified = [t for t in trials if t["status"] == "verified"]
    # The baseline's shape verifies; other shapes verify where the kernel's result does not depend on the shape
    # (the look-back scan's ticket counter ends at the number of tiles: other grids differ there, honestly).
    assert len(verified) >= (1 if program == "lookback_scan" else 2), summary
    assert set(statuses) <= {"verified", "failed_verification"}, summary
    # Nothing hung or lost a worker's context.
    hung_or_faulted = [(t["params"], t["status"], t["error"]) for t in trials
                       if t["status"] in ("timeout", "runtime_error")]
    assert not hung_or_faulted, (summary, hung_or_faulted)
    # Their times are of real launches: the written memory was reset before each one.
    not_reset = [t["params"] for t in verified if t["result"].get("reset_each_launch") is not True]
    assert not not_reset, (summary, "verified trials timed without a reset before every launch", not_reset)
    print(summary)
