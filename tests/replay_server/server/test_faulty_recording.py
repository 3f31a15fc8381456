"""The GPU tests' faulty recording is a valid recording (checked here, without a GPU)."""

from __future__ import annotations

from mneme.recording.execution import RecordedExecution
from mneme.testing.faulty_recording import KERNEL, write_faulty_recording


def test_faulty_recording_reads_back(tmp_path):
    path, record_id = write_faulty_recording(tmp_path, n=4096)
    recording = RecordedExecution.from_json(str(path))
    instance = recording[record_id]
    assert recording.kernel_name == KERNEL and instance.block_dim.x == 256 and instance.grid_dim.x == 16
    assert b".entry faulty_add" in recording.load_code("ptx") and recording.load_code("cubin")[:4] == b"\x7fELF"
    epilogue = {r.name: r for r in instance.load_epilogue().regions}
    assert set(epilogue) == {"a", "b", "c", "spin"}
