"""Synthetic recordings for the replay tests: real kernels, host-made memory, host-computed epilogues.

Each builder writes a complete recording (through ``mneme.format.writer``) into
a directory and returns the path of its database. The code is real nvcc output
(``mneme.testing.vecadd_code`` and ``data/kernels.{ptx,sm_90.cubin}``), the
regions sit in the recorder's fixed window at its default base, 0x200000000000
(or, for the relocatable variant, at driver addresses in the mmap zone), and the epilogue is what the kernel must
produce, computed here with numpy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mneme.format.database import AddressSpace, DeviceInfo, KernelParam, KernelSignature
from mneme.format.hashing import static_hash
from mneme.format.policy import VerifyPolicy
from mneme.format.writer import RecordingWriter, RegionSource, new_database
from mneme.recording.window import DEFAULT_VA_BASE
from mneme.store import open_store
from mneme.testing import vecadd_code

DATA = Path(__file__).parent / "data"
WINDOW = DEFAULT_VA_BASE
WINDOW_SIZE = 1 << 30
MIB2 = 2 << 20


@dataclass(frozen=True)
class Kernel:
    name: str
    ptx: str
    cubin: bytes
    params: tuple[KernelParam, ...]
    param_buffer_size: int


def kernels_module() -> tuple[str, bytes]:
    return (DATA / "kernels.ptx").read_text(), (DATA / "kernels.sm_90.cubin").read_bytes()


def _kernel(name: str, params: tuple[KernelParam, ...], size: int) -> Kernel:
    ptx, cubin = kernels_module()
    return Kernel(name, ptx, cubin, params, size)


def vecadd_kernel() -> Kernel:
    params = (KernelParam(0, 8, "pointer"), KernelParam(8, 8, "pointer"), KernelParam(16, 8, "pointer"),
              KernelParam(24, 4, "scalar"))  # fmt: skip
    return Kernel(vecadd_code.KERNEL_NAME, vecadd_code.PTX, vecadd_code.CUBIN, params, 28)


def _write(
    directory: Path,
    kernel: Kernel,
    *,
    grid: int,
    block: int,
    args: bytes,
    prologue: list[RegionSource],
    epilogue: list[RegionSource],
    mode: str = "fixed",
    app_kernel_time_ns: int | None = None,
) -> Path:
    store = open_store(str(directory))
    writer = RecordingWriter(store)
    static = static_hash(kernel.name, kernel.ptx)
    code = writer.write_code(static, ptx=kernel.ptx, cubin=kernel.cubin, arch="sm_90")
    db = new_database(
        static,
        KernelSignature(kernel.name, kernel.name, kernel.params, kernel.param_buffer_size),
        code,
        device=DeviceInfo("NVIDIA H100 80GB HBM3", (9, 0), 0),
        address_space=AddressSpace(mode, WINDOW, WINDOW_SIZE),
    )
    pointer_args = [p.offset for p in kernel.params if p.kind == "pointer"]
    db, _ = writer.write_instance(
        db, grid=(grid, 1, 1), block=(block, 1, 1), shared_mem=0, args=args,
        prologue=prologue, epilogue=epilogue, pointer_args=pointer_args,
        app_kernel_time_ns=app_kernel_time_ns,
    )  # fmt: skip
    return directory / db.name


def vecadd(
    directory: Path,
    n: int = 1 << 20,
    block: int = 256,
    *,
    base: int = WINDOW,
    mode: str = "fixed",
    perturb: float = 0.0,
    app_kernel_time_ns: int | None = None,
) -> Path:
    """c = a + b over n floats; c starts as garbage (the recorder snapshots it as it was).

    ``perturb`` scales the recorded result by (1 + perturb): a recording of a
    "nondeterministic" kernel that only verifies under a tolerance policy.
    """
    rng = np.random.default_rng(1)
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    c0 = np.full(n, 12345.0, dtype=np.float32)
    c1 = a + b
    if perturb:
        c1 = (c1 * np.float32(1 + perturb)).astype(np.float32)
    nbytes = n * 4
    stride = -(-nbytes // MIB2) * MIB2
    pa, pb, pc = base, base + stride, base + 2 * stride
    args = struct.pack("<QQQi", pa, pb, pc, n)
    regions = lambda c: [  # noqa: E731
        RegionSource(pa, "heap", "a", data=a.tobytes()),
        RegionSource(pb, "heap", "b", data=b.tobytes()),
        RegionSource(pc, "heap", "c", data=c.tobytes()),
    ]
    grid = -(-n // block)
    return _write(directory, vecadd_kernel(), grid=grid, block=block, args=args,
                  prologue=regions(c0), epilogue=regions(c1), mode=mode,
                  app_kernel_time_ns=app_kernel_time_ns)  # fmt: skip


AXPY_PARAMS = (KernelParam(0, 8, "pointer"), KernelParam(8, 8, "pointer"), KernelParam(16, 4, "scalar"),
               KernelParam(20, 4, "scalar"), KernelParam(24, 8, "pointer"))  # fmt: skip


def axpy_count(directory: Path, n: int = 100_000, block: int = 128, alpha: float = 1.5,
               tolerance: VerifyPolicy | None = None) -> Path:  # fmt: skip
    """In place (x = x*alpha + y) and atomic (a counter): every replayed launch must start from the prologue."""
    rng = np.random.default_rng(2)
    # Quarter-integers: x*alpha+y is exact in float32, so the GPU's FMA and numpy agree bit for bit.
    x0 = (rng.integers(-400, 400, n) / 4).astype(np.float32)
    y = (rng.integers(-400, 400, n) / 4).astype(np.float32)
    x1 = (x0 * np.float32(alpha) + y).astype(np.float32)
    counter0 = np.array([7], dtype=np.uint32)
    counter1 = counter0 + np.uint32(n)
    px, py, pcnt = WINDOW, WINDOW + MIB2, WINDOW + 2 * MIB2
    args = struct.pack("<QQfiQ", px, py, alpha, n, pcnt)
    pro = [RegionSource(px, "heap", "x", data=x0.tobytes(), policy=tolerance),
           RegionSource(py, "heap", "y", data=y.tobytes()),
           RegionSource(pcnt, "heap", "counter", data=counter0.tobytes())]  # fmt: skip
    epi = [RegionSource(px, "heap", "x", data=x1.tobytes(), policy=tolerance),
           RegionSource(py, "heap", "y", data=y.tobytes()),
           RegionSource(pcnt, "heap", "counter", data=counter1.tobytes())]  # fmt: skip
    kernel = _kernel("axpy_count", AXPY_PARAMS, 32)
    return _write(directory, kernel, grid=-(-n // block), block=block, args=args, prologue=pro, epilogue=epi)


def scale_by_global(directory: Path, n: int = 5000, block: int = 64, *, global_scale_addr: int = 0x7E0000001000,
                    global_hits_addr: int = 0x7E0000001010) -> Path:  # fmt: skip
    """Module globals: g_scale is read, g_hits counts; their recorded addresses are the app's, not ours."""
    scale = np.array([3, -1, 7, 2], dtype=np.int32)
    hits0 = np.array([100], dtype=np.uint32)
    out0 = np.zeros(n, dtype=np.int32)
    idx = np.arange(n, dtype=np.int64)
    out1 = (idx * scale[idx & 3]).astype(np.int32)
    pout = WINDOW
    args = struct.pack("<Qi", pout, n)
    def regions(out, hits):  # noqa: E306
        return [RegionSource(pout, "heap", "out", data=out.tobytes()),
                RegionSource(global_scale_addr, "global", "g_scale", data=scale.tobytes()),
                RegionSource(global_hits_addr, "global", "g_hits", data=hits.tobytes())]  # fmt: skip
    params = (KernelParam(0, 8, "pointer"), KernelParam(8, 4, "scalar"))
    kernel = _kernel("scale_by_global", params, 12)
    return _write(directory, kernel, grid=-(-n // block), block=block, args=args,
                  prologue=regions(out0, hits0), epilogue=regions(out1, hits0 + np.uint32(n)))  # fmt: skip


def gather_sum(directory: Path, n_nodes: int = 64, *, base: int = 0x7F4000000000, mode: str = "relocatable") -> Path:
    """Pointers in memory: node i points at a slice of a data buffer; relocation must rewrite them."""
    rng = np.random.default_rng(3)
    counts = rng.integers(1, 50, n_nodes)
    data = rng.integers(-8, 8, int(counts.sum())).astype(np.float32)  # small integers: sums are exact
    pdata, pnodes, pout = base, base + MIB2, base + 2 * MIB2
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    nodes = b"".join(struct.pack("<Qii", pdata + 4 * int(o), int(c), 0) for o, c in zip(offsets, counts))
    out0 = np.zeros(n_nodes, dtype=np.float32)
    out1 = np.array([data[o : o + c].sum() for o, c in zip(offsets, counts)], dtype=np.float32)
    args = struct.pack("<QiiQ", pnodes, n_nodes, 0, pout)
    def regions(out):  # noqa: E306
        return [RegionSource(pdata, "heap", "data", data=data.tobytes()),
                RegionSource(pnodes, "heap", "nodes", data=nodes),
                RegionSource(pout, "heap", "out", data=out.tobytes())]  # fmt: skip
    params = (KernelParam(0, 8, "pointer"), KernelParam(8, 4, "scalar"), KernelParam(16, 8, "pointer"))
    kernel = _kernel("gather_sum", params, 24)
    return _write(directory, kernel, grid=1, block=64, args=args, prologue=regions(out0), epilogue=regions(out1),
                  mode=mode)  # fmt: skip


def vecadd_wild_pointer(directory: Path, n: int = 4096) -> Path:
    """A launch whose output pointer points at nothing mapped: replaying it faults (illegal address)."""
    a = np.ones(n, dtype=np.float32)
    pa, pb = WINDOW, WINDOW + MIB2
    wild = 0x100000000000  # never mapped by the replay
    args = struct.pack("<QQQi", pa, pb, wild, n)
    regions = [RegionSource(pa, "heap", "a", data=a.tobytes()), RegionSource(pb, "heap", "b", data=a.tobytes())]
    return _write(directory, vecadd_kernel(), grid=-(-n // 256), block=256, args=args,
                  prologue=regions, epilogue=regions)  # fmt: skip


def hang(directory: Path) -> Path:
    """A launch that never ends (it waits for a flag nobody sets): the replay's timeout must stop waiting."""
    flag = np.zeros(1, dtype=np.int32)
    regions = [RegionSource(WINDOW, "heap", "flag", data=flag.tobytes())]
    kernel = _kernel("hang_until", (KernelParam(0, 8, "pointer"),), 8)
    return _write(directory, kernel, grid=1, block=1, args=struct.pack("<Q", WINDOW),
                  prologue=regions, epilogue=regions)  # fmt: skip
