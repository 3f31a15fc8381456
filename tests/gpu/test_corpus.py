"""The reach corpus (issue #18): small CUDA programs written here, each recorded unmodified.

For every program the expected outcome is stated below, kernel by kernel: every
recorded instance either replays verified in a fresh `mneme replay --no-relocate`
process (at its recorded addresses: `relocated` false), or is recorded
`supported: false` with the reason, and `mneme replay` refuses it with exit
status 2 and that reason (never a CUDA fault). Kernels the recorder must not
record have no recording. Kernel nodes of CUDA graphs are recorded one by one
when their graph is launched, and replay like direct launches.

The programs are tests/gpu/programs/corpus/*.cu (`make corpus`);
tests/test_gpu_programs_build.py compiles them without a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from test_record import PROGRAMS, _nvcc, mneme_record, recorder_lib  # noqa: F401 (fixture)

from mneme.recording.execution import RecordedExecution
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu



@dataclass(frozen=True)
class Expected:
    """What recording one corpus program gives. A kernel is named by a substring of its mangled name.

    ``verified``: kernel -> how many recorded kernels it names (a template instantiated twice: 2);
    every instance of each replays verified, not relocated. ``auto``: those among them whose output
    depends on thread scheduling (replayed with --tolerance auto). ``refused``: kernel -> the reason
    its every instance is unsupported with. ``absent``: kernels that must have no recording.
    ``instances``: exact instance counts where they matter. ``stderr``: what the recording must say.
    """

    verified: dict[str, int] = field(default_factory=dict)
    auto: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    instances: dict[str, int] = field(default_factory=dict)
    stderr: tuple[str, ...] = ()

    def kernel_of(self, name: str) -> str:
        keys = [k for k in (*self.verified, *self.refused) if k in name]
        assert len(keys) == 1, f"recorded kernel {name} matches {keys or 'no kernel'} of the expectation"
        return keys[0]


CORPUS = {
    # Managed memory is captured where the driver put it and replayed at the same addresses (as device memory).
    "managed_alone": Expected(verified={"saxpy_managed": 1}),
    "managed_mixed": Expected(verified={"scale_device": 1, "gather_into_managed": 1, "accumulate_from_managed": 1}),
    # The kernel nodes of both graphs (stream-captured and explicitly built: a kernel node from a CUkernel, one in a
    # child graph) are recorded at each graph's first launch, beside the direct launches; the second launch of each
    # graph repeats the same instances (duplicates, not recorded).
    "graphs": Expected(
        verified={"cap_scale": 1, "cap_shift": 1, "cap_square": 1, "exp_fill": 1, "exp_axpy": 1, "child_offset": 1,
                  "exp_halve": 1, "exp_count": 1, "direct_sum": 1},
        instances={"cap_scale": 2, "cap_shift": 1, "cap_square": 1, "exp_fill": 1, "exp_axpy": 1, "child_offset": 1,
                   "exp_halve": 1, "exp_count": 1},  # cap_scale: the warm-up launch and the captured one
        stderr=("captured into a CUDA graph is recorded when the graph is launched",),
    ),
    # The tree's cell numbering depends on which thread takes a lock first: build_tree verifies under
    # --tolerance auto (its child entries are a permutation); the kernels reading the tree are exact.
    "barnes_hut": Expected(
        verified={"bounding_box": 1, "clear_cells": 1, "build_tree": 1, "summarize": 1, "force": 1, "integrate": 1},
        auto=("build_tree",),
    ),
    "device_pointers": Expected(verified={"link_list": 1, "link_tree": 1, "walk_list": 1, "walk_tree": 1}),
    "streams_events": Expected(verified={"produce": 1, "consume_square": 1, "consume_negate": 1, "combine": 1}),
    "constant_symbol": Expected(verified={"stencil": 1}),
    "dynamic_shared": Expected(verified={"block_scan": 1, "big_tile_reverse": 1}),
    "templates": Expected(verified={"box_blur": 2}),
    "grid3d": Expected(verified={"laplace3d": 1}),
    # The texture object (over linear memory) is captured and recreated: its kernel replays like the other.
    "texture_object": Expected(verified={"plain_copy_scaled": 1, "fetch_texture": 1}),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    subprocess.run(["make", "-s", "-j4", "-C", PROGRAMS, "corpus", f"OUTDIR={out}", f"NVCC={_nvcc()}"], check=True)
    return out


def mneme(*argv: str) -> subprocess.CompletedProcess:
    """A fresh `mneme` process (nothing of an earlier replay is mapped in it)."""
    return subprocess.run([sys.executable, "-m", "mneme", *argv], env=child_env(), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("program", sorted(CORPUS))
def test_every_instance_replays_verified_or_is_refused(recorder_lib, corpus, tmp_path, program):  # noqa: F811
    expected = CORPUS[program]
    rdb = tmp_path / "rdb"
    proc = mneme_record(recorder_lib, rdb, [corpus / program])
    assert f"{program}: ok" in proc.stdout, proc.stdout  # the program's own check, under the recorder
    for text in expected.stderr:
        assert text in proc.stderr, proc.stderr

    recordings: dict[str, list[RecordedExecution]] = {}
    for path in sorted(rdb.glob("*.json")):
        rec = RecordedExecution.from_json(path)
        assert not any(name in rec.kernel_name for name in expected.absent), f"{rec.kernel_name} was recorded"
        recordings.setdefault(expected.kernel_of(rec.kernel_name), []).append(rec)
    wanted = {**expected.verified, **{k: 1 for k in expected.refused}}
    assert {k: len(v) for k, v in recordings.items()} == wanted

    refused = 0
    for kernel, recs in recordings.items():
        for rec in recs:
            db = str(rdb / rec.database_name)
            if kernel in expected.instances:
                assert len(rec.instances) == expected.instances[kernel], (kernel, list(rec.instances))
            for inst in rec.instances.values():
                where = f"{program}: {rec.kernel_name} instance {inst.record_id}"
                if kernel in expected.refused:
                    refused += 1
                    reason = expected.refused[kernel]
                    assert not inst.supported and any(reason in r for r in inst.unsupported), (where, inst.unsupported)
                    replay = mneme("replay", "-rdb", db, "-rid", inst.record_id)
                    assert replay.returncode == 2 and reason in replay.stderr, (where, replay.stderr)
                    assert "CUDA_ERROR" not in replay.stderr, (where, replay.stderr)
                    continue
                assert inst.supported, (where, inst.unsupported)
                tolerance = ("--tolerance", "auto") if kernel in expected.auto else ()
                replay = mneme("replay", "-rdb", db, "-rid", inst.record_id, "--json", "--no-relocate", *tolerance)
                assert replay.returncode == 0, (where, replay.stdout[-2000:], replay.stderr[-2000:])
                result = json.loads(replay.stdout)["Result"]
                assert result["verified"] and not result["relocated"], (where, result)
    if refused:
        listing = mneme("ls", str(rdb))
        assert f"{refused} unsupported" in " ".join(listing.stdout.split()), listing.stdout
