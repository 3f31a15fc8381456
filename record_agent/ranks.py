"""Which MPI rank this process is, from the variables the usual launchers set.

``mneme record`` is started once per rank (``mpirun -n 4 mneme record ... -- ./app``);
each instance reads its rank here and records only when ``-rr`` selects it.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Launcher variables, most specific first: Slurm, Open MPI, MPICH/Hydra (PMI), Flux, PMIx, MVAPICH, Cray PALS.
RANK_VARIABLES = (
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "FLUX_TASK_RANK",
    "PMIX_RANK",
    "MV2_COMM_WORLD_RANK",
    "PALS_RANKID",
)


def detect_rank(env: Mapping[str, str]) -> int | None:
    """The rank named by the first launcher variable set to an integer, else None (not an MPI run)."""
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def rank_selected(rank: int | None, selection: frozenset[int] | None) -> bool:
    """Whether to record: ``selection`` None means all ranks; outside MPI (rank None) always."""
    if rank is None or selection is None:
        return True
    return rank in selection
