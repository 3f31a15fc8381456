"""The recording artifact format (docs/format.md): chunks, snapshots, the database, hashes.

Submodules, each with one job:

* ``layout``: object names of a recording directory
* ``hashing``: static and dynamic hash ids
* ``chunks``: content-addressed, compressed, verified chunk storage
* ``policy``: per-region verification policy
* ``snapshot``: the ``.mneme`` snapshot files
* ``objects``: SHA-256-checked references to whole files
* ``database``: the ``<static>.json`` recording database
* ``writer``: the producer side (commit order: chunks, snapshots and code, database)
* ``synthetic``: complete recordings made without a GPU (for tests and examples)
* ``verify``: whole-recording integrity check
"""

from mneme.format.chunks import (
    DEFAULT_CHUNK_SIZE,
    ChunkRef,
    FileSlice,
    put_chunks,
    put_chunks_from_file,
    put_many,
    read_chunks,
    read_chunks_into,
)
from mneme.format.database import (
    DATABASE_VERSION,
    AddressSpace,
    CodeArtifact,
    DeviceInfo,
    InstanceRecord,
    KernelCode,
    KernelParam,
    KernelSignature,
    RecorderInfo,
    RecordingDatabase,
    load_database,
    merge_databases,
    save_database,
)
from mneme.format.hashing import dynamic_hash, static_hash
from mneme.format.objects import ObjectRef
from mneme.format.policy import VerifyPolicy
from mneme.format.snapshot import SNAPSHOT_VERSION, Region, Snapshot, read_snapshot, write_snapshot
from mneme.format.writer import RecordingWriter, RegionSource, new_database

__all__ = [
    "DATABASE_VERSION", "DEFAULT_CHUNK_SIZE", "SNAPSHOT_VERSION",
    "AddressSpace", "ChunkRef", "FileSlice", "CodeArtifact", "DeviceInfo", "InstanceRecord", "KernelCode",
    "KernelParam", "KernelSignature", "ObjectRef", "RecorderInfo", "RecordingDatabase",
    "RecordingWriter", "Region", "RegionSource", "Snapshot", "VerifyPolicy",
    "dynamic_hash", "load_database", "merge_databases", "new_database", "put_chunks",
    "put_chunks_from_file", "put_many", "read_chunks", "read_chunks_into", "read_snapshot",
    "save_database", "static_hash", "write_snapshot",
]  # fmt: skip
