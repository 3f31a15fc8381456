"""The format's texture and surface objects: array regions in snapshots, ``textures`` in the database (CPU)."""

from __future__ import annotations

import json

import pytest

from mneme.errors import ArtifactError
from mneme.format.database import InstanceRecord, RecordingDatabase
from mneme.format.hashing import dynamic_hash
from mneme.format.objects import ObjectRef
from mneme.format.snapshot import Region, Snapshot, decode_snapshot, encode_snapshot, parse_header
from mneme.format.textures import ArrayShape, Resource, TextureDesc, TextureObject, ViewDesc
from mneme.model.experiment import Dim3

SHA = "ab" * 32
SHAPE = ArrayShape(16, 8, 0, 0x20, 2, 0x2)


def _snapshot(*regions: Region) -> Snapshot:
    return Snapshot("1", "2", "prologue", regions, 1 << 22)


def test_an_array_region_round_trips_with_its_shape_and_other_regions_keep_their_bytes():
    array = Region(0x5555_0000, SHAPE.size, "array", "array@0x55550000", ((SHA, SHAPE.size),), None, SHAPE)
    heap = Region(0x2000_0000_0000, 64, "heap", "a", ((SHA, 64),))
    back = decode_snapshot(encode_snapshot(_snapshot(heap, array)))
    assert back.regions == (heap, array) and back.regions[1].array == SHAPE
    assert SHAPE.size == 16 * 8 * 4 * 2 and (SHAPE.row_bytes, SHAPE.rows, SHAPE.slices) == (128, 8, 1)
    assert "array" not in heap.to_dict()  # a snapshot without arrays is what earlier versions wrote
    assert ArrayShape(5).size == 20 and ArrayShape(4, 2, 3).size == 96


@pytest.mark.parametrize("change,message", [
    ({"array": None}, "a region of kind 'array' has an 'array' shape"),
    ({"kind": "heap"}, "a region of kind 'array' has an 'array' shape, and only such a region"),
    ({"size": 8}, "chunk lengths add up to"),
    ({"array": {**SHAPE.to_dict(), "flags": 1}}, "only surface load/store (0x2) and texture gather (0x8) arrays"),
    ({"array": {**SHAPE.to_dict(), "format": 0xC0}}, "0xc0 is not a format mneme records"),
    ({"array": {**SHAPE.to_dict(), "channels": 3}}, "3 channels: expected 1, 2 or 4"),
    ({"array": {**SHAPE.to_dict(), "width": 8}}, "the array's shape holds 512 bytes, the region 1024"),
])  # fmt: skip
def test_a_malformed_array_region_is_refused(change, message):
    region = Region(0x5555_0000, SHAPE.size, "array", "x", ((SHA, SHAPE.size),), None, SHAPE).to_dict()
    region.update(change)
    if region.get("array") is None:
        region.pop("array")
    header = {"static_hash": "1", "dynamic_hash": "2", "phase": "prologue", "chunk_size": 1 << 22, "regions": [region]}
    with pytest.raises(ArtifactError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_header(header, "snap")


def test_two_array_regions_with_one_handle_are_refused():
    array = Region(0x5555_0000, SHAPE.size, "array", "x", ((SHA, SHAPE.size),), None, SHAPE)
    with pytest.raises(ArtifactError, match="two array regions have the same base"):
        _snapshot(array, array).validate()


LINEAR = Resource("linear", address=0x2000_0000_0200, format=0x20, channels=1, size=4096)
DESC = TextureDesc((1, 0, 3), 1, 0x2, 0, 0, 0.5, 0.0, 3.0, (0.0, 0.25, 1.0, -2.5))


def _database(textures) -> dict:
    args = (1).to_bytes(8, "little") + (2).to_bytes(8, "little") + bytes(8)
    dyn = dynamic_hash("7", Dim3(1), Dim3(32), 0, args, 0)
    ref = ObjectRef("DeviceState.prologue.7.x.mneme", SHA, 1)
    inst = InstanceRecord(dyn, Dim3(1), Dim3(32), 0, args, ref, ref, textures=tuple(textures))
    db = RecordingDatabase.from_dict(json.loads(json.dumps({
        "format": "mneme.recording", "format_version": 1, "static_hash": "7",
        "kernel": {"name": "k", "demangled": "k", "params": [], "param_buffer_size": 24},
        "code": {"ptx": {"path": "Kernel_7.ptx", "sha256": SHA, "size": 1}, "cubin": None, "bitcode": None,
                 "arch": "sm_90"},
        "device": {"name": "", "compute_capability": [9, 0], "ordinal": 0},
        "address_space": {"mode": "fixed", "base": 0, "size": 0},
        "recorder": {"version": "", "host": "", "rank": None, "created": "", "command": []},
        "instances": {},
    })))  # fmt: skip
    return json.loads(db.add_instance(inst).to_json())


def test_textures_round_trip_in_the_database_and_only_when_there_are_any():
    objects = [TextureObject("texture", 1, LINEAR, DESC, None, (0,), ()),
               TextureObject("texture", 2, Resource("array", array=0x5555_0000), DESC,
                             ViewDesc(0x1, 16, 8, 0, 0, 0, 0, 0), (8,), (0x2000_0000_0010,)),
               TextureObject("surface", 1, Resource("array", array=0x5555_0000), memory=(0x2000_0000_0018,))]  # fmt: skip
    data = _database(objects)
    (inst,) = data["instances"].values()
    assert inst["textures"][0] == {**objects[0].to_dict()} and inst["textures"][0]["texture"]["border_color"][3] == -2.5
    back = RecordingDatabase.from_dict(data)
    assert list(back.instances.values())[0].textures == tuple(objects)
    assert "textures" not in list(_database([])["instances"].values())[0]


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.update(kind="sampler"), "expected one of 'texture', 'surface'"),
    (lambda t: t.update(args=[4]), "4 is not a multiple of 8"),
    (lambda t: t.update(args=[24]), "above the maximum 16"),
    (lambda t: t.update(args=[], memory=[]), "names no place that holds its handle"),
    (lambda t: t.update(texture=None), "a texture object needs its texture descriptor"),
    (lambda t: t["resource"].update(type="mipmapped_array"), "expected one of 'array', 'linear', 'pitch2d'"),
    (lambda t: t["texture"].update(mipmap_level_bias="x"), "expected a number"),
    (lambda t: t.update(view={"format": 1, "width": 1, "height": 1, "depth": 0, "first_mipmap_level": 0,
                              "last_mipmap_level": 0, "first_layer": 0, "last_layer": 0}),
     "only a texture over an array has a resource view"),
])  # fmt: skip
def test_a_malformed_texture_entry_is_refused_naming_the_field(edit, message):
    data = _database([TextureObject("texture", 1, LINEAR, DESC, None, (0,))])
    (inst,) = data["instances"].values()
    edit(inst["textures"][0])
    data.pop("checksum")
    with pytest.raises(ArtifactError, match=message):
        RecordingDatabase.from_dict(data)


def test_one_place_named_by_two_objects_is_refused():
    twice = [TextureObject("texture", 1, LINEAR, DESC, args=(0,)),
             TextureObject("surface", 1, Resource("array", array=5), args=(0,))]  # fmt: skip
    data = _database(twice[:1])
    (inst,) = data["instances"].values()
    inst["textures"] = [t.to_dict() for t in twice]
    data.pop("checksum")
    with pytest.raises(ArtifactError, match="a place that holds a handle is named by two objects"):
        RecordingDatabase.from_dict(data)


def test_extents_of_linear_and_pitched_resources():
    assert LINEAR.extent == 4096
    pitched = Resource("pitch2d", address=0x1000, format=0x20, channels=2, width=10, height=3, pitch=128)
    assert pitched.extent == 128 * 2 + 10 * 8
    assert Resource("array", array=1).extent == 0
