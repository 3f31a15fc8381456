"""Synthetic recordings: complete, valid recordings made without a GPU.

Other components' tests (replay, servers, tuner, store sync) need recordings
on machines where nothing can be recorded. ``write_vecadd_recording`` writes a
vector-add recording with real code (PTX and an sm_90 cubin) and made-up but
consistent memory: the epilogue holds exactly what the kernel computes, so a
replay on a GPU verifies bit-exactly, and a tampered epilogue does not.
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass

from mneme.format.database import (
    AddressSpace,
    DeviceInfo,
    KernelParam,
    KernelSignature,
    RecorderInfo,
)
from mneme.format.hashing import static_hash
from mneme.format.writer import RecordingWriter, RegionSource, new_database
from mneme.recording.window import DEFAULT_VA_BASE
from mneme.store import Store, open_store
from mneme.testing import vecadd_code

#: Where the synthetic allocations live: the recorder's default fixed window.
WINDOW_BASE = DEFAULT_VA_BASE
_ALIGN = 512
_WINDOW_GRANULARITY = 2 << 20


@dataclass(frozen=True)
class SyntheticRecording:
    """What ``write_vecadd_recording`` wrote."""

    store: Store
    database: str  # object name of <static>.json
    static_hash: str
    dynamic_hashes: tuple[str, ...]

    @property
    def path(self) -> str:
        """The database as ``-rdb`` takes it (a path or URL)."""
        return f"{self.store.url.rstrip('/')}/{self.database}"

    @property
    def dynamic_hash(self) -> str:
        """The first (or only) instance."""
        return self.dynamic_hashes[0]


@dataclass(frozen=True)
class VecaddCode:
    """The code of a kernel with vecadd's parameters ``(const float* a, const float* b, float* c, int n)``
    that computes ``c = a + b`` (default: ``vecadd`` itself; tests give variants with launch bounds)."""

    kernel_name: str = vecadd_code.KERNEL_NAME
    demangled: str = vecadd_code.DEMANGLED
    ptx: str = vecadd_code.PTX
    cubin: bytes = vecadd_code.CUBIN
    arch: str = vecadd_code.ARCH


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def _floats(rng: random.Random, n: int) -> list[float]:
    # Values exactly representable in float32, of mixed magnitude and sign.
    return [struct.unpack("<f", struct.pack("<f", rng.uniform(-1e3, 1e3)))[0] for _ in range(n)]


def vecadd_expected(a: bytes, b: bytes) -> bytes:
    """What the kernel computes: the IEEE float32 sum, element by element.

    The sum of two float32 values rounded once from a double is the correctly
    rounded float32 sum (double has more than 2*24+2 bits), so this matches the GPU's ``add.f32``.
    """
    n = len(a) // 4
    av, bv = struct.unpack(f"<{n}f", a), struct.unpack(f"<{n}f", b)
    return struct.pack(f"<{n}f", *(x + y for x, y in zip(av, bv)))


def vecadd_arrays(n: int, seed: int = 0) -> tuple[bytes, bytes, bytes, bytes]:
    """Inputs ``a``, ``b``, the prologue ``c`` (zeros) and the epilogue ``c`` (``a + b``), as float32 bytes."""
    rng = random.Random(seed)
    a = struct.pack(f"<{n}f", *_floats(rng, n))
    b = struct.pack(f"<{n}f", *_floats(rng, n))
    return a, b, bytes(4 * n), vecadd_expected(a, b)


def write_vecadd_recording(
    store_or_path: Store | str | os.PathLike[str],
    *,
    n: int = 1024,
    block: int = 256,
    seed: int = 0,
    instances: int = 1,
    include_ptx: bool = True,
    include_cubin: bool = True,
    chunk_size: int | None = None,
    code: VecaddCode = VecaddCode(),
) -> SyntheticRecording:
    """Write a recording of ``vecadd(a, b, c, n)`` with ``instances`` launches (same arguments, new data each).

    ``c`` is zero in the prologue and ``a + b`` in the epilogue; ``a`` and ``b``
    are the same in both, so their chunks are stored once. ``code``: the kernel's code.
    """
    if n < 1 or block < 1 or instances < 1:
        raise ValueError("n, block and instances must be at least 1")
    store = store_or_path if isinstance(store_or_path, Store) else open_store(store_or_path)
    writer = RecordingWriter(store) if chunk_size is None else RecordingWriter(store, chunk_size=chunk_size)
    static = static_hash(code.kernel_name, code.ptx if include_ptx else code.cubin)
    code_refs = writer.write_code(
        static,
        ptx=code.ptx if include_ptx else None,
        cubin=code.cubin if include_cubin else None,
        arch=code.arch,
    )
    kernel = KernelSignature(
        code.kernel_name,
        code.demangled,
        (KernelParam(0, 8, "pointer"), KernelParam(8, 8, "pointer"), KernelParam(16, 8, "pointer"), KernelParam(24, 4, "scalar")),
        28,
    )
    nbytes = 4 * n
    stride = _align(nbytes, _ALIGN)
    a_addr, b_addr, c_addr = WINDOW_BASE, WINDOW_BASE + stride, WINDOW_BASE + 2 * stride
    window = _align(3 * stride, _WINDOW_GRANULARITY)
    db = new_database(
        static,
        kernel,
        code_refs,
        device=DeviceInfo("synthetic (no GPU)", (9, 0), 0),
        address_space=AddressSpace("fixed", WINDOW_BASE, window),
        recorder=RecorderInfo("synthetic", "localhost", None, "1970-01-01T00:00:00Z", ("write_vecadd_recording",)),
    )
    args = struct.pack("<QQQi", a_addr, b_addr, c_addr, n)
    grid = (n + block - 1) // block
    dyns = []
    for k in range(instances):
        a, b, c0, c1 = vecadd_arrays(n, seed * 1_000_003 + k)
        db, inst = writer.write_instance(
            db,
            grid=(grid, 1, 1),
            block=(block, 1, 1),
            shared_mem=0,
            args=args,
            pointer_args=(0, 8, 16),
            prologue=[RegionSource(a_addr, "heap", "a", a), RegionSource(b_addr, "heap", "b", b), RegionSource(c_addr, "heap", "c", c0)],
            epilogue=[RegionSource(a_addr, "heap", "a", a), RegionSource(b_addr, "heap", "b", b), RegionSource(c_addr, "heap", "c", c1)],
            launch_index=k,
            occurrence=k,
            commit=False,
        )
        dyns.append(inst.dynamic_hash)
    db = writer.commit(db)
    return SyntheticRecording(store, db.name, static, tuple(dyns))
