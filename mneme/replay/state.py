"""The recorded memory state on the device: live regions, pristine copies, expected epilogue.

For every recorded heap buffer and module global the replay keeps

* the live memory the kernel works on (heap: at the recorded addresses when this
  process can reserve them, ``placement``; else relocated, with the reason, unless
  relocation is refused; globals: in the loaded module),
* the expected epilogue, on the device, which verification compares against,
* a pristine prologue copy, only for regions the kernel writes (the prologue
  and epilogue chunk hashes differ); unwritten regions reset from the
  expected copy, which is the same bytes.

Before each launch only the written chunks are copied back; at the start of
each configuration everything is, so a bad configuration that scribbled
elsewhere cannot leak into the next one.

Texture and surface objects, and the CUDA arrays behind them, are recreated by
``mneme.replay.textures``: the arrays join the regions (kind ``array``, ``live``
being the buffer each is copied into after a checked launch), and the objects'
new handles are written into the restored memory before it is uploaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mneme.errors import ArtifactError, RelocationRefusedError
from mneme.format.snapshot import Region, Snapshot
from mneme.replay.placement import ProcessReservations, Unplaceable, process_reservations
from mneme.replay.relocation import Move, RelocationMap, read_values
from mneme.replay.textures import TextureState

ADDRESS_KINDS = ("heap", "global")
#: A relocated heap region keeps its recorded address modulo this.
RELOCATION_ALIGNMENT = 512


@dataclass
class RegionState:
    """One recorded region and its device copies."""

    kind: str
    name: str
    recorded_base: int
    size: int
    policy: Any  # VerifyPolicy | None, as recorded
    written: list[tuple[int, int]]  # (offset, size) spans whose contents the kernel changes
    expected: Any = None  # engine Buffer
    pristine: Any = None  # engine Buffer, only when written
    live: int = 0  # heap: current address (globals: per module)
    # Pointer sites, kept only when the region holds pointers into recorded ranges.
    prologue_bytes: bytearray | None = None
    epilogue_bytes: bytearray | None = None
    # numpy arrays (relocation.RelocationMap.pointer_sites, read_values) once scanned; empty until then.
    prologue_sites: Any = ()
    epilogue_sites: Any = ()
    prologue_values: Any = ()
    epilogue_values: Any = ()

    @property
    def reset_source(self) -> int:
        return (self.pristine or self.expected).ptr

    @property
    def has_pointers(self) -> bool:
        return len(self.prologue_sites) > 0 or len(self.epilogue_sites) > 0

    @property
    def label(self) -> str:
        return self.name or hex(self.recorded_base)


def written_spans(prologue: Region, epilogue: Region, chunk_size: int) -> list[tuple[int, int]]:
    """The byte spans whose chunks differ between prologue and epilogue (merged)."""
    if prologue.size != epilogue.size or len(prologue.chunks) != len(epilogue.chunks):
        return [(0, prologue.size)]
    spans: list[list[int]] = []
    offset = 0
    for a, b in zip(prologue.chunks, epilogue.chunks):
        if a != b:
            if spans and spans[-1][0] + spans[-1][1] == offset:
                spans[-1][1] += a.length
            else:
                spans.append([offset, a.length])
        offset += a.length
    return [(o, s) for o, s in spans]


def pair_regions(
    prologue: Snapshot, epilogue: Snapshot, kinds: tuple[str, ...] = ADDRESS_KINDS
) -> list[tuple[Region, Region]]:
    """Prologue and epilogue regions of ``kinds`` (heap and global), matched by (kind, base, size; an array's shape)."""
    ends = {(r.kind, r.base): r for r in epilogue.regions if r.kind in kinds}
    pairs = []
    for r in prologue.regions:
        if r.kind not in kinds:
            continue
        e = ends.get((r.kind, r.base))
        if e is None or e.size != r.size or e.array != r.array:
            raise ArtifactError(
                f"{prologue.name}: {r.kind} region {r.name or hex(r.base)} ({r.size} bytes) has no counterpart of "
                f"the same size in {epilogue.name}; the recording is inconsistent"
            )
        pairs.append((r, e))
    return pairs


def heap_relocation(relocate: bool | None, address_mode: str) -> tuple[bool | None, str]:
    """What :class:`DeviceState` is asked to do with the heap, and why it would move it.

    Args:
        relocate: the caller's choice (``VerificationSettings.relocate``): None places the heap at its
            recorded addresses where it can, False only there, True elsewhere.
        address_mode: the recording's ``address_space.mode``; a ``relocatable`` recording is
            relocated unless the caller chose otherwise.

    Returns:
        (``relocate``, ``relocate_reason``) for :class:`DeviceState`.
    """
    if relocate is None and address_mode == "relocatable":
        return True, "the recording is relocatable: the recorder could not serve every allocation from its fixed window"
    return relocate, "relocation was asked for (relocate=True)"


class DeviceState:
    """Builds and owns the device copies of a recorded instance's memory.

    ``relocate``: None places the heap at its recorded addresses and relocates it
    when they cannot be had here (``relocation_reason`` says why); False places it
    there or raises RelocationRefusedError with the reason; True relocates it
    (``relocate_reason`` says why: a relocatable recording, or the caller asked).
    """

    def __init__(
        self,
        ctx: Any,
        store: Any,
        prologue: Snapshot,
        epilogue: Snapshot,
        *,
        relocate: bool | None,
        relocate_reason: str = "relocation was asked for",
        reservations: ProcessReservations | None = None,
        textures: tuple = (),
    ):
        self.ctx = ctx
        self.regions: list[RegionState] = []
        self.lease: Any = None  # placement.Lease of the heap's pages at their recorded addresses
        self.allocations: list[Any] = []  # live heap buffers when relocated
        self.relocated_heap = False
        self.relocation_reason = ""  # why the heap is not at its recorded addresses, when it is not
        pairs = pair_regions(prologue, epilogue)
        heap = [(p, e) for p, e in pairs if p.kind == "heap"]
        self._uploaded_map: tuple | None = None
        self.textures: TextureState | None = None
        try:
            self._place_heap(heap, relocate, relocate_reason, reservations or process_reservations())
            # The objects exist before memory is restored: their new handles go into it.
            arrays = pair_regions(prologue, epilogue, ("array",)) if textures else []
            self.textures = TextureState(ctx, textures, arrays, self._heap_address)
            self._check_handle_sites(pairs)
            self._restore(store, pairs, prologue.chunk_size)
            self.regions += self.textures.restore(
                store, lambda p, e: written_spans(p, e, prologue.chunk_size), RegionState
            )
        except BaseException:
            self.close()  # what was allocated, and the leased pages (back to the process's reservations)
            raise

    def _restore(self, store: Any, pairs: list[tuple[Region, Region]], chunk_size: int) -> None:
        """The device copies of every region: expected epilogue, pristine prologue of written ones."""
        ctx = self.ctx
        recorded_ranges = [Move(p.base, p.size, p.base) for p, _ in pairs]
        scan_map = RelocationMap(recorded_ranges)
        # Pointers need following when anything can move: globals always can, heap when relocated.
        scan = self.relocated_heap or any(p.kind == "global" for p, _ in pairs)
        for p, e in pairs:
            state = RegionState(p.kind, p.name, p.base, p.size, e.policy or p.policy, written_spans(p, e, chunk_size))
            self.regions.append(state)
            if p.kind == "heap":
                state.live = self._heap_home[p.base]
            pro = bytearray(p.read(store))
            epi = bytearray(e.read(store))
            self.textures.patch_memory(p.base, pro, epi)
            if scan:
                align = p.base % 8
                state.prologue_sites = scan_map.pointer_sites(pro, align)
                state.epilogue_sites = scan_map.pointer_sites(epi, align)
                state.prologue_values = read_values(pro, state.prologue_sites)
                state.epilogue_values = read_values(epi, state.epilogue_sites)
                if state.has_pointers:
                    state.prologue_bytes, state.epilogue_bytes = pro, epi
            state.expected = ctx.alloc(p.size)
            ctx.upload(state.expected.ptr, epi)
            if state.written:
                state.pristine = ctx.alloc(p.size)
                ctx.upload(state.pristine.ptr, pro)

    def _check_handle_sites(self, pairs: list[tuple[Region, Region]]) -> None:
        """ArtifactError for an object handle the recording says lies in memory it does not hold."""
        outside = self.textures.memory_sites_outside([(p.base, p.size) for p, _ in pairs])
        if outside:
            o, address = outside[0]
            raise ArtifactError(
                f"{o.label}: its handle is recorded at {address:#x}, in no recorded region; the recording is "
                "inconsistent"
            )

    def _heap_address(self, address: int) -> int | None:
        """Where the recorded heap address lives in this replay (None: in no restored heap region)."""
        for recorded, home in self._heap_home.items():
            size = self._heap_sizes.get(recorded, 0)
            if recorded <= address < recorded + size:
                return home + (address - recorded)
        return None

    # -- placement ------------------------------------------------------------------
    def _place_heap(
        self, heap: list[tuple[Region, Region]], relocate: bool | None, relocate_reason: str,
        reservations: ProcessReservations,
    ) -> None:
        self._heap_home: dict[int, int] = {}
        self._heap_sizes = {p.base: p.size for p, _ in heap}
        if not heap:
            return
        if relocate:
            self.relocation_reason = relocate_reason
        else:
            try:
                self.lease = reservations.lease(self.ctx, [(p.base, p.size) for p, _ in heap], self.ctx.device)
                self._heap_home = {p.base: p.base for p, _ in heap}
                return
            except Unplaceable as exc:
                if relocate is False:
                    raise RelocationRefusedError(
                        f"the recorded heap cannot be placed at its recorded addresses in this process ({exc}), "
                        "and relocating it was refused (--no-relocate); replay in a fresh process, or allow "
                        "relocation (pointers into the heap are then rewritten)"
                    ) from None
                self.relocation_reason = str(exc)
        self.relocated_heap = True
        for p, _ in heap:
            # Keep the low address bits, so alignment-sensitive code sees the same alignment (512: the
            # texture alignment of current GPUs, which a texture over linear memory needs).
            buf = self.ctx.alloc(p.size + RELOCATION_ALIGNMENT)
            self.allocations.append(buf)
            self._heap_home[p.base] = buf.ptr + (p.base - buf.ptr) % RELOCATION_ALIGNMENT

    # -- per module --------------------------------------------------------------------
    def relocation_map(self, global_homes: dict[int, int]) -> RelocationMap:
        """Where every recorded range lives with a module whose globals sit at ``global_homes``."""
        moves = []
        for r in self.regions:
            if r.kind == "heap":
                moves.append(Move(r.recorded_base, r.size, r.live))
            elif r.kind == "global" and r.recorded_base in global_homes:
                moves.append(Move(r.recorded_base, r.size, global_homes[r.recorded_base]))
        return RelocationMap(moves)

    def apply_map(self, rmap: RelocationMap) -> None:
        """Rewrite recorded pointers in the pristine and expected copies for ``rmap`` (once per distinct map)."""
        key = tuple((m.recorded, m.current) for m in rmap.moves)
        if key == self._uploaded_map:
            return
        for r in self.regions:
            if not r.has_pointers:
                continue
            pro = bytearray(r.prologue_bytes)
            epi = bytearray(r.epilogue_bytes)
            rmap.patch(pro, r.prologue_sites, r.prologue_values)
            rmap.patch(epi, r.epilogue_sites, r.epilogue_values)
            self.ctx.upload(r.expected.ptr, epi)
            if r.pristine is not None:
                self.ctx.upload(r.pristine.ptr, pro)
        self._uploaded_map = key

    def live_address(self, r: RegionState, global_homes: dict[int, int]) -> int | None:
        """Where the kernel's copy of a region is (an array's: the buffer it is copied into after a launch)."""
        if r.kind in ("heap", "array"):
            return r.live
        return global_homes.get(r.recorded_base)

    def full_reset(self, global_homes: dict[int, int]) -> None:
        """Copy every region's prologue into its live memory (an array's into the array)."""
        for r in self.regions:
            if r.kind == "array":
                self.textures.fill(r)
                continue
            live = self.live_address(r, global_homes)
            if live is not None:
                self.ctx.copy(live, r.reset_source, r.size)

    def full_reset_copies(self, global_homes: dict[int, int]) -> list[tuple[int, int, int]]:
        """(dst, src, size) copies that put every region's prologue into its live memory (``full_reset``
        as copies an engine call makes itself: before a batch's configuration (``start_batch``), before each
        pass of a profiled launch). CUDA arrays are not among them: a profiled launch's passes find them as
        the configuration's full reset left them, and a replay with arrays is not batched (``has_arrays``)."""
        out = []
        for r in self.regions:
            if r.kind == "array":
                continue
            live = self.live_address(r, global_homes)
            if live is not None:
                out.append((live, r.reset_source, r.size))
        return out

    def iteration_resets(self, global_homes: dict[int, int]) -> list:
        """(dst, src, size) copies that restore what the kernel writes, before each launch; a written
        CUDA array is filled whole (``textures.ArrayCopy``)."""
        out: list = []
        for r in self.regions:
            live = self.live_address(r, global_homes)
            if live is None or r.pristine is None:
                continue
            if r.kind == "array":
                out.append(self.textures.reset_copy(r))
                continue
            for offset, size in r.written:
                out.append((live + offset, r.pristine.ptr + offset, size))
        return out

    def array_readbacks(self) -> list[tuple[int, int, int, int, int]]:
        """The engine's copies of the CUDA arrays into their ``live`` buffers, made after each checked launch."""
        return self.textures.readbacks() if self.textures is not None else []

    def patch_handles(self, args: bytes) -> bytes:
        """The argument bytes with the texture and surface objects' new handles where the recording says."""
        return self.textures.patch_args(args) if self.textures is not None else args

    @property
    def has_arrays(self) -> bool:
        """Whether a region is a CUDA array (its full reset is no device copy an engine call can make)."""
        return any(r.kind == "array" for r in self.regions)

    @property
    def has_pointer_sites(self) -> bool:
        return any(r.has_pointers for r in self.regions)

    @property
    def device_bytes(self) -> int:
        total = sum(r.size * (2 if r.pristine is not None else 1) for r in self.regions)
        if self.lease is not None:
            total += self.lease.mapped_bytes
        total += sum(b.size for b in self.allocations)
        if self.textures is not None:
            total += self.textures.device_bytes
        return total

    def close(self) -> None:
        if self.textures is not None:
            self.textures.close()
        for r in self.regions:
            for buf in (r.expected, r.pristine):
                if buf is not None:
                    buf.free()
            r.expected = r.pristine = None
        for b in self.allocations:
            b.free()
        self.allocations = []
        if self.lease is not None:
            self.lease.release()
            self.lease = None
