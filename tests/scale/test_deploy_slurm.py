"""deploy/slurm/mneme-tune.sbatch as shipped, on loopback (fake srun, fake-engine servers): counts from the
allocation, the job's token, the study server, and a second submission continuing the first run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from scale_helpers import TESTS, free_port_run

from mneme.testing.synthetic import write_vecadd_recording
from replay_server.slurm import SlurmTask, tune_command

ROOT = TESTS.parent
SBATCH = ROOT / "deploy" / "slurm" / "mneme-tune.sbatch"
TUNE_ARGS = ["--space-preset", "launch", "--launch-dim", "x", "--launch-safety", "aggressive",
             "--fixed-codegen-opt", "3", "--sampler", "random", "--workers", "2", "--quiet"]


def job_env(tmp_path: Path, job_id: str, **extra: str) -> dict[str, str]:
    """A job's environment; ``extra`` names the recording (MNEME_RECORD_DB, MNEME_RECORD_ID) and the GPUs."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "srun").symlink_to(Path(__file__).resolve().parent / "fake_srun.py")
    (tmp_path / "log").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "MNEME_FAKE_ENGINE": json.dumps({"log_dir": str(tmp_path / "log"), "replay_seconds": 0.01}),
        "SLURM_JOB_ID": job_id, "SLURM_JOB_NAME": "vecadd-sweep", "SLURM_JOB_NUM_NODES": "1",
        "SLURM_SUBMIT_DIR": str(tmp_path), "SLURMD_NODENAME": "127.0.0.1", "SLURM_CPUS_ON_NODE": "4",
        "MNEME_PYTHON": sys.executable, "MNEME_STORE": str(tmp_path / "store"), "MNEME_TUNERS": "2",
        "MNEME_SERVE_ARGS": "--engine replay_server.testing.fake_engine:spec_from_env --host 127.0.0.1 --log-level WARNING --lease 5",
        **extra,
    }
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        if name not in extra:
            env.pop(name, None)
    return env


def submit(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = {**env, "MNEME_BASE_PORT": str(free_port_run(4))}
    return subprocess.run(["bash", str(SBATCH), *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def records(results: Path) -> list[dict]:
    return [json.loads(line) for task in sorted(results.glob("task-*"))
            for line in (task / "trials.jsonl").read_text().splitlines()]


def test_a_second_submission_continues_the_run(tmp_path):
    recording = write_vecadd_recording(tmp_path / "store", n=4096, block=256)
    extra = {"MNEME_RECORD_DB": str(tmp_path / "store" / recording.database),
             "MNEME_RECORD_ID": recording.dynamic_hash}
    # First job: the GPU count only in --gpus-per-node's typed form; stopped early (a small budget).
    first = submit(tmp_path, job_env(tmp_path, "501", SLURM_GPUS_PER_NODE="h100:2", **extra), *TUNE_ARGS,
                   "--trials", "6")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert first.stdout.count("2 servers: 127.0.0.1:") == 2, first.stdout
    assert "--token-file" in first.stdout and "--optuna-storage grpc://127.0.0.1:" in first.stdout
    results = tmp_path / "mneme-results-vecadd-sweep"
    done_first = records(results)
    # 6 trials a task; a configuration the other task evaluates is a duplicate (a trial without a record)
    assert 0 < len(done_first) <= 12 and len({r["hash"] for r in done_first}) == len(done_first)
    assert all((task / "trials.jsonl").read_text() for task in results.glob("task-*")), "both tasks evaluated"
    assert not list(tmp_path.glob(".mneme-token-*")), "the job's token is deleted at its end"
    # Second job, same name: each task resumes its directory, the study keeps its trials.
    second = submit(tmp_path, job_env(tmp_path, "502", SLURM_GPUS_ON_NODE="2", **extra), *TUNE_ARGS,
                    "--trials", "14")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.count("--resume") >= 2, second.stdout
    done = records(results)
    assert len(done) > len(done_first)
    hashes = Counter(r["hash"] for r in done)
    assert max(hashes.values()) == 1, "no configuration evaluated twice, across both jobs"
    assert (tmp_path / "mneme-study-vecadd-sweep.log").exists()
    assert "0 evaluated twice" in second.stdout
    assert not list(tmp_path.glob(".mneme-token-*"))


def test_no_gpus_in_the_allocation_is_a_clear_error(tmp_path):
    recording = write_vecadd_recording(tmp_path / "store", n=4096, block=256)
    env = job_env(tmp_path, "503", MNEME_RECORD_DB=str(tmp_path / "store" / recording.database),
                  MNEME_RECORD_ID=recording.dynamic_hash)
    done = submit(tmp_path, env, *TUNE_ARGS)
    assert done.returncode == 2 and "submit with --gpus-per-node" in done.stderr, done.stderr


def test_a_tuner_task_resumes_its_directory(tmp_path):
    env = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "1", "SLURMD_NODENAME": "n1", "SLURM_SUBMIT_DIR": str(tmp_path)}
    task = SlurmTask.from_env(env)
    assert "--resume" not in tune_command(task, announce=None, results=str(tmp_path))
    (tmp_path / "task-1").mkdir()
    (tmp_path / "task-1" / "config.json").write_text("{}")
    command = tune_command(task, announce=None, results=str(tmp_path), token_file="/t")
    assert command[-3:] == ["--token-file", "/t", "--resume"]
