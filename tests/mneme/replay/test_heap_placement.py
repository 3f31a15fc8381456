"""The heap at its recorded addresses (mneme.replay.placement), and relocation as a reported fallback.

Placement runs against mneme/testing/fake_native_engine.py's address space: reservations
at exact bases, refused where the range is taken (by a reservation, a simulated host
mapping, or a real mapping of this process). Replayer and `mneme replay` run on it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap

import pytest

import mneme.testing.fake_native_engine as fake_native_engine
import mneme.testing.synthetic_recordings as synth
from mneme.cli import main
from mneme.errors import RelocationRefusedError
from mneme.model.verification import VerificationSettings
from mneme.recording.execution import RecordedExecution
from mneme.replay import engine as eng
from mneme.replay import placement
from mneme.replay.placement import ProcessReservations, Unplaceable, clusters
from mneme.testing.fake_native_engine import GRANULARITY as G
from mneme.testing.fake_native_engine import AddressSpace, FakeContext, native_module

MIB = 1 << 20
NEW_BASE, OLD_BASE = 0x200000000000, 0x7F0000000000


@pytest.fixture
def space(monkeypatch) -> AddressSpace:
    """A fresh fake address space as the engine's, and a fresh registry of this process's reservations."""
    space = AddressSpace()
    monkeypatch.setattr(eng, "_engine", native_module(space))
    monkeypatch.setattr(placement, "_process", ProcessReservations())
    return space


@contextlib.contextmanager
def host_mapping(address: int, size: int = 64 << 10):
    """A real anonymous mapping of this process at ``address`` (as a shared library or an arena would be)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    prot_none, map_fixed_noreplace = 0, 0x100000
    got = libc.mmap(address, size, prot_none, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | map_fixed_noreplace, -1, 0)
    if got in (None, ctypes.c_void_p(-1).value) or got != address:
        pytest.skip(f"cannot map {address:#x} here (errno {ctypes.get_errno()})")
    try:
        yield
    finally:
        libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))


# -- clusters -----------------------------------------------------------------------------
def test_clusters_merge_near_spans_but_not_across_a_barrier_or_a_wide_gap():
    spans = [(10 * G, 11 * G), (0, G), (3 * G, 4 * G), (10 * G + (1 << 40), 11 * G + (1 << 40))]
    assert clusters(spans, max_gap=8 * G) == [(0, 11 * G), (10 * G + (1 << 40), 11 * G + (1 << 40))]
    assert clusters(spans, max_gap=8 * G, barriers=[5 * G]) == [(0, 4 * G), (10 * G, 11 * G),
                                                                (10 * G + (1 << 40), 11 * G + (1 << 40))]


# -- leases --------------------------------------------------------------------------------
def test_regions_are_mapped_at_their_addresses_in_a_reservation_kept_for_the_process(space):
    ctx, held = FakeContext(space, 1), ProcessReservations()
    lease = held.lease(ctx, [(NEW_BASE, 4096), (NEW_BASE + 3 * G + 8, 100)], device=1)
    (res,) = space.reservations
    assert (res.base, res.size) == (NEW_BASE, placement.RESERVATION_ALIGN)  # rounded out: the next instances fit
    assert res.mappings == {0: (G, 1), 3 * G: (G, 1)} and lease.mapped_bytes == 2 * G
    lease.release()
    assert res.mappings == {} and res.reserved  # never freed: the driver would not give the range back
    again = held.lease(ctx, [(NEW_BASE + G, 10)], device=0)
    assert len(space.reserve_calls) == 1 and res.mappings == {G: (G, 0)} and again.mapped_bytes == G


def test_recordings_at_different_bases_are_placed_side_by_side_in_one_process(space):
    ctx, held = FakeContext(space, 0), ProcessReservations()
    new = held.lease(ctx, [(NEW_BASE, 1 << 20)], 0)
    old = held.lease(ctx, [(OLD_BASE + 2 * G, 1 << 20)], 0)
    assert sorted(r.base for r in space.reservations) == [NEW_BASE, OLD_BASE]
    assert new.mapped_bytes == old.mapped_bytes == G


def test_far_apart_regions_get_one_reservation_per_cluster_not_the_whole_span(space):
    ctx = FakeContext(space, 0)
    ProcessReservations().lease(ctx, [(NEW_BASE, 4096), (OLD_BASE, 4096), (NEW_BASE + 5 * G, 10)], 0)
    assert sorted(space.reserve_calls) == [(NEW_BASE, placement.RESERVATION_ALIGN), (OLD_BASE, placement.RESERVATION_ALIGN)]


def test_pages_beyond_a_held_range_are_reserved_next_to_it(space):
    ctx, held = FakeContext(space, 0), ProcessReservations()
    held.lease(ctx, [(NEW_BASE, 4096)], 0).release()
    end = NEW_BASE + placement.RESERVATION_ALIGN
    lease = held.lease(ctx, [(end - G, 2 * G)], 0)  # one page in the held range, one past it
    first, second = sorted(space.reservations, key=lambda r: r.base)
    assert second.base == end and first.mappings == {placement.RESERVATION_ALIGN - G: (G, 0)}
    assert second.mappings == {0: (G, 0)} and lease.mapped_bytes == 2 * G


def test_pages_another_replay_holds_are_unplaceable_and_say_so(space):
    ctx, held = FakeContext(space, 0), ProcessReservations()
    held.lease(ctx, [(NEW_BASE, 2 * G)], 0)
    with pytest.raises(Unplaceable, match=f"{NEW_BASE:#x}-{NEW_BASE + 2 * G:#x} is in use by another replay"):
        held.lease(ctx, [(NEW_BASE + G, 10)], 0)


def test_a_taken_neighbourhood_falls_back_to_the_exact_pages(space):
    space.host_mappings.append((NEW_BASE + 32 * MIB, NEW_BASE + 33 * MIB))  # in the rounded-out range only
    lease = ProcessReservations().lease(FakeContext(space, 0), [(NEW_BASE, 4096)], 0)
    assert [(r.base, r.size) for r in space.reservations] == [(NEW_BASE, G)] and lease.mapped_bytes == G


def test_a_taken_range_is_unplaceable_with_the_driver_error_and_what_holds_it(space):
    base = 0x210000000000
    with host_mapping(base + 3 * G):
        with pytest.raises(Unplaceable) as info:
            ProcessReservations().lease(FakeContext(space, 0), [(base, 4 * G)], 0)
    why = str(info.value)
    assert why.startswith(f"reserving {base:#x}-{base + 4 * G:#x} (8 MiB) failed: cuMemAddressReserve at the recorded base")
    assert f"/proc/self/maps has there: {base + 3 * G:#x}-{base + 3 * G + (64 << 10):#x} ---p [anonymous]" in why
    assert "zone" not in why  # not a range Linux fills on its own


def test_a_taken_range_in_the_mmap_zone_names_the_zone_and_what_to_do(space):
    space.host_mappings.append((OLD_BASE, OLD_BASE + G))
    with pytest.raises(Unplaceable, match="lies in the mmap zone .* re-record"):
        ProcessReservations().lease(FakeContext(space, 0), [(OLD_BASE, 4096)], 0)


def test_a_failed_mapping_rolls_the_lease_back(space):
    space.fail_map_at = NEW_BASE + 2 * G
    held = ProcessReservations()
    with pytest.raises(Unplaceable, match="OUT_OF_MEMORY"):
        held.lease(FakeContext(space, 0), [(NEW_BASE, G), (NEW_BASE + 2 * G, G)], 0)
    (res,) = space.reservations
    assert res.mappings == {} and held.held[0].busy == []


# -- Replayer and mneme replay -----------------------------------------------------------------
@pytest.fixture
def vecadd_db(tmp_path):
    return synth.vecadd(tmp_path / "rec", n=4096, block=256)


def _replayer(db, relocate=None):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(db))
    return Replayer(rec, rec.single_instance().record_id, verification=VerificationSettings(relocate=relocate))


def test_a_free_recorded_range_replays_at_its_addresses(space, vecadd_db):
    base = RecordedExecution.from_json(str(vecadd_db)).address_space.base
    with _replayer(vecadd_db) as replayer:
        assert not replayer.relocated_heap and replayer.relocation_reason == ""
        assert [r.live for r in replayer.regions] == [r.recorded_base for r in replayer.regions]
        result = replayer.run(replayer.baseline())
    assert result.status == "compile_error"  # the fake engine loads no module; placement is what is checked
    assert not result.relocated and result.relocation_reason == ""
    assert space.reservations[0].base == base


def test_a_taken_recorded_range_relocates_and_the_result_says_why(space, vecadd_db):
    base = RecordedExecution.from_json(str(vecadd_db)).address_space.base
    with host_mapping(base):
        with _replayer(vecadd_db) as replayer:
            assert replayer.relocated_heap and all(r.live != r.recorded_base for r in replayer.regions)
            result = replayer.run(replayer.baseline())
    assert result.relocated and f"/proc/self/maps has there: {base:#x}-" in result.relocation_reason
    assert "cuMemAddressReserve" in result.relocation_reason


def test_no_relocate_refuses_a_taken_range(space, vecadd_db):
    base = RecordedExecution.from_json(str(vecadd_db)).address_space.base
    with host_mapping(base):
        with pytest.raises(RelocationRefusedError, match=r"cannot be placed at its recorded addresses .*/proc/self/maps"):
            _replayer(vecadd_db, relocate=False)


def test_a_relocatable_recording_relocates_with_that_reason_unless_refused(space, tmp_path):
    db = synth.gather_sum(tmp_path / "g")
    with _replayer(db) as replayer:
        assert replayer.relocated_heap and "the recording is relocatable" in replayer.relocation_reason
    with _replayer(db, relocate=False) as replayer:  # its recorded addresses are free here: placed there
        assert not replayer.relocated_heap


def test_a_replayer_that_fails_to_restore_gives_its_pages_back(space, vecadd_db):
    space.allocations_left = 2  # the third region's expected copy does not fit
    with pytest.raises(fake_native_engine.CudaError, match="OUT_OF_MEMORY"):
        _replayer(vecadd_db)
    (held,) = placement.process_reservations().held
    assert held.busy == [] and held.reservation.mappings == {}
    space.allocations_left = None
    with _replayer(vecadd_db, relocate=False) as replayer:  # the pages are free again
        assert not replayer.relocated_heap


def test_mneme_replay_reports_relocation_and_no_relocate_exits_2(space, vecadd_db, capsys):
    base = RecordedExecution.from_json(str(vecadd_db)).address_space.base
    with host_mapping(base):
        assert main(["replay", "-rdb", str(vecadd_db), "--json", "--no-relocate"]) == 2
        err = capsys.readouterr().err
        assert "mneme replay: error: the recorded heap cannot be placed at its recorded addresses" in err
        assert "--no-relocate" in err
        assert main(["replay", "-rdb", str(vecadd_db), "--json"]) == 1  # the fake engine cannot load the kernel
    out, err = capsys.readouterr()
    result = json.loads(out)["Result"]
    assert result["relocated"] is True and f"{base:#x}" in result["relocation_reason"]
    assert "mneme replay: note: the heap was relocated (pointers to it rewritten): reserving" in err


# -- the first context's guard -------------------------------------------------------------
def test_the_first_context_reserves_the_default_windows_before_anything_else(space, monkeypatch):
    """open_context holds the recorder's default windows from the process's first context on, so the
    driver's own first allocations cannot take them; replays of recordings there lease from it."""
    monkeypatch.setattr(eng, "_first_context", True)
    ctx = eng.open_context(0)
    assert space.reserve_calls == [(NEW_BASE, placement.GUARD_SIZES[0])]
    eng.open_context(1)  # later contexts reserve nothing more
    assert len(space.reserve_calls) == 1
    lease = placement.process_reservations().lease(ctx, [(NEW_BASE + 4 * (1 << 30), 4096)], 0)  # device 1's window
    assert len(space.reserve_calls) == 1 and lease.mapped_bytes == G


def test_the_guard_takes_a_smaller_range_where_the_large_one_is_taken(space):
    space.host_mappings.append((NEW_BASE + 20 * (1 << 30), NEW_BASE + 21 * (1 << 30)))
    held = ProcessReservations()
    assert held.guard(FakeContext(space, 0), NEW_BASE) == 16 << 30
    at_base = AddressSpace(host_mappings=[(NEW_BASE, NEW_BASE + G)])
    assert ProcessReservations().guard(FakeContext(at_base, 0), NEW_BASE) == 0  # replays reserve what they need later
