"""The engine layer without a GPU: clear errors, nothing imported that needs CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mneme.errors import ArtifactError, NotAvailableError
from mneme.format.chunks import ChunkRef
from mneme.format.snapshot import Region, Snapshot
from mneme.replay import engine as eng
from mneme.replay.state import pair_regions, written_spans

pytestmark = pytest.mark.skipif(eng.driver_available(), reason="checks the machine-without-GPU path")


def test_require_driver_says_why():
    with pytest.raises(NotAvailableError, match="cannot replay on this machine|not built"):
        eng.require_driver()


def test_replayer_and_self_test_raise_not_available(tmp_path):
    from mneme.replay import Replayer, self_test

    with pytest.raises(NotAvailableError):
        self_test(0)
    with pytest.raises(NotAvailableError):
        Replayer(object(), "1")


def test_importing_the_compile_side_loads_no_engine():
    code = "import sys, mneme.replay.compile, mneme.replay.ptx; print('mneme._engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_native_module_imports_without_a_driver():
    native = pytest.importorskip("mneme._engine", reason="engine not built in this checkout")
    assert native.driver_available() is False
    assert "libcuda.so.1" in native.driver_unavailable_reason() or "driver" in native.driver_unavailable_reason()
    with pytest.raises(native.DriverUnavailable):
        native.Context(0)


def _region(base, chunks, kind="heap", size=None):
    refs = tuple(ChunkRef(h * 64, n) for h, n in chunks)
    return Region(base, size if size is not None else sum(n for _, n in chunks), kind, "r", refs)


def test_written_spans_follow_chunk_hashes():
    pro = _region(0, [("a", 4), ("b", 4), ("c", 4), ("d", 2)])
    epi = _region(0, [("a", 4), ("x", 4), ("y", 4), ("d", 2)])
    assert written_spans(pro, epi, 4) == [(4, 8)]
    assert written_spans(pro, pro, 4) == []
    epi = _region(0, [("x", 4), ("b", 4), ("c", 4), ("z", 2)])
    assert written_spans(pro, epi, 4) == [(0, 4), (12, 2)]


def test_regions_without_a_counterpart_are_an_artifact_error():
    pro = Snapshot("1", "2", "prologue", (_region(0x1000, [("a", 4)]),))
    epi = Snapshot("1", "2", "epilogue", (_region(0x2000, [("a", 4)]),))
    with pytest.raises(ArtifactError, match="no counterpart"):
        pair_regions(pro, epi)
    param = Snapshot("1", "2", "prologue", (_region(0, [("a", 4)], kind="parameter"),))
    assert pair_regions(param, Snapshot("1", "2", "epilogue", ())) == []
