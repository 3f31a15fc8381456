"""Synthetic recordings for the store tests, written with mneme.format's writer (the real format)."""

from __future__ import annotations

import hashlib
import random
import struct
from pathlib import Path

from mneme.format.database import KernelParam, KernelSignature
from mneme.format.hashing import static_hash
from mneme.format.writer import RecordingWriter, RegionSource, new_database
from mneme.store import LocalStore

BASE = 0x7F0000000000
PTX = (
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry {name}(.param .u64 a, .param .u64 b, .param .u32 n)\n{{ ret; }}\n"
)


def write_recording(
    directory: Path,
    *,
    kernel: str = "solver_step",
    instances: int = 3,
    buffer_bytes: int = 256 << 10,
    chunk_size: int = 16 << 10,
    changed_fraction: float = 0.1,
    seed: int = 0,
) -> str:
    """A recording of ``instances`` launches of one kernel over two buffers; returns the database name.

    Like the iterations of a solver, each launch changes only ``changed_fraction``
    of the output buffer, so most chunks repeat across instances (dedupe).
    Random data, so that compression alone cannot explain a good ratio.
    """
    rng = random.Random(seed)
    store = LocalStore(directory)
    writer = RecordingWriter(store, chunk_size=chunk_size)
    ptx = PTX.format(name=kernel)
    sh = static_hash(kernel, ptx)
    code = writer.write_code(sh, ptx=ptx, cubin=b"\x7fELF" + hashlib.sha256(kernel.encode()).digest() * 16)
    signature = KernelSignature(
        kernel, f"{kernel}(double*, double*, unsigned int)",
        (KernelParam(0, 8, "pointer"), KernelParam(8, 8, "pointer"), KernelParam(16, 4, "scalar")), 20,
    )
    db = new_database(sh, signature, code)
    a = bytearray(rng.randbytes(buffer_bytes))
    x = bytearray(rng.randbytes(buffer_bytes))
    changed = max(1, int(buffer_bytes * changed_fraction))
    for i in range(instances):
        before = bytes(x)
        start = rng.randrange(0, buffer_bytes - changed + 1)
        x[start : start + changed] = rng.randbytes(changed)
        args = struct.pack("<QQI", BASE, BASE + buffer_bytes, buffer_bytes // 8)
        regions = lambda xs: [RegionSource(BASE, "heap", "A", data=bytes(a)),
                              RegionSource(BASE + buffer_bytes, "heap", "x", data=xs)]
        db, _ = writer.write_instance(
            db, grid=(buffer_bytes // 8 // 256, 1, 1), block=(256, 1, 1), shared_mem=0, args=args,
            prologue=regions(before), epilogue=regions(bytes(x)), pointer_args=(0, 8),
            launch_index=i, occurrence=i,
        )
    return db.name


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` by relative path (hidden files excluded): for byte-exact comparisons."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    }
