"""The real recording under tests/data/recordings/vecadd (made on an H100 by
`mneme record -rdb DIR -- examples/vecadd/vecadd 16384 2`) reads back and
holds what the program computes."""

from __future__ import annotations

import struct
from pathlib import Path

from mneme.recording.execution import RecordedExecution

RECORDING = Path(__file__).resolve().parents[1] / "data" / "recordings" / "vecadd"
N = 16384


def test_vecadd_recording_is_valid_and_exact():
    (db,) = RECORDING.glob("*.json")
    rec = RecordedExecution.from_json(db)
    rec.check_static_hash()
    assert rec.kernel_name == "_Z6vecaddPKfS0_Pfi"
    assert rec.address_space.mode == "fixed" and rec.address_space.base == 0x7F0000000000
    assert b".entry _Z6vecaddPKfS0_Pfi" in rec.load_code("ptx")
    (inst,) = rec.instances.values()  # two identical launches: one instance
    assert (inst.grid_dim.x, inst.block_dim.x) == (N // 256, 256)
    a_ptr, b_ptr, c_ptr, n = struct.unpack("<QQQi", inst.arguments)
    assert n == N and inst.pointer_args == (0, 8, 16)
    unpack = lambda data: struct.unpack(f"<{N}f", data)  # noqa: E731
    pro = {r.base: unpack(r.read(rec.store)) for r in inst.load_prologue().regions}
    epi = {r.base: unpack(r.read(rec.store)) for r in inst.load_epilogue().regions}
    a = tuple(i * 0.5 for i in range(N))
    b = tuple(2.0 - i * 0.25 for i in range(N))
    assert pro[a_ptr] == a and pro[b_ptr] == b and pro[c_ptr] == (0.0,) * N
    assert epi[c_ptr] == tuple(x + y for x, y in zip(a, b))
