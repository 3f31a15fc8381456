#!/usr/bin/env python3
"""Artifact-store throughput: upload and download of an iterative solver's recording, and its dedupe ratio.

The recording is synthetic but shaped like a conjugate-gradient solver's: one
kernel launched once per iteration over a sparse matrix (CSR values, column
indices, row pointers: the same every iteration) and four vectors (x, r, p,
Ap: rewritten every iteration). Prologue and epilogue of every iteration are
recorded, so almost all memory repeats; the content-addressed chunks store it
once. The S3 side is a moto server process on loopback (the same server the
tests use), reached through the minio client over HTTP, so absolute numbers
are bounded by moto (a Python server), not by the network; the ratios in the
table (parallel vs serial, incremental vs full) are what carries over.

    python bench/store_throughput.py                 # ~400 MiB of recorded memory
    python bench/store_throughput.py --scale 4       # 4x the matrix and vectors
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # an installed mneme wins over the checkout


from mneme.format.database import KernelParam, KernelSignature  # noqa: E402
from mneme.format.hashing import static_hash  # noqa: E402
from mneme.format.writer import RecordingWriter, RegionSource, new_database  # noqa: E402
from mneme.store import LocalStore  # noqa: E402
from mneme.store.config import S3Settings  # noqa: E402
from mneme.store.s3 import S3Store  # noqa: E402
from mneme.store.summary import summarize  # noqa: E402
from mneme.store.transfer import pull, push  # noqa: E402
from mneme.testing.moto_s3 import start_moto_server, stop  # noqa: E402

BASE = 0x7F0000000000
MiB = 1 << 20


def write_solver_recording(directory: Path, scale: float, iterations: int, seed: int = 0) -> int:
    """A CG-like recording; returns the number of bytes of recorded memory (prologues + epilogues)."""
    rng = np.random.default_rng(seed)
    rows = int(256 * 1024 * scale)
    per_row = 7  # a 3-D 7-point stencil
    values = rng.standard_normal(rows * per_row)
    columns = (np.arange(rows, dtype=np.int32)[:, None] + np.array([-4096, -64, -1, 0, 1, 64, 4096], dtype=np.int32))
    columns = np.clip(columns, 0, rows - 1).astype(np.int32).ravel()
    row_ptr = (np.arange(rows + 1, dtype=np.int32) * per_row)
    vectors = {name: rng.standard_normal(rows) for name in ("x", "r", "p", "Ap")}
    constant = [("values", values.tobytes()), ("columns", columns.tobytes()), ("row_ptr", row_ptr.tobytes())]

    store = LocalStore(directory)
    writer = RecordingWriter(store)
    ptx = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry cg_step() { ret; }\n"
    sh = static_hash("cg_step", ptx)
    code = writer.write_code(sh, ptx=ptx)
    pointers = tuple(KernelParam(8 * i, 8, "pointer") for i in range(7))
    signature = KernelSignature("cg_step", "cg_step(...)", pointers, 56)
    db = new_database(sh, signature, code)

    def regions(vecs: dict[str, np.ndarray]) -> list[RegionSource]:
        out, address = [], BASE
        for name, data in constant + [(n, v.tobytes()) for n, v in vecs.items()]:
            out.append(RegionSource(address, "heap", name, data=data))
            address += (len(data) + MiB - 1) // MiB * MiB
        return out

    recorded = 0
    for it in range(iterations):
        before = {n: v.copy() for n, v in vectors.items()}
        vectors["Ap"] = vectors["p"] * 1.5 + 0.25  # one step rewrites every vector
        vectors["x"] = vectors["x"] + 0.1 * vectors["p"]
        vectors["r"] = vectors["r"] - 0.1 * vectors["Ap"]
        vectors["p"] = vectors["r"] + 0.5 * vectors["p"]
        args = struct.pack("<7Q", *(BASE + i * MiB for i in range(7)))
        prologue, epilogue = regions(before), regions(vectors)
        recorded += sum(len(r.data) for r in prologue + epilogue)
        db, _ = writer.write_instance(db, grid=(rows // 256, 1, 1), block=(256, 1, 1), shared_mem=0, args=args,
                                      prologue=prologue, epilogue=epilogue, pointer_args=tuple(range(0, 56, 8)),
                                      launch_index=it, occurrence=it, commit=False)
    writer.commit(db)
    return recorded


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="matrix/vector size factor (1: 256k rows)")
    parser.add_argument("--iterations", type=int, default=8, help="recorded solver iterations (instances)")
    parser.add_argument("--workers", type=int, default=8, help="parallel transfers of the parallel runs")
    args = parser.parse_args()

    from minio import Minio

    workdir = Path(tempfile.mkdtemp(prefix="mneme-bench-store-"))
    proc, endpoint = start_moto_server(workdir)
    try:
        settings = S3Settings(endpoint=endpoint, access_key_id="bench", secret_access_key="bench-secret",
                              region="us-east-1", source="bench")
        Minio(settings.host, "bench", "bench-secret", secure=False, region="us-east-1").make_bucket("bench")
        source = workdir / "recording"
        t0 = time.perf_counter()
        recorded = write_solver_recording(source, args.scale, args.iterations)
        record_s = time.perf_counter() - t0
        stored = directory_bytes(source)

        rows = []

        def measure(label: str, action) -> None:
            start = time.perf_counter()
            report = action()
            seconds = time.perf_counter() - start
            rows.append((label, seconds, report.bytes_copied / MiB, report.bytes_copied / seconds / MiB,
                         f"{report.chunks_copied} sent, {report.chunks_present} present"))

        serial = S3Store("s3://bench/serial", settings)
        parallel = S3Store("s3://bench/parallel", settings)
        measure("upload, 1 worker", lambda: push(source, serial, workers=1, progress=False))
        measure(f"upload, {args.workers} workers", lambda: push(source, parallel, workers=args.workers,
                                                                progress=False))
        measure("upload again (nothing new)", lambda: push(source, parallel, progress=False))
        measure("upload after kill (--resume)", lambda: _resume(source, parallel, args.workers))
        for workers, label in ((1, "download, 1 worker"), (args.workers, f"download, {args.workers} workers")):
            target = workdir / f"pulled-{workers}"
            measure(label, lambda: pull(parallel, target, workers=workers, progress=False))
        summary = summarize(parallel)

        print(f"\nstore throughput: CG-like recording, {args.iterations} iterations, "
              f"{recorded / MiB:.0f} MiB of recorded memory, {stored / MiB:.1f} MiB stored "
              f"(written locally in {record_s:.1f} s); S3 = moto server on loopback\n")
        print(f"{'operation':<32} {'seconds':>8} {'MiB moved':>10} {'MiB/s':>8}  chunks")
        print("-" * 86)
        for label, seconds, moved, rate, chunks in rows:
            print(f"{label:<32} {seconds:>8.2f} {moved:>10.1f} {rate:>8.1f}  {chunks}")
        print("-" * 86)
        print(f"parallel/serial speed-up: upload {rows[0][1] / rows[1][1]:.2f}x, "
              f"download {rows[4][1] / rows[5][1]:.2f}x; unchanged re-push: {rows[2][1] * 1000:.0f} ms")
        print(f"dedupe ratio (recorded memory / stored chunk bytes): {summary.dedupe_ratio:.1f}x "
              f"({summary.logical_bytes / MiB:.0f} MiB in {summary.chunk_count} chunks of "
              f"{summary.stored_chunk_bytes / MiB:.1f} MiB)")
    finally:
        stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _resume(source: Path, destination: S3Store, workers: int):
    """Simulate a transfer killed after half the chunks: remove the database and half the chunks, resume."""
    names = list(destination.list())
    chunks = [n for n in names if n.startswith("chunks/")]
    for name in [n for n in names if n.endswith(".json")] + chunks[::2]:
        destination.delete(name)
    return push(source, destination, resume=True, workers=workers, progress=False)


if __name__ == "__main__":
    from results_file import record_output  # bench/results/NAME.md

    os.environ.setdefault("MNEME_S3_CONFIG", os.devnull)
    raise SystemExit(record_output("store_throughput", main))
