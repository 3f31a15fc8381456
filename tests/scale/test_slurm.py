"""Slurm: deploy/slurm/mneme-tune.sbatch and replay_server/slurm.py with Slurm's variables, on loopback.

The sbatch script runs for real under bash with an ``srun`` stand-in (fake_srun.py: tasks with
SLURM_PROCID/SLURM_LOCALID and one GPU each): fake-engine servers announce themselves in a directory,
two tuner tasks wait for all of them, share a journal study and write their own results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from scale_helpers import TESTS, free_port_run

from mneme._internal.child_process import mneme_command
from mneme.errors import ConfigurationError
from mneme.testing.synthetic import write_vecadd_recording
from replay_server.slurm import SlurmTask, serve_command, tune_command

ROOT = TESTS.parent
SBATCH = ROOT / "deploy" / "slurm" / "mneme-tune.sbatch"


def env(**extra):
    return {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "gpu-node-3",
            "SLURM_SUBMIT_DIR": "/shared/home/me", **extra}


def test_a_task_drives_the_gpu_slurm_gave_it():
    assert SlurmTask.from_env(env(CUDA_VISIBLE_DEVICES="3")).gpu == 0  # --gpus-per-task=1: one visible
    assert SlurmTask.from_env(env(CUDA_VISIBLE_DEVICES="0,1,2,3")).gpu == 1  # all visible: the local id
    with pytest.raises(ConfigurationError, match="more server tasks than GPUs"):
        SlurmTask.from_env(env(SLURM_LOCALID="4", CUDA_VISIBLE_DEVICES="0,1,2,3")).gpu
    with pytest.raises(ConfigurationError, match="not inside a Slurm job"):
        SlurmTask.from_env({})


def test_commands_of_server_and_tuner_tasks():
    task = SlurmTask.from_env(env(CUDA_VISIBLE_DEVICES="2"))
    serve = serve_command(task, store="s3://b/rec", extra=["--workers", "2"])
    assert serve == mneme_command("serve", "--gpu", "0", "--port", "50052", "--store", "s3://b/rec",
                         "--announce", "/shared/home/me/mneme-servers-4242", "--announce-address",
                         "gpu-node-3:50052", "--workers", "2")
    tune = tune_command(task, announce=None, results="/r", storage="journal:/s.log", extra=["-rid", "7"])
    assert tune == mneme_command("tune", "--servers-from", "/shared/home/me/mneme-servers-4242",
                        "--results-dir", "/r/task-5", "-rid", "7", "--optuna-storage", "journal:/s.log",
                        "--study-name", "mneme-4242")


def test_the_sbatch_script_runs_servers_and_sharing_tuners(tmp_path):
    store = tmp_path / "store"
    recording = write_vecadd_recording(store, n=4096, block=256)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").symlink_to(Path(__file__).resolve().parent / "fake_srun.py")
    (tmp_path / "log").mkdir()
    job = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "MNEME_FAKE_ENGINE": json.dumps({"log_dir": str(tmp_path / "log"), "replay_seconds": 0.02}),
        "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "job77", "SLURM_JOB_NUM_NODES": "1", "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURMD_NODENAME": "127.0.0.1", "SLURM_GPUS_ON_NODE": "2",
        "MNEME_PYTHON": sys.executable, "MNEME_STORE": str(store), "MNEME_TUNERS": "2",
        "MNEME_RECORD_DB": str(store / recording.database), "MNEME_RECORD_ID": recording.dynamic_hash,
        "MNEME_BASE_PORT": str(free_port_run(2)),  # the two GPUs' servers
        "MNEME_SERVE_ARGS": "--engine replay_server.testing.fake_engine:spec_from_env --host 127.0.0.1 --log-level WARNING --lease 5",
    }
    done = subprocess.run(["bash", str(SBATCH), "--space-preset", "launch", "--launch-dim", "x",
                           "--launch-safety", "aggressive", "--fixed-codegen-opt", "3", "--sampler", "random", "--trials", "16",
                           "--workers", "2", "--quiet"],
                          env=job, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("2 servers: 127.0.0.1:") == 2, done.stdout
    results = tmp_path / "mneme-results-job77"
    records = [json.loads(line) for task in ("task-0", "task-1")
               for line in (results / task / "trials.jsonl").read_text().splitlines()]
    hashes = Counter(r["hash"] for r in records)
    assert records and max(hashes.values()) == 1, "the two tuners never replayed a configuration twice"
    servers = {line.split()[2] for line in (tmp_path / "log" / "runs.log").read_text().splitlines()}
    assert len(servers) >= 2, "both servers replayed"
    assert "evaluated trials" in done.stdout and "0 evaluated twice" in done.stdout  # the merged report
    assert list((tmp_path / "mneme-servers-77").iterdir()) == [], "servers deleted their announcements"
