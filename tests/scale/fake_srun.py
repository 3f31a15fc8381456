#!/usr/bin/env python3
"""``srun`` for the Slurm test, on one node: starts ``--ntasks`` (or ``--ntasks-per-node`` x
``SLURM_JOB_NUM_NODES``) copies of the command with the variables Slurm gives each task, binds one GPU
per task for ``--gpus-per-task=1``, forwards SIGTERM/SIGINT to them and exits with the worst status."""

import os
import signal
import subprocess
import sys

args = sys.argv[1:]
ntasks, per_node, one_gpu = None, None, False
while args and args[0].startswith("-"):
    option = args.pop(0)
    name, _, value = option.partition("=")
    if name in ("--ntasks", "-n"):
        ntasks = int(value)
    elif name == "--ntasks-per-node":
        per_node = int(value)
    elif option == "--gpus-per-task=1":
        one_gpu = True
if ntasks is None:
    ntasks = (per_node or 1) * int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
children = []
for rank in range(ntasks):
    env = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": str(ntasks),
           "SLURM_STEP_ID": str(os.getpid())}
    if one_gpu:
        env["CUDA_VISIBLE_DEVICES"] = str(rank)
    children.append(subprocess.Popen(args, env=env))


def forward(signum, frame):
    for child in children:
        if child.poll() is None:
            child.send_signal(signum)


signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
sys.exit(max(child.wait() for child in children))
