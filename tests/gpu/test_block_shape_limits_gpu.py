"""On a GPU: code that fixes (``.reqntid``) or caps (``.maxntid``) its block refuses other blocks at launch,
which is why ``mneme tune`` refuses or limits ``block_shape`` for it (tests/tuner/test_knobs.py, on the CPU).

The kernels are tests/mneme/replay/data/block_shapes.cu (``__block_size__((128, 1, 1))``,
``__launch_bounds__(256)``), recorded synthetically with vecadd's memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mneme.recording.execution import RecordedExecution
from mneme.testing.synthetic import VecaddCode, write_vecadd_recording
from tuner.space.knobs import knob_applicability

pytestmark = pytest.mark.gpu
DATA = Path(__file__).resolve().parents[1] / "mneme" / "replay" / "data"
N = 1 << 16


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    import mneme.replay.compile as compile_mod

    monkeypatch.setattr(compile_mod, "_default_cache", None)


def _replayer(tmp_path: Path, kernel: str, block: int, include_ptx: bool = True):
    from mneme.replay import Replayer

    code = VecaddCode(kernel_name=kernel, demangled=kernel, ptx=(DATA / "block_shapes.ptx").read_text(),
                      cubin=(DATA / "block_shapes.sm_90.cubin").read_bytes())
    made = write_vecadd_recording(tmp_path / kernel, n=N, block=block, code=code, include_ptx=include_ptx)
    recording = RecordedExecution.from_json(made.path)
    instance = recording.single_instance()
    return instance, Replayer(recording, instance.record_id)


def _with_block(replayer, x: int):
    return replayer.baseline().replace(block={"x": x, "y": 1, "z": 1}, grid={"x": -(-N // x), "y": 1, "z": 1})


@pytest.mark.parametrize("include_ptx", [True, False], ids=["ptx", "sass-only"])
def test_a_fixed_block_runs_only_as_recorded(tmp_path, include_ptx):
    instance, replayer = _replayer(tmp_path, "vecadd_fixed", 128, include_ptx)
    with replayer:
        assert replayer.run(replayer.baseline()).status == "verified"
        other = replayer.run(_with_block(replayer, 256))
        assert other.status == "invalid_launch", (other.status, other.error)
    assert "block_shape" in knob_applicability(instance).refused


def test_a_capped_block_runs_up_to_its_cap(tmp_path):
    instance, replayer = _replayer(tmp_path, "vecadd_capped", 128)
    with replayer:
        assert replayer.run(_with_block(replayer, 256)).status == "verified"
        above = replayer.run(_with_block(replayer, 512))
        assert above.status == "invalid_launch", (above.status, above.error)
    assert knob_applicability(instance).max_block_threads == 256
