"""Kernel nodes of CUDA graphs under `mneme record` (native/recorder/src/graph_expansion.cpp).

The recorder runs a graph node by node when one of its kernel nodes may be
recorded; the application's results must not change for it. A graph with a node
it cannot run on its own (here: memory allocation and free nodes from
cudaMallocAsync/cudaFreeAsync inside a stream capture) is launched whole, and
stderr names each kernel node it leaves unrecorded, once. The recordings of the
graph kernels themselves replay verified in tests/gpu/test_corpus.py (`graphs`).
"""

from __future__ import annotations

import subprocess

import pytest
from test_record import PROGRAMS, _nvcc, mneme_record, recorder_lib  # noqa: F401 (fixture)

from mneme.recording.execution import RecordedExecution
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def graph_programs(tmp_path_factory):
    out = tmp_path_factory.mktemp("graph-programs")
    subprocess.run(["make", "-s", "-C", PROGRAMS, f"OUTDIR={out}", f"NVCC={_nvcc()}", f"{out}/graphs",
                    f"{out}/graph_mem_node"], check=True)
    return out


def recorded_kernels(rdb) -> list[str]:
    return [RecordedExecution.from_json(path).kernel_name for path in sorted(rdb.glob("*.json"))]


def test_a_graph_run_node_by_node_gives_the_application_the_same_results(recorder_lib, graph_programs, tmp_path):  # noqa: F811
    plain = subprocess.run([graph_programs / "graphs"], env=child_env(), capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "graphs: ok" in plain.stdout, plain.stdout + plain.stderr
    recorded = mneme_record(recorder_lib, tmp_path / "rdb", [graph_programs / "graphs"])
    assert recorded.stdout == plain.stdout  # results' checksum and host node calls included
    kernels = recorded_kernels(tmp_path / "rdb")
    for name in ("cap_shift", "cap_square", "exp_fill", "exp_axpy", "child_offset", "exp_halve", "exp_count"):
        assert any(name in k for k in kernels), (name, kernels)


def test_a_graph_with_a_memory_node_is_launched_whole_and_each_kernel_node_named(recorder_lib, graph_programs,  # noqa: F811
                                                                                  tmp_path):
    proc = mneme_record(recorder_lib, tmp_path / "rdb", [graph_programs / "graph_mem_node"])
    assert "graph_mem_node: ok" in proc.stdout, proc.stdout + proc.stderr
    kernels = recorded_kernels(tmp_path / "rdb")
    assert any("plain_twice" in k for k in kernels), kernels  # the direct launch is recorded
    assert not any("pool_fill" in k or "pool_drain" in k for k in kernels), kernels
    for name in ("pool_fill", "pool_drain"):
        lines = [line for line in proc.stderr.splitlines() if name in line and "a kernel node of a CUDA graph" in line]
        assert len(lines) == 1, (name, proc.stderr)  # once, though the graph is launched twice
        assert "memory allocation node" in lines[0] and "launched whole" in lines[0], lines[0]
