"""Slurm: one ``mneme serve`` per GPU and tuners that find them, from inside a batch job.

``deploy/slurm/mneme-tune.sbatch`` starts two job steps with ``srun``; each task runs
``python -m replay_server.slurm serve ...`` or ``python -m replay_server.slurm tune ...``, and this module turns the
task's Slurm variables into the ``mneme serve`` / ``mneme tune`` command it runs:

* ``serve``: which GPU (the one ``srun --gpus-per-task=1`` left visible, else the task's local id
  among the node's GPUs), a port (``--base-port`` + local id, so tasks of a node never collide), the
  address tuners dial (this node's name and that port), the announcement location
  (``--announce``; default ``$SLURM_SUBMIT_DIR/mneme-servers-$SLURM_JOB_ID``, a shared filesystem).
* ``tune``: waits until ``--expect`` servers are announced (all of them up, not only the first),
  then runs ``mneme tune --servers-from`` with a results directory per task
  (``RESULTS/task-<SLURM_PROCID>``, continued with ``--resume`` when an earlier job left a run there)
  and, with ``--optuna-storage``, one study shared by every tuner task (study name:
  ``mneme-<SLURM_JOB_ID>`` unless given); the tuner's other flags follow ``--``.

Both take ``--token-file``: the job's bearer token, which the servers require and the tuners send.

Everything here is plain functions of an environment mapping, so the logic is tested with Slurm's
variables set on loopback (``tests/scale/test_slurm.py``), without Slurm.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from mneme._internal.child_process import child_env, mneme_command
from mneme.errors import ConfigurationError, NotAvailableError

DEFAULT_BASE_PORT = 50051


@dataclass(frozen=True)
class SlurmTask:
    """What Slurm tells one task about itself."""

    job_id: str
    proc_id: int  # rank among the step's tasks
    local_id: int  # rank among the step's tasks on this node
    node: str
    submit_dir: str
    visible_gpus: tuple[str, ...]  # CUDA_VISIBLE_DEVICES as Slurm set it

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "SlurmTask":
        env = os.environ if env is None else env
        if "SLURM_JOB_ID" not in env:
            raise ConfigurationError("not inside a Slurm job (no SLURM_JOB_ID): run this through srun in an "
                                     "sbatch script such as deploy/slurm/mneme-tune.sbatch")
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        return cls(
            job_id=env["SLURM_JOB_ID"],
            proc_id=int(env.get("SLURM_PROCID", "0")),
            local_id=int(env.get("SLURM_LOCALID", "0")),
            node=env.get("SLURMD_NODENAME") or socket.gethostname(),
            submit_dir=env.get("SLURM_SUBMIT_DIR") or os.getcwd(),
            visible_gpus=tuple(v for v in visible.split(",") if v),
        )

    @property
    def gpu(self) -> int:
        """The GPU index this task's server drives, among those the task sees."""
        if len(self.visible_gpus) == 1:  # srun --gpus-per-task=1 (or --gpu-bind): Slurm left one
            return 0
        if self.visible_gpus and self.local_id >= len(self.visible_gpus):
            raise ConfigurationError(
                f"task {self.local_id} on {self.node} sees GPUs {','.join(self.visible_gpus)}: more server tasks "
                "than GPUs on the node; give srun --ntasks-per-node equal to the GPUs per node")
        return self.local_id

    def default_announce(self) -> str:
        return str(Path(self.submit_dir) / f"mneme-servers-{self.job_id}")


def serve_command(task: SlurmTask, *, store: str, announce: str | None = None, base_port: int = DEFAULT_BASE_PORT,
                  host: str | None = None, token_file: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The ``mneme serve`` command of one server task."""
    port = base_port + task.local_id
    address = f"{host or task.node}:{port}"
    token = ["--token-file", token_file] if token_file else []
    return mneme_command("serve", "--gpu", str(task.gpu), "--port", str(port), "--store", store,
                         "--announce", announce or task.default_announce(), "--announce-address", address,
                         *token, *extra)


def tune_command(task: SlurmTask, *, announce: str | None, results: str, storage: str | None = None,
                 study_name: str | None = None, token_file: str | None = None,
                 extra: Sequence[str] = ()) -> list[str]:
    """The ``mneme tune`` command of one tuner task; ``--resume`` where an earlier job left this task's run
    (a job stopped by its time limit, submitted again)."""
    results_dir = Path(results) / f"task-{task.proc_id}"
    command = mneme_command("tune", "--servers-from", announce or task.default_announce(),
                            "--results-dir", str(results_dir), *extra)
    if token_file:
        command += ["--token-file", token_file]
    if (results_dir / "config.json").exists() and "--resume" not in extra:
        command.append("--resume")
    if storage:
        command += ["--optuna-storage", storage, "--study-name", study_name or f"mneme-{task.job_id}"]
    return command


def wait_for_count(location: str, expect: int, timeout: float) -> list[str]:
    """Wait until ``expect`` servers are live in ``location``; their addresses."""
    from replay_server.discovery import live_servers

    deadline = time.monotonic() + timeout
    while True:
        servers = live_servers(location)
        if len(servers) >= expect:
            return servers
        if time.monotonic() >= deadline:
            raise NotAvailableError(
                f"{len(servers)} of {expect} replay servers announced in {location} after {timeout:g}s "
                f"({', '.join(servers) or 'none'}); see the server step's output")
        time.sleep(0.5)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m replay_server.slurm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    serve = sub.add_parser("serve", help="run this task's mneme serve (one task per GPU)")
    serve.add_argument("--store", required=True, help="the artifact store (directory or s3://bucket/prefix)")
    serve.add_argument("--announce", help="where to announce (default $SLURM_SUBMIT_DIR/mneme-servers-$SLURM_JOB_ID)")
    serve.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT, help="port of local task 0 (default 50051)")
    serve.add_argument("--host", help="address tuners dial (default this node's name, SLURMD_NODENAME)")
    serve.add_argument("--token-file", help="bearer token file the server requires (the job's)")
    tune = sub.add_parser("tune", help="wait for the servers, then run this task's mneme tune")
    tune.add_argument("--announce", help="where the servers announce (default as for serve)")
    tune.add_argument("--expect", type=int, default=1, help="servers to wait for before tuning (default 1)")
    tune.add_argument("--wait", type=float, default=600.0, help="seconds to wait for them (default 600)")
    tune.add_argument("--results", default="mneme-results", help="results root; each task writes task-<PROCID>/")
    tune.add_argument("--optuna-storage", help="a study shared by every tuner task (journal:PATH, postgresql://...)")
    tune.add_argument("--study-name", help="default mneme-$SLURM_JOB_ID")
    tune.add_argument("--token-file", help="bearer token file the servers require (the job's)")
    for p in (serve, tune):
        p.add_argument("rest", nargs=argparse.REMAINDER, help="after --: more flags for mneme serve / mneme tune")
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rest = list(args.rest[1:] if args.rest[:1] == ["--"] else args.rest)
    try:
        task = SlurmTask.from_env(env)
        if args.role == "serve":
            command = serve_command(task, store=args.store, announce=args.announce, base_port=args.base_port,
                                    host=args.host, token_file=args.token_file, extra=rest)
        else:
            announce = args.announce or task.default_announce()
            servers = wait_for_count(announce, args.expect, args.wait)
            print(f"replay_server.slurm: task {task.proc_id}: {len(servers)} servers: {' '.join(servers)}", flush=True)
            command = tune_command(task, announce=announce, results=args.results, storage=args.optuna_storage,
                                   study_name=args.study_name, token_file=args.token_file, extra=rest)
    except (ConfigurationError, NotAvailableError) as exc:
        print(f"replay_server.slurm: error: {exc}", file=sys.stderr)
        return 2
    print("replay_server.slurm: " + " ".join(command), flush=True)
    if args.role == "serve":  # the server takes this task's place: srun's signals reach it directly
        os.execve(command[0], command, child_env())
    return subprocess.call(command, env=child_env())


if __name__ == "__main__":
    sys.exit(main())
