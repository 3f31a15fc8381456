"""How much of the current search space a results directory has evaluated (``summary.json``'s
``complete`` and ``coverage``)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from tuner.space.search_space import (
    SearchSpace,
    constraints_checked,
    derive_checked,
    iterate_points,
    space_size,
)

#: Spaces with more points than this are not enumerated at the end of a run: their coverage is not counted.
MAX_COUNTED_POINTS = 100_000


def space_coverage(space: SearchSpace, records: Iterable[Mapping[str, Any]],
                   banned_blocks: Iterable[tuple[int, int, int]] = ()) -> dict[str, Any]:
    """Which distinct configurations of ``space`` (the points its constraints admit, one per grounded
    hash) have a trial record.

    Args:
        space: the run's current search space.
        records: the trial records (``trials.jsonl``).
        banned_blocks: block shapes that failed to launch (adaptive invalid ban): configurations with them
            count as settled without a replay of their own.

    Returns:
        ``configurations`` (None when the space is continuous or larger than ``MAX_COUNTED_POINTS``),
        ``evaluated`` (of them, with a record), ``banned`` (settled by a ban), ``missing``, ``outside``
        (records of configurations not in the space) and ``complete``: every configuration evaluated or
        banned.
    """
    done = {r.get("hash") for r in records if r.get("hash")}
    banned = {tuple(b) for b in banned_blocks}
    size = space_size(space)
    if size is None or size > MAX_COUNTED_POINTS:
        return {"configurations": None, "evaluated": None, "banned": None, "missing": None, "outside": None,
                "complete": False}
    hashes: dict[str, tuple[int, int, int]] = {}
    for params in iterate_points(space):
        if constraints_checked(space, params):
            config = derive_checked(space, params)
            hashes.setdefault(config.ground().hash(), config.block.as_tuple())
    evaluated = sum(1 for h in hashes if h in done)
    settled = sum(1 for h, block in hashes.items() if h not in done and block in banned)
    missing = len(hashes) - evaluated - settled
    return {"configurations": len(hashes), "evaluated": evaluated, "banned": settled, "missing": missing,
            "outside": len(done - hashes.keys()), "complete": missing == 0 and bool(hashes)}
