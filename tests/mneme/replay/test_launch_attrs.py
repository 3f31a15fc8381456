"""Recorded launch attributes: carried from the recorder's spool into the recording, and what a replay makes of them."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.errors import ArtifactError, NotAvailableError
from mneme.format.database import (
    LaunchAttribute,
    RecordingDatabase,
    attributes_key,
    load_database,
)
from mneme.format.hashing import dynamic_hash
from mneme.format.schema import JsonReader
from mneme.replay.launch_attrs import VALUE_BYTES, plan_for
from mneme.store import open_store


def spool_attribute(text: str) -> LaunchAttribute:
    """An attribute as native/recorder writes it into launch.json."""
    return LaunchAttribute.parse(JsonReader("launch.json"), json.loads(text), "attributes[0]")


def test_recorder_forms_parse():
    cluster = spool_attribute('{"id": 4, "name": "cluster_dim", "value": [2, 1, 1]}')
    coop = spool_attribute('{"id": 2, "name": "cooperative", "value": [1]}')
    raw = spool_attribute('{"id": 2, "name": "raw", "value_hex": "' + (b"\1" + bytes(63)).hex() + '"}')
    assert (cluster.id, cluster.value) == (4, (2, 1, 1))
    assert coop.value == (1,) and raw.raw[:1] == b"\1" and len(raw.raw) == 64
    with pytest.raises(ArtifactError, match="value_hex"):
        spool_attribute('{"id": 9, "name": "raw", "value_hex": "xyz"}')
    with pytest.raises(ArtifactError, match="unknown key"):
        spool_attribute('{"id": 9, "name": "raw", "bogus": 1}')


def test_cluster_and_cooperative_are_replayed():
    plan = plan_for([
        LaunchAttribute(4, "cluster_dim", (2, 1, 1)),
        LaunchAttribute(2, "raw", (), b"\1" + bytes(63)),  # cooperative as cuLaunchKernelEx gives it
    ])  # fmt: skip
    assert plan.names == ("cluster_dim", "cooperative")
    assert plan.cluster_dim == (2, 1, 1) and plan.cooperative
    ids = [i for i, _ in plan.attributes]
    assert ids == [4, 2] and all(len(v) == VALUE_BYTES for _, v in plan.attributes)
    assert struct.unpack_from("<3I", plan.attributes[0][1]) == (2, 1, 1)
    assert plan.launch_errors((8, 1, 1)) == []
    (error,) = plan.launch_errors((7, 1, 1))
    assert "grid x=7" in error and "cluster dimension x=2" in error
    assert plan_for([]).attributes == () and plan_for([LaunchAttribute(0, "raw", (), bytes(64))]).attributes == ()


@pytest.mark.parametrize(
    "attr,named",
    [
        (LaunchAttribute(7, "raw", (), bytes(64)), "programmatic_event (id 7)"),
        (LaunchAttribute(1, "raw", (), bytes(64)), "access_policy_window (id 1)"),
        (LaunchAttribute(12, "raw", (), bytes(64)), "launch_completion_event (id 12)"),
        (LaunchAttribute(99, "raw", (), bytes(64)), "(id 99)"),
    ],
)
def test_attributes_a_replay_cannot_reproduce_are_refused_by_name(attr, named):
    with pytest.raises(NotAvailableError, match=named.replace("(", r"\(").replace(")", r"\)")):
        plan_for([attr])


def test_recordings_keep_launch_attributes(tmp_path):
    path = synth.vecadd(tmp_path / "rec", n=4096, block=256)
    store = open_store(str(path.parent))
    db = load_database(store, path.name)
    plain = db.to_dict()
    assert all("launch_attributes" not in i for i in plain["instances"].values())  # unchanged for plain launches
    (key,) = db.instances
    attrs = (LaunchAttribute(4, "cluster_dim", (2, 1, 1)), LaunchAttribute(7, "raw", (), bytes(64)))
    inst = db.instances[key]
    # The attributes are part of the launch's identity: the same launch with them is another instance.
    key2 = dynamic_hash(db.static_hash, inst.grid, inst.block, inst.shared_mem, inst.args, 0, attributes_key(attrs))
    assert key2 != key
    db2 = db.add_instance(replace(inst, dynamic_hash=key2, launch_attributes=attrs))
    again = RecordingDatabase.from_dict(json.loads(db2.to_json()))
    assert again.instances[key2].launch_attributes == attrs and not again.instances[key].launch_attributes
