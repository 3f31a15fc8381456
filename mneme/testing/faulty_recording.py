"""A synthetic recording of ``faulty_add`` (data/faulty.cu): a vector add that
traps with 96 threads per block, writes to an illegal address with 160, spins
forever with 224, and verifies with any other block size (grid-stride loop).

Used by the replay server's GPU tests to mix good configurations with ones
that take their worker down; built here, without a GPU, through mneme.format.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

from mneme.format.database import AddressSpace, DeviceInfo, KernelParam, KernelSignature
from mneme.format.hashing import static_hash
from mneme.format.writer import RecordingWriter, RegionSource, new_database
from mneme.store import open_store
from mneme.testing.synthetic import vecadd_expected

DATA = Path(__file__).resolve().parent / "data"
KERNEL = "faulty_add"
WINDOW = 0x7F0000000000
WINDOW_SIZE = 64 << 20
TRAP_BLOCK, ILLEGAL_ADDRESS_BLOCK, SPIN_BLOCK = 96, 160, 224
PARAMS = (KernelParam(0, 8, "pointer"), KernelParam(8, 8, "pointer"), KernelParam(16, 8, "pointer"),
          KernelParam(24, 8, "pointer"), KernelParam(32, 4, "scalar"))


def write_faulty_recording(directory: Path, n: int = 1 << 16, block: int = 256, offset: int = 0) -> tuple[Path, str]:
    """Write the recording into ``directory`` (a further instance when it holds one already).

    Args:
        directory: the store's folder.
        n: the vectors' length.
        block: the recorded block size.
        offset: where the instance's buffers start in the window (instances that a worker holds at once
            must not overlap: 32 MiB apart suits n up to 1 << 21).

    Returns:
        The database's path and the instance's record id.
    """
    ptx = (DATA / "faulty.ptx").read_text()
    cubin = (DATA / "faulty.sm_90.cubin").read_bytes()
    store = open_store(str(directory))
    writer = RecordingWriter(store)
    static = static_hash(KERNEL, ptx)
    code = writer.write_code(static, ptx=ptx, cubin=cubin, arch="sm_90")
    db = new_database(
        static, KernelSignature(KERNEL, KERNEL, PARAMS, 36), code,
        device=DeviceInfo("NVIDIA H100 80GB HBM3", (9, 0), 0),
        address_space=AddressSpace("fixed", WINDOW, WINDOW_SIZE),
    )
    rng = random.Random(7)
    a = struct.pack(f"<{n}f", *(float(rng.randint(-1000, 1000)) / 8 for _ in range(n)))
    b = struct.pack(f"<{n}f", *(float(rng.randint(-1000, 1000)) / 8 for _ in range(n)))
    stride = -(-4 * n // (2 << 20)) * (2 << 20)
    base = WINDOW + offset
    pa, pb, pc, pspin = base, base + stride, base + 2 * stride, base + 3 * stride
    args = struct.pack("<QQQQi", pa, pb, pc, pspin, n)

    def regions(c: bytes) -> list[RegionSource]:
        return [RegionSource(pa, "heap", "a", data=a), RegionSource(pb, "heap", "b", data=b),
                RegionSource(pc, "heap", "c", data=c), RegionSource(pspin, "heap", "spin", data=bytes(4))]

    db, instance = writer.write_instance(
        db, grid=(-(-n // block), 1, 1), block=(block, 1, 1), shared_mem=0, args=args,
        prologue=regions(bytes(4 * n)), epilogue=regions(vecadd_expected(a, b)), pointer_args=(0, 8, 16, 24),
    )
    return directory / db.name, instance.dynamic_hash
