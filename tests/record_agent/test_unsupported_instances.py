"""Launches the recorder could not capture faithfully: marked unsupported with reasons, refused by replay and tune (CPU)."""

from __future__ import annotations

import json

import pytest

from mneme.cli import main
from mneme.errors import ArtifactError, UnsupportedInstanceError
from mneme.format import RecorderInfo
from mneme.format.hashing import static_hash
from mneme.recording.execution import RecordedExecution
from mneme.store import open_store
from mneme.testing import vecadd_code
from record_agent.convert import SpoolConverter
from record_agent.testing import KERNEL, WINDOW, write_entry, write_module

C_BASE = WINDOW + 2 * 1024  # the vector add's third buffer (n=256 floats, 512-byte strides)


def convert(tmp_path, **entry):
    spool, out = tmp_path / "spool", tmp_path / "out"
    write_module(spool)
    write_entry(spool, 0, n=256, **entry)
    SpoolConverter(spool, open_store(out), executable=None,
                   recorder=RecorderInfo("t", "host", None, "2026-01-01T00:00:00Z", ("app",))).convert_ready()
    path = out / f"{static_hash(KERNEL, vecadd_code.PTX)}.json"
    return path, RecordedExecution.from_json(path).single_instance()


def test_an_argument_into_mapped_host_memory_makes_the_instance_unsupported_and_replay_refuses_it(tmp_path, capsys):
    mapped = {"kind": "host", "base": C_BASE, "size": 1024}
    db, inst = convert(tmp_path, extra={"foreign_memory": [mapped]})
    assert not inst.supported
    (reason,) = inst.unsupported
    assert reason.startswith(f"argument 2 points into pinned host memory mapped into the device (cudaHostAlloc/cudaMallocHost/cudaHostRegister), 1024 bytes at {C_BASE:#x}")
    with pytest.raises(UnsupportedInstanceError, match="cannot be replayed"):
        inst.require_supported()
    stored = json.loads(db.read_text())["instances"][inst.record_id]
    assert stored["supported"] is False and stored["unsupported"] == [reason]

    # Both commands say why, with exit status 2, before any GPU work (this machine has none).
    assert main(["replay", "-rdb", str(db)]) == 2
    assert "argument 2 points into pinned host memory" in capsys.readouterr().err
    assert main(["tune", "-rdb", str(db), "-rid", inst.record_id, "--space-preset", "launch",
                 "--results-dir", str(tmp_path / "results")]) == 2
    assert "argument 2 points into pinned host memory" in capsys.readouterr().err
    assert not (tmp_path / "results" / "trials.jsonl").exists()

    assert main(["ls", str(db.parent)]) == 0
    out = capsys.readouterr().out
    assert "1 (1 unsupported)" in out and "1 unsupported" in out
    assert main(["ls", "--long", str(db.parent)]) == 0
    assert "unsupported: argument 2 points into pinned host memory" in " ".join(capsys.readouterr().out.split())


def test_uncaptured_memory_the_kernel_does_not_reach_leaves_the_instance_supported(tmp_path):
    # Texture and surface objects alive at the launch do not matter to a kernel that reads none
    # (tests/record_agent/test_textures.py has those that do).
    far = {"kind": "host", "base": 0x7A0000000000, "size": 4096}
    _, inst = convert(tmp_path, extra={"foreign_memory": [far], "texture_objects": [1], "surface_objects": [2]})
    assert inst.supported and inst.unsupported == ()
    inst.require_supported()


def test_a_pointer_into_uncaptured_memory_found_in_captured_memory_is_a_reason(tmp_path):
    ipc = {"kind": "ipc", "base": 0x7A0000000000, "size": 1 << 20}
    _, inst = convert(tmp_path, extra={"foreign_memory": [ipc],
                                       "foreign_references": [{"region": WINDOW, "target": 0x7A0000000040}]})
    (reason,) = inst.unsupported
    assert f"the buffer at {WINDOW:#x}" in reason and "another process (cudaIpcOpenMemHandle)" in reason


def test_supported_flag_must_agree_with_the_reasons(tmp_path):
    mapped = {"kind": "host", "base": C_BASE, "size": 1024}
    db, inst = convert(tmp_path, extra={"foreign_memory": [mapped]})
    data = json.loads(db.read_text())
    data["instances"][inst.record_id]["supported"] = True
    db.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="supported"):
        RecordedExecution.from_json(db)


RAW_ZEROS = bytes(64).hex()


@pytest.mark.parametrize("attribute,named", [
    ({"id": 7, "name": "raw", "value_hex": RAW_ZEROS}, "programmatic_event (id 7), which a replay cannot reproduce: "
                                                       "it names a CUDA event of the application's process"),
    ({"id": 1, "name": "raw", "value_hex": RAW_ZEROS}, "access_policy_window (id 1)"),
    ({"id": 99, "name": "raw", "value_hex": RAW_ZEROS}, "(id 99), which this mneme does not know how to replay"),
])  # fmt: skip
def test_a_launch_attribute_the_replay_cannot_repeat_is_refused_at_record_time(tmp_path, capsys, attribute, named):
    db, inst = convert(tmp_path, attributes=[attribute])
    assert not inst.supported
    (reason,) = inst.unsupported
    assert named in reason
    assert main(["replay", "-rdb", str(db)]) == 2  # the recorder's reason, before any GPU work
    assert named in capsys.readouterr().err
    assert main(["ls", str(db.parent)]) == 0
    assert "1 (1 unsupported)" in capsys.readouterr().out


def test_launch_attributes_the_replay_repeats_leave_the_instance_supported(tmp_path):
    _, inst = convert(tmp_path, attributes=[{"id": 4, "name": "cluster_dim", "value": [1, 1, 1]},
                                            {"id": 2, "name": "cooperative", "value": [1]},
                                            {"id": 0, "name": "raw", "value_hex": RAW_ZEROS}])
    assert inst.supported and inst.unsupported == () and len(inst.launch_attributes) == 3
