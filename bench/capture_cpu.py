"""The agent's CPU side of capture, without a GPU: per-core cost of each stage of storing fresh snapshot data.

Snapshot-like data is written to raw files as the recorder's spool holds
them, then stored as chunks into a recording directory, side by side in one run:

* each stage alone on one 4 MiB piece, one thread and all threads: reading
  from the page cache (``preadv`` into a buffer, and a mapped piece's first
  touch, as the agent reads), xxh3-128, SHA-256 (version 1 chunk names),
  BLAKE3 (version 2), the compression probe + raw frame parts, zstd levels 1
  and 3, and writing one raw chunk object (create, one ``writev``, rename);
* ``put_many`` on a first snapshot (every byte new) with SHA-256 and with
  BLAKE3 chunk names, one thread (per-core cost: the thread's CPU time, in
  ns per byte per stage) and all threads; and a repeated snapshot (an
  iterative program's next instance: the same bytes but the float fields,
  named from the index);
* the Python each piece runs between its stages, with the GIL held: every
  call that releases the GIL (hashes, compression, system calls) stubbed out,
  one thread, the least of the runs; 4 MiB over that time is the most the
  GIL lets any number of threads store.

Two kinds of data: ``mix`` (quarters: float64 noise, a smooth float32 field,
int32 indices, zeros: an iterative solver's memory) and ``stencil`` (the
float32 field of bench/apps/stencil_app.cu: what the fresh-data case of
bench/record_overhead.py records). The per-core cost predicts the rate on a
bigger host: ``--predict-cores`` cores at that cost each, scaling ideally
(page-cache writes and BLAKE3 scale with threads; memory bandwidth and SMT
siblings are what can make it less).

    python bench/capture_cpu.py [--gb 0.5] [--threads N] [--dir DIR] [--predict-cores 16] [--results FILE]

``--dir`` is where the snapshot files and the recording go (default: the
system's temporary directory; /dev/shm measures the CPU alone, without the
disk's write-back).
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_file import write_section  # noqa: E402

import mneme.format.chunks as chunks_module  # noqa: E402
import mneme.format.frames as frames_module  # noqa: E402
import mneme.store.local as local_module  # noqa: E402
from mneme.format.capture import ContentIndex, PipelineStats, fingerprint  # noqa: E402
from mneme.format.chunks import DEFAULT_CHUNK_SIZE, FileSlice, compress_chunk, default_workers, put_many  # noqa: E402
from mneme.format.content_hash import chunk_digest  # noqa: E402
from mneme.format.frames import frame_parts, raw_frame_parts  # noqa: E402
from mneme.store import LocalStore  # noqa: E402

PIECE = DEFAULT_CHUNK_SIZE
STAGES = ("read", "fingerprint", "hash", "compress", "write")


def smooth_field(nbytes: int, seed: int) -> bytes:
    """float32 planes of sin x cos, shifted by ``seed`` (a smooth field that zstd shrinks by 10-20%)."""
    side = 1024
    s = 6.2831853 / side
    x = np.arange(side, dtype=np.float32)
    plane = (np.sin(s * x)[None, :] * np.cos(s * x)[:, None]).astype(np.float32)
    planes = nbytes // plane.nbytes + 1
    return np.concatenate([(plane + 0.001 * (k + 1000 * seed)).ravel() for k in range(planes)]).tobytes()[:nbytes]


def stencil_field(nbytes: int, seed: int) -> bytes:
    """The initial field of bench/apps/stencil_app.cu (N=580), ``seed`` sweeps of smoothing later (roughly)."""
    n = 580
    s = np.float32(6.2831853 / n)
    i = np.arange(n, dtype=np.float32)
    out, k = [], 0
    while sum(len(b) for b in out) < nbytes:
        ks = np.arange(k, k + 8, dtype=np.float32) % n
        v = np.sin(s * i)[None, None, :] * np.cos(s * i)[None, :, None] + 0.5 * np.sin(2 * s * ks)[:, None, None]
        di, dj, dk = i[None, None, :] - n // 3, i[None, :, None] - n // 2, ks[:, None, None] - n // 2
        v = v + np.where(di * di + dj * dj + dk * dk < (n // 8) ** 2, np.float32(10), np.float32(0))
        out.append((v * np.float32(1 - 1e-3 * seed)).astype(np.float32).tobytes())
        k += 8
    return b"".join(out)[:nbytes]


def snapshot_file(path: Path, nbytes: int, seed: int, kind: str = "mix") -> None:
    """Write ``nbytes`` of snapshot data; ``seed`` changes the float fields (the next instance's state).

    ``mix``: quarters of float64 noise (zstd keeps ~95%), a smooth float32 field (~85%), int32 indices and
    zeros; the indices and zeros repeat across seeds. ``stencil``: the stencil's float32 field throughout.
    """
    if kind == "stencil":
        path.write_bytes(stencil_field(nbytes, seed))
        return
    quarter = nbytes // 4 // PIECE * PIECE
    with open(path, "wb") as f:
        f.write(np.random.default_rng(seed).standard_normal(quarter // 8).tobytes())
        f.write(smooth_field(quarter, seed))
        f.write((np.arange(quarter // 4, dtype=np.int32) // 27).tobytes())
        f.write(bytes(nbytes - 3 * quarter))


def stage_rates(tmp: Path, threads: int, reps: int, repeats: int) -> list[tuple[str, float, float]]:
    """GB/s of each stage alone on 4 MiB pieces (the best of ``repeats``): one thread, ``threads`` threads."""
    noise = np.random.default_rng(0).standard_normal(PIECE // 8).tobytes()
    smooth = smooth_field(PIECE, 0)
    indices = (np.arange(PIECE // 4, dtype=np.int32) // 27).tobytes()
    source = tmp / "stage-read.bin"
    source.write_bytes(noise * 16)
    fd = os.open(source, os.O_RDONLY)
    store = LocalStore(tmp / "stage-store", durability="none")
    counter = iter(range(10**9))
    local = threading.local()

    def read(_: bytes) -> None:
        if not hasattr(local, "buf"):
            local.buf = bytearray(PIECE)  # reused, as the agent's readers do where a file cannot be mapped
        os.preadv(fd, [local.buf], (next(counter) % 16) * PIECE)

    def map_and_touch(_: bytes) -> None:
        # A fresh mapping of one piece, its pages faulted in by xxh3 (the agent maps a stripe once, the
        # fingerprint's read brings the pages in): the page cache read in place.
        mapping = mmap.mmap(fd, PIECE, prot=mmap.PROT_READ, offset=(next(counter) % 16) * PIECE)
        view = memoryview(mapping)
        fingerprint(view)
        view.release()
        mapping.close()

    def write(b: bytes) -> None:
        store.put_parts(f"chunks/{next(counter) % 256:02x}/{next(counter):064x}", raw_frame_parts(b))

    stages = [
        ("read (preadv into a buffer, page cache)", read, noise),
        ("read (mapped, first touch by xxh3)", map_and_touch, noise),
        ("xxh3-128 (index)", fingerprint, noise),
        ("SHA-256 (version 1 names)", lambda b: chunk_digest(b, "sha256"), noise),
        ("BLAKE3 (version 2 names)", lambda b: chunk_digest(b, "blake3"), noise),
        ("probe + raw frame parts (noise)", lambda b: frame_parts(b, 3), noise),
        ("zstd level 1 (smooth field)", lambda b: compress_chunk(b, 1), smooth),
        ("zstd level 3 (indices)", lambda b: compress_chunk(b, 3), indices),
        ("write one raw chunk object (writev)", write, noise),
    ]

    def rate(fn, sample: bytes, n_threads: int) -> float:
        fn(sample)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(n_threads) as pool:
                list(pool.map(lambda _: fn(sample), range(reps)))
            best = min(best, time.perf_counter() - t0)
        return reps * len(sample) / best / 1e9

    try:
        return [(name, rate(fn, sample, 1), rate(fn, sample, threads)) for name, fn, sample in stages]
    finally:
        os.close(fd)


def store_file(root: Path, path: Path, workers: int, algorithm: str, index: ContentIndex | None = None) -> tuple[float, PipelineStats]:
    """Store ``path`` as chunks into ``root``; (wall seconds, stats)."""
    stats = PipelineStats()
    t0 = time.perf_counter()
    put_many(LocalStore(root, durability="none"), [FileSlice(path)], PIECE, index=index if index is not None else ContentIndex(),
             stats=stats, workers=workers, algorithm=algorithm)
    return time.perf_counter() - t0, stats


def per_byte(stats: PipelineStats) -> dict[str, float]:
    """Thread-nanoseconds per offered byte, per stage."""
    return {stage: getattr(stats, f"{stage}_s") / stats.bytes * 1e9 for stage in STAGES}


def least_cost(root: Path, path: Path, algorithm: str, repeats: int) -> dict[str, float]:
    """Per-stage CPU cost of one thread storing ``path`` afresh [ns per byte], the least of ``repeats`` runs.

    One thread runs every piece in the calling thread, so its CPU time
    (``time.thread_time``: user and system, not the time other processes held
    the core) is the pipeline's own; each stage gets its share of it by its
    share of the wall time. On a shared machine other processes only ever add
    time, so the least run is the closest to the stages' own cost.
    """
    best: dict[str, float] | None = None
    for k in range(repeats):
        cpu0 = time.thread_time()
        _, stats = store_file(root / f"{algorithm}-{k}", path, 1, algorithm)
        cpu = (time.thread_time() - cpu0) / stats.bytes * 1e9
        shutil.rmtree(root / f"{algorithm}-{k}")
        wall = per_byte(stats)
        cost = {stage: cpu * ns / sum(wall.values()) for stage, ns in wall.items()}
        if best is None or sum(cost.values()) < sum(best.values()):
            best = cost
    assert best is not None
    return best


class _NoStat:
    """``os.path`` without the ``stat`` of ``isfile`` (no object exists)."""

    def __getattr__(self, name):
        return getattr(os.path, name)

    @staticmethod
    def isfile(path) -> bool:
        return False


class _NoSyscalls:
    """``os`` for mneme.store.local without the system calls of a write (they release the GIL)."""

    path = _NoStat()

    def __getattr__(self, name):
        return getattr(os, name)

    def open(self, *args, **kwargs) -> int:
        return -1

    def writev(self, fd, buffers) -> int:
        return sum(memoryview(b).nbytes for b in buffers)

    def close(self, fd) -> None:
        pass

    def replace(self, src, dst) -> None:
        pass

    def makedirs(self, *args, **kwargs) -> None:
        pass


def python_per_piece(repeats: int, pieces: int = 2000) -> float:
    """Seconds of Python (GIL held) per 4 MiB piece of ``put_many`` into a local store, the least of ``repeats``.

    Every call that releases the GIL is stubbed out: the chunk hash and the fingerprint (distinct made-up
    digests), the probe's compression (incompressible: raw frames) and the file system calls. What is
    left runs with the GIL held whatever the number of threads.
    """
    names = itertools.count()

    class Incompressible:
        def compress(self, data) -> bytes:
            return bytes(len(data))

    buffer = memoryview(bytearray(PIECE))
    best = float("inf")
    with mock.patch.object(chunks_module, "chunk_digest", lambda data, algorithm: f"{next(names):064x}"), \
            mock.patch.object(chunks_module, "fingerprint", lambda data: next(names).to_bytes(16, "little")), \
            mock.patch.object(frames_module, "_compressor", lambda level: Incompressible()), \
            mock.patch.object(local_module, "os", _NoSyscalls()):
        for _ in range(repeats):
            store = LocalStore(tempfile.gettempdir(), durability="none")
            t0 = time.thread_time()
            put_many(store, [buffer] * pieces, PIECE, index=ContentIndex(), workers=1)
            best = min(best, (time.thread_time() - t0) / pieces)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=0.5, help="snapshot size in GB (default 0.5)")
    ap.add_argument("--threads", type=int, default=default_workers(), help="pool threads (default: every CPU)")
    ap.add_argument("--dir", default=None, help="where the files and the recording go (default: the temporary directory)")
    ap.add_argument("--data", default="mix,stencil", help="data kinds, comma-separated: mix, stencil")
    ap.add_argument("--predict-cores", type=int, default=16, help="cores of the host to predict the rate of (default 16)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each measurement; the best counts (default 3)")
    ap.add_argument("--results", help="also write the tables into this markdown file (its 'capture CPU' section)")
    args = ap.parse_args()
    nbytes = int(args.gb * 1e9) // PIECE * PIECE
    out: list[str] = []

    def emit(line: str = "") -> None:
        print(line)
        out.append(line)

    with tempfile.TemporaryDirectory(prefix="mneme-capture-cpu-", dir=args.dir) as tmp:
        tmp_path = Path(tmp)
        emit(f"Stages alone on {PIECE >> 20} MiB pieces, GB/s of wall time, the best of {args.repeats} runs (into "
             f"{tmp_path.parent}; on a shared machine other processes' load shows here, not in the CPU costs below):\n")
        emit(f"| stage | 1 thread | {args.threads} threads |")
        emit("| --- | --- | --- |")
        for name, one, many in stage_rates(tmp_path, args.threads, 4 * max(args.threads, 4), args.repeats):
            emit(f"| {name} | {one:.2f} | {many:.2f} |")
        emit()
        emit(f"Storing a {nbytes / 1e9:.2f} GB snapshot file as chunks: per-stage CPU cost of one thread [ns per byte; "
             f"the least of {args.repeats} runs], its per-core rate, the rate predicted for {args.predict_cores} cores "
             f"(ideal scaling) and measured with {args.threads} threads here (the best run), and a repeated snapshot "
             f"(float fields changed) with {args.threads} threads:\n")
        emit("| data | chunk names | read | xxh3 | hash | probe + compress | write | per core GB/s | "
             f"{args.predict_cores} cores GB/s (predicted) | {args.threads} threads GB/s | stored / offered | repeated GB/s |")
        emit("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for kind in [k for k in args.data.split(",") if k]:
            first, second = tmp_path / f"{kind}-first.bin", tmp_path / f"{kind}-second.bin"
            snapshot_file(first, nbytes, 0, kind)
            snapshot_file(second, nbytes, 1, kind)
            for algorithm, label in (("sha256", "SHA-256 (v1)"), ("blake3", "BLAKE3 (v2)")):
                cost = least_cost(tmp_path / f"one-{kind}", first, algorithm, args.repeats)
                per_core = 1 / sum(cost.values())
                wall = wall2 = float("inf")
                for k in range(args.repeats):
                    index = ContentIndex()
                    root = tmp_path / f"many-{kind}-{algorithm}-{k}"
                    w, many = store_file(root, first, args.threads, algorithm, index)
                    w2, _ = store_file(root, second, args.threads, algorithm, index)
                    wall, wall2 = min(wall, w), min(wall2, w2)
                    shutil.rmtree(root)
                emit(f"| {kind} | {label} | {cost['read']:.3f} | {cost['fingerprint']:.3f} | {cost['hash']:.3f} | "
                     f"{cost['compress']:.3f} | {cost['write']:.3f} | {per_core:.2f} | {per_core * args.predict_cores:.1f} | "
                     f"{nbytes / wall / 1e9:.2f} | {many.stored_bytes / many.bytes:.2f} | {nbytes / wall2 / 1e9:.2f} |")
            first.unlink()
            second.unlink()
    python_s = python_per_piece(args.repeats)
    emit()
    emit(f"Python per {PIECE >> 20} MiB piece, GIL held (every call that releases it stubbed out; the least of "
         f"{args.repeats} runs): {python_s * 1e6:.1f} us, {python_s / PIECE * 1e9:.4f} ns per byte: the GIL lets "
         f"any number of threads store at most {PIECE / python_s / 1e9:.0f} GB/s.")
    if args.results:
        write_section(args.results, f"capture CPU, {os.cpu_count()} CPUs (bench/capture_cpu.py)", "\n".join(out),
                      heading="Recording cost: measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
