"""The agent's CPU side of capture, without a GPU: hashing, compression, storing chunks (issue 19).

Snapshot-like data (float64 noise, a smooth float32 field, CSR-style int32 indices, zeros;
the mix of an iterative solver's memory) is written to raw files as the
recorder's spool holds them, then stored as chunks into a local recording
directory, side by side in one run:

* each stage alone, one thread and all threads: SHA-256, xxh3-128, zstd level
  3, the compression probe + raw frame;
* ``put_many`` (into a store without per-chunk fsync, as `mneme record` writes) as before issue 19 (every piece SHA-256 hashed and zstd-3
  compressed) and as now (xxh3 index, probe, raw frames), for a first
  snapshot (every byte new) and a repeated one (an iterative program's next
  instance: the same bytes but one field).

    python bench/capture_cpu.py [--gb 2] [--threads N]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import xxhash

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mneme.format.capture import ContentIndex, PipelineStats  # noqa: E402
from mneme.format.chunks import DEFAULT_CHUNK_SIZE, FileSlice, compress_chunk, default_workers, put_many  # noqa: E402
from mneme.format.frames import stored_frame  # noqa: E402
from mneme.store import LocalStore  # noqa: E402

PIECE = DEFAULT_CHUNK_SIZE


def snapshot_file(path: Path, nbytes: int, seed: int) -> None:
    """Quarters: float64 noise (zstd keeps ~95%), a smooth float32 field (a stencil's: ~80%), int32 indices, zeros.

    ``seed`` changes both float fields (an iterative solver's next state); the indices and zeros repeat.
    """
    quarter = nbytes // 4 // PIECE * PIECE
    side = 1024
    s = 6.2831853 / side
    x = np.arange(side, dtype=np.float32)
    plane = (np.sin(s * x)[None, :] * np.cos(s * x)[:, None]).astype(np.float32)
    planes = quarter // plane.nbytes + 1
    with open(path, "wb") as f:
        f.write(np.random.default_rng(seed).standard_normal(quarter // 8).tobytes())
        f.write(np.concatenate([(plane + 0.001 * (k + 1000 * seed)).ravel() for k in range(planes)]).tobytes()[:quarter])
        f.write((np.arange(quarter // 4, dtype=np.int32) // 27).tobytes())
        f.write(bytes(nbytes - 3 * quarter))


def stage_rates(sample: bytes, threads: int, reps: int) -> list[tuple[str, float, float]]:
    def rate(fn, n_threads: int) -> float:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(lambda _: fn(sample), range(reps)))
        return reps * len(sample) / (time.perf_counter() - t0) / 1e9

    stages = [
        ("SHA-256", lambda b: hashlib.sha256(b).digest()),
        ("xxh3-128", xxhash.xxh3_128_digest),
        ("zstd level 3", lambda b: compress_chunk(b, 3)),
        ("probe + raw frame or zstd 3", lambda b: stored_frame(b, 3)),
    ]
    return [(name, rate(fn, 1), rate(fn, threads)) for name, fn in stages]


def old_put(store: LocalStore, path: Path, workers: int) -> None:
    """Before issue 19: every piece SHA-256 hashed, zstd-3 compressed unless stored, one pool per 16 MiB piece."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        def one(start: int) -> None:
            data = os.pread(fd, min(PIECE, size - start), start)
            name = "chunks/" + hashlib.sha256(data).hexdigest()
            if not store.exists(name):
                store.put(name, compress_chunk(data, 3))

        for group in range(0, size, 4 * PIECE):  # the converter called put_chunks_from_file per 16 MiB piece
            with ThreadPoolExecutor(min(workers, 4)) as pool:
                list(pool.map(one, range(group, min(size, group + 4 * PIECE), PIECE)))
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="snapshot size in GB (default 1)")
    ap.add_argument("--threads", type=int, default=default_workers(), help="pool threads (default: every CPU)")
    args = ap.parse_args()
    nbytes = int(args.gb * 1e9) // PIECE * PIECE
    with tempfile.TemporaryDirectory(prefix="mneme-capture-cpu-") as tmp:
        tmp_path = Path(tmp)
        first, second = tmp_path / "first.bin", tmp_path / "second.bin"
        snapshot_file(first, nbytes, 0)
        snapshot_file(second, nbytes, 1)  # the float field changed, the rest repeats
        sample = first.read_bytes()[:PIECE]
        print(f"\nstages on one {PIECE >> 20} MiB piece (float64 noise), GB/s: 1 thread, {args.threads} threads")
        for name, one, many in stage_rates(sample, args.threads, 4 * args.threads):
            print(f"  {name:30s} {one:7.2f} {many:7.2f}")
        print(f"\nstoring a {nbytes / 1e9:.2f} GB snapshot file as chunks ({args.threads} threads), GB/s of snapshot bytes")
        print(f"  {'path':44s} {'first snapshot':>15s} {'repeated snapshot':>18s}")
        old = []
        store = LocalStore(tmp_path / "old", sync=False)  # as mneme record writes now: no fsync per chunk
        for path in (first, second):
            t0 = time.perf_counter()
            old_put(store, path, args.threads)
            old.append(nbytes / (time.perf_counter() - t0) / 1e9)
        print(f"  {'before (SHA-256 + zstd 3 every piece)':44s} {old[0]:15.2f} {old[1]:18.2f}")
        new, stats = [], []
        store, index = LocalStore(tmp_path / "new", sync=False), ContentIndex()
        for path in (first, second):
            s = PipelineStats()
            t0 = time.perf_counter()
            put_many(store, [FileSlice(path)], PIECE, index=index, stats=s, workers=args.threads)
            new.append(nbytes / (time.perf_counter() - t0) / 1e9)
            stats.append(s)
        print(f"  {'now (xxh3 index, probe, raw frames)':44s} {new[0]:15.2f} {new[1]:18.2f}")
        for label, s in zip(("first", "repeated"), stats):
            r = s.rates()
            print(f"    {label}: hashed {s.hashed_bytes / 1e9:.2f} GB, known {s.known_bytes / 1e9:.2f} GB, "
                  f"compressed {s.compressed_bytes / 1e9:.2f} GB, raw {s.raw_bytes / 1e9:.2f} GB, stored {s.stored_bytes / 1e9:.2f} GB; "
                  f"per thread: read {r['read_gb_s_per_thread']:.1f}, hash {r['hash_gb_s_per_thread']:.2f}, "
                  f"compress {r['compress_gb_s_per_thread']:.2f}, write {r['write_gb_s_per_thread']:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
