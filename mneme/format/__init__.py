"""The recording artifact format (docs/format.md): chunks, snapshots, the database, hashes.

Submodules, each with one job:

* ``layout``: object names of a recording directory
* ``hashing``: static and dynamic hash ids
* ``chunks``: content-addressed, compressed, verified chunk storage
* ``policy``: per-region verification policy
* ``snapshot``: the ``.mneme`` snapshot files
* ``textures``: texture and surface objects and the CUDA arrays behind them
* ``objects``: SHA-256-checked references to whole files
* ``database``: the ``<static>.json`` recording database
* ``writer``: the producer side (commit order: chunks, snapshots and code, database)
* ``synthetic``: complete recordings made without a GPU (for tests and examples)
* ``verify``: whole-recording integrity check
"""

from importlib import import_module

# The names below come from their submodules when first used (PEP 562): importing one submodule
# (``mneme.format.policy``, say, for a command's option defaults) does not load them all, and with
# them the compression and S3 libraries the chunk store needs.
_EXPORTS = {
    "chunks": ("DEFAULT_CHUNK_SIZE", "ChunkRef", "FileSlice", "put_chunks", "put_chunks_from_file", "put_many",
               "read_chunks", "read_chunks_into"),
    "database": ("DATABASE_VERSION", "AddressSpace", "CodeArtifact", "DeviceInfo", "InstanceRecord", "KernelCode",
                 "KernelParam", "KernelSignature", "RecorderInfo", "RecordingDatabase", "load_database",
                 "merge_databases", "save_database"),
    "hashing": ("dynamic_hash", "static_hash"),
    "objects": ("ObjectRef",),
    "policy": ("VerifyPolicy",),
    "snapshot": ("SNAPSHOT_VERSION", "Region", "Snapshot", "read_snapshot", "write_snapshot"),
    "writer": ("RecordingWriter", "RegionSource", "new_database"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'mneme.format' has no attribute {name!r}")
    value = getattr(import_module(f"mneme.format.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DATABASE_VERSION", "DEFAULT_CHUNK_SIZE", "SNAPSHOT_VERSION",
    "AddressSpace", "ChunkRef", "FileSlice", "CodeArtifact", "DeviceInfo", "InstanceRecord", "KernelCode",
    "KernelParam", "KernelSignature", "ObjectRef", "RecorderInfo", "RecordingDatabase",
    "RecordingWriter", "Region", "RegionSource", "Snapshot", "VerifyPolicy",
    "dynamic_hash", "load_database", "merge_databases", "new_database", "put_chunks",
    "put_chunks_from_file", "put_many", "read_chunks", "read_chunks_into", "read_snapshot",
    "save_database", "static_hash", "write_snapshot",
]  # fmt: skip
