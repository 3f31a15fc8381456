"""``mneme ls``: the recordings of a store, their instances, sizes and how well the shared chunks deduplicate them."""

from __future__ import annotations

from dataclasses import dataclass

from mneme.format.layout import CHUNKS_DIR
from mneme.store.contents import Location, database_names, existing_store, list_info, read_recording
from mneme.store.retry import RetryPolicy, with_retries


@dataclass(frozen=True)
class InstanceSummary:
    dynamic_hash: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    captured_bytes: int = 0  # device memory its prologue and epilogue hold
    unsupported: tuple[str, ...] = ()  # why the recorder could not capture it (replay refuses it)


@dataclass(frozen=True)
class RecordingSummary:
    """One recording as ``mneme ls`` shows it."""

    database: str
    kernel: str
    instances: tuple[InstanceSummary, ...]
    logical_bytes: int
    unique_chunk_bytes: int
    chunk_count: int

    @property
    def dedupe_ratio(self) -> float:
        return self.logical_bytes / self.unique_chunk_bytes if self.unique_chunk_bytes else 0.0

    @property
    def largest_instance_bytes(self) -> int:
        return max((i.captured_bytes for i in self.instances), default=0)

    @property
    def unsupported_count(self) -> int:
        return sum(1 for i in self.instances if i.unsupported)


@dataclass(frozen=True)
class StoreSummary:
    """All recordings of a store and how well the shared chunks deduplicate them.

    ``dedupe_ratio`` = logical bytes (every snapshot's memory, prologues and
    epilogues of every instance) / bytes of the stored chunks they reference
    (compressed, each counted once).
    """

    url: str
    recordings: tuple[RecordingSummary, ...]
    logical_bytes: int
    stored_chunk_bytes: int
    chunk_count: int

    @property
    def dedupe_ratio(self) -> float:
        return self.logical_bytes / self.stored_chunk_bytes if self.stored_chunk_bytes else 0.0


def summarize(store_or_url: Location, retry: RetryPolicy = RetryPolicy()) -> StoreSummary:
    """Read every database and snapshot manifest of a store and size what they use."""
    store = existing_store(store_or_url)
    sizes = {info.name: info.size for info in with_retries(lambda: list(list_info(store, CHUNKS_DIR + "/")), retry)}
    summaries = []
    all_chunks: set[str] = set()
    for name in with_retries(lambda: database_names(store), retry):
        contents = read_recording(store, name, retry)
        chunk_names = contents.chunk_names
        all_chunks |= chunk_names
        db = contents.database
        instances = tuple(
            InstanceSummary(i.dynamic_hash, (i.grid.x, i.grid.y, i.grid.z), (i.block.x, i.block.y, i.block.z),
                            i.shared_mem, contents.instance_bytes.get(i.dynamic_hash, 0), i.unsupported)
            for i in sorted(db.instances.values(), key=lambda i: (i.launch_index, i.dynamic_hash))
        )
        summaries.append(RecordingSummary(
            name, db.kernel.demangled or db.kernel.name, instances, contents.logical_bytes,
            sum(sizes.get(c, 0) for c in chunk_names), len(chunk_names),
        ))
    return StoreSummary(store.url, tuple(summaries), sum(s.logical_bytes for s in summaries),
                        sum(sizes.get(c, 0) for c in all_chunks), len(all_chunks))
