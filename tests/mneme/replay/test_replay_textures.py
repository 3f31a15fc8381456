"""Texture and surface objects at replay, on the CPU (the fake native engine keeps arrays and objects).

A recording whose instance reads a texture over linear memory (its handle an argument), a texture over
a CUDA array (an argument) and a surface over another array (its handle in a table in device memory):
the replay creates the arrays with their recorded shapes and fills them from the prologue, creates the
objects with the recorded descriptors (over the heap where this replay put it), writes the new handles
where the recording says (the argument words, the table in the restored prologue and in the expected
epilogue) and nowhere else, resets a written array before launches, copies every array out after each
checked launch and compares it with the epilogue. tests/gpu/test_textures.py runs the real thing.
"""

from __future__ import annotations

import struct

import pytest

from mneme.errors import ArtifactError
from mneme.format.database import AddressSpace, DeviceInfo, InstanceRecord, KernelParam, KernelSignature
from mneme.format.hashing import dynamic_hash, static_hash
from mneme.format.objects import ObjectRef
from mneme.format.snapshot import Region, build_snapshot, write_snapshot
from mneme.format.textures import ArrayShape, Resource, TextureDesc, TextureObject
from mneme.format.writer import RecordingWriter, new_database
from mneme.model.experiment import Dim3
from mneme.model.verification import VerificationSettings
from mneme.recording.execution import RecordedExecution
from mneme.replay import engine as eng
from mneme.replay import placement
from mneme.replay.placement import ProcessReservations
from mneme.store import open_store
from mneme.testing import vecadd_code
from mneme.testing.fake_native_engine import AddressSpace as FakeSpace
from mneme.testing.fake_native_engine import FakeKernel, native_module
from mneme.testing.synthetic_recordings import WINDOW, WINDOW_SIZE

MIB2 = 2 << 20
DATA, TABLE, OUT = WINDOW, WINDOW + MIB2, WINDOW + 2 * MIB2  # heap regions: texels, the handle table, the output
IMAGE, CANVAS = 0x55550000, 0x55560000  # the recorded handles of two CUDA arrays
LINEAR_TEX, ARRAY_TEX, SURFACE = 1, 2, 1  # recorded object handles (a surface may share a texture's number)
SHAPE = ArrayShape(16, 8, 0, 0x20, 1, 0x2)  # 16 x 8 floats, surface load/store
DESC = TextureDesc((1, 1, 1), 1, 0x2)  # clamp, linear filtering, normalized coordinates
PARAMS = (KernelParam(0, 8, "scalar"), KernelParam(8, 8, "scalar"), KernelParam(16, 8, "pointer"),
          KernelParam(24, 8, "pointer"))  # fmt: skip
ARGS = struct.pack("<QQQQ", LINEAR_TEX, ARRAY_TEX, TABLE, OUT)


def _region(writer: RecordingWriter, base: int, kind: str, data: bytes, array: ArrayShape | None = None) -> Region:
    (chunks,) = writer.put_chunks([data])
    return Region(base, len(data), kind, f"{kind}@{base:#x}" if kind == "array" else f"r{base:#x}", tuple(chunks),
                  None, array)  # fmt: skip


def write_recording(directory, objects: tuple[TextureObject, ...] | None = None) -> str:
    store = open_store(str(directory))
    writer = RecordingWriter(store)
    static = static_hash("_Z7samplesyyPyPf", vecadd_code.PTX)
    code = writer.write_code(static, ptx=vecadd_code.PTX, cubin=vecadd_code.CUBIN, arch="sm_90")
    db = new_database(static, KernelSignature("_Z7samplesyyPyPf", "samples", PARAMS, len(ARGS)), code,
                      device=DeviceInfo("NVIDIA H100 80GB HBM3", (9, 0), 0),
                      address_space=AddressSpace("fixed", WINDOW, WINDOW_SIZE))  # fmt: skip
    texels = struct.pack("<256f", *range(256))
    table = struct.pack("<QQ", SURFACE, 7) + bytes(48)  # the surface's handle, then a word that is data
    image, canvas0 = struct.pack("<128f", *range(128)), bytes(SHAPE.size)
    canvas1 = struct.pack("<128f", *(2.0 * i for i in range(128)))
    out0, out1 = bytes(1024), struct.pack("<256f", *(3.0 * i for i in range(256)))
    dyn = dynamic_hash(static, Dim3(1), Dim3(128), 0, ARGS, 0)
    refs = {}
    for phase, canvas, out in (("prologue", canvas0, out0), ("epilogue", canvas1, out1)):
        regions = [_region(writer, DATA, "heap", texels), _region(writer, TABLE, "heap", table),
                   _region(writer, OUT, "heap", out), _region(writer, IMAGE, "array", image, SHAPE),
                   _region(writer, CANVAS, "array", canvas, SHAPE)]  # fmt: skip
        refs[phase] = ObjectRef(*write_snapshot(store, build_snapshot(static, dyn, phase, regions)))
    if objects is None:
        objects = (
            TextureObject("texture", LINEAR_TEX, Resource("linear", address=DATA + 512, format=0x20, channels=1,
                                                          size=512), DESC, args=(0,)),
            TextureObject("texture", ARRAY_TEX, Resource("array", array=IMAGE), DESC, args=(8,)),
            TextureObject("surface", SURFACE, Resource("array", array=CANVAS), memory=(TABLE,)),
        )  # fmt: skip
    instance = InstanceRecord(dyn, Dim3(1), Dim3(128), 0, ARGS, refs["prologue"], refs["epilogue"], (16, 24),
                              textures=objects)  # fmt: skip
    writer.commit(db.add_instance(instance))
    return str(directory / db.name)


@pytest.fixture
def space(monkeypatch, tmp_path) -> FakeSpace:
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    space = FakeSpace(kernel=FakeKernel())
    monkeypatch.setattr(eng, "_engine", native_module(space))
    monkeypatch.setattr(placement, "_process", ProcessReservations())
    return space


def replayer(db: str, **options):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(db)
    return Replayer(rec, rec.single_instance().record_id, **options)


def test_the_recording_reads_back_with_its_objects_and_arrays(tmp_path):
    rec = RecordedExecution.from_json(write_recording(tmp_path / "rec"))
    inst = rec.single_instance()
    assert [(t.kind, t.handle, t.args, t.memory) for t in inst.textures] == [
        ("texture", 1, (0,), ()), ("texture", 2, (8,), ()), ("surface", 1, (), (TABLE,))]
    arrays = [r for r in inst.load_prologue().regions if r.kind == "array"]
    assert [(r.base, r.array) for r in arrays] == [(IMAGE, SHAPE), (CANVAS, SHAPE)]


def test_objects_are_recreated_and_their_new_handles_written_where_the_recording_says(space, tmp_path):
    with replayer(write_recording(tmp_path / "rec")) as r:
        objects = sorted(space.objects.values(), key=lambda o: o.handle)
        assert [(o.surface, o.resource["type"]) for o in objects] == [(False, "linear"), (False, "array"),
                                                                      (True, "array")]
        linear, image, canvas = objects
        assert linear.resource["address"] == DATA + 512 and linear.texture == DESC.to_dict() and linear.view is None
        arrays = {a.handle: a for a in space.arrays.values()}
        assert image.resource["array"] in arrays and canvas.resource["array"] in arrays
        assert {a.shape for a in arrays.values()} == {(16, 8, 0, 0x20, 1, 0x2)}
        assert bytes(arrays[image.resource["array"]].data) == struct.pack("<128f", *range(128))  # the prologue

        result = r.run(r.baseline(), iterations=2, warmup=1)
        assert result.status == "verified", result.error
        timed = space.kernel.runs[-1]
        # The argument words: the new handles; the pointers as they were.
        assert struct.unpack("<QQQQ", timed.args) == (linear.handle, image.handle, TABLE, OUT)
        # The table: the surface's new handle in the prologue and the expected epilogue, the data word left alone.
        (table,) = [g for g in r.regions if g.recorded_base == TABLE]
        assert struct.unpack("<QQ", r.ctx.download(table.expected.ptr, 16)) == (canvas.handle, 7)
        # Every array is copied where the checks read it after a checked launch, and compared.
        array_regions = [g for g in r.regions if g.kind == "array"]
        assert sorted(timed.array_readbacks) == sorted(
            (replay_array(r, g), g.live, 64, 8, 1) for g in array_regions)
        assert {c[0] for c in timed.checks} >= {g.live for g in array_regions}
        assert r.relocated is False
    assert space.objects == {} and space.arrays == {}  # closed: objects first, then the arrays


def replay_array(r, region) -> int:
    """The handle of the replay's CUDA array of an array region."""
    return r._state.textures.arrays[region.recorded_base].handle


def test_a_written_array_is_reset_before_every_launch_from_its_prologue(space, tmp_path):
    with replayer(write_recording(tmp_path / "rec"), reset="always") as r:
        assert r.run(r.baseline(), iterations=2, warmup=0).verified
        timed = space.kernel.runs[-1]
        (canvas,) = [g for g in r.regions if g.kind == "array" and g.pristine is not None]
        assert canvas.recorded_base == CANVAS  # the image is only read: no pristine copy, no reset
        assert timed.array_resets == [(replay_array(r, canvas), canvas.pristine.ptr, 64, 8, 1)]
        assert all(len(reset) == 3 for reset in timed.resets)  # the linear resets stay (dst, src, size)


def test_a_relocated_heap_moves_a_linear_texture_with_it(space, tmp_path):
    settings = VerificationSettings(relocate=True)
    with replayer(write_recording(tmp_path / "rec"), verification=settings) as r:
        (data,) = [g for g in r.regions if g.recorded_base == DATA]
        (linear,) = [o for o in space.objects.values() if o.resource["type"] == "linear"]
        assert data.live != DATA and linear.resource["address"] == data.live + 512


def test_an_object_over_memory_the_recording_does_not_hold_is_an_artifact_error(space, tmp_path):
    outside = (TextureObject("texture", 1, Resource("linear", address=OUT + 1000, format=0x20, channels=1, size=512),
                             DESC, args=(0,)),)  # fmt: skip
    with pytest.raises(ArtifactError, match="does not hold as one heap region"):
        replayer(write_recording(tmp_path / "rec", outside))
    assert space.objects == {} and space.arrays == {}


def test_a_handle_site_that_does_not_hold_the_handle_is_an_artifact_error(space, tmp_path):
    wrong = (TextureObject("surface", 9, Resource("array", array=CANVAS), memory=(TABLE,)),)
    with pytest.raises(ArtifactError, match="the prologue holds 0x1 at .*, not its handle"):
        replayer(write_recording(tmp_path / "rec", wrong))
