"""Texture and surface objects through the native recorder, on the CPU (the fake driver of test_fake_driver.py).

tests/record_agent/fake_cuda/textures_app.cpp makes a texture over linear memory, a texture over a
CUDA array and a surface over another array, runs a kernel with the three handles as arguments (the
linear texture and the surface both have handle 1, as the real driver numbers them) and one that
finds the texture's handle in device memory. Under `mneme record` the recorder notes the objects and
arrays as they are made (CUPTI callbacks), describes them at each recorded launch, copies the arrays
into both snapshots (through device staging buffers, GPU digests included), and the agent keeps the
objects each kernel reaches, confirmed by its PTX (nvcc's, of fake_cuda/texture_kernels.cu). The
recording then restores on the fake native engine, the objects recreated with the recorded
descriptors and their new handles written where the kernel finds them.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from test_fake_driver import FAKE, app_env, fake, recorder_lib, run  # noqa: F401  (fixtures)
from test_native_recorder import recorder  # noqa: F401  (fixture)

from mneme.recording.execution import RecordedExecution

N, WIDTH, HEIGHT = 128, 16, 8
SAMPLE, TABLE = "_Z6sampleyyyPfi", "_Z5tablePKyPfi"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> tuple[Path, Path]:
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("needs nvcc (the CUDA toolkit) to compile texture_kernels.cu")
    out = tmp_path_factory.mktemp("texture_kernels")
    for kind in ("ptx", "cubin"):
        subprocess.run([nvcc, "-O2", "-arch=sm_90", f"-{kind}", "-o", out / f"kernels.{kind}",
                        FAKE / "texture_kernels.cu"], check=True)  # fmt: skip
    return out / "kernels.ptx", out / "kernels.cubin"


def _databases(rdb: Path) -> dict[str, RecordedExecution]:
    out = {}
    for path in rdb.glob("*.json"):
        if path.stem.isdigit():
            rec = RecordedExecution.from_json(path)
            out[rec.kernel_name] = rec
    return out


@pytest.fixture(scope="module")
def recorded(fake, recorder_lib, kernels, tmp_path_factory):  # noqa: F811
    ptx, cubin = kernels
    env = app_env(fake, recorder_lib, FAKE_PTX_CUBIN=str(cubin))
    plain, _ = run([fake / "textures_app", ptx], env)
    assert plain.returncode == 0 and plain.stdout == "textures_app: ok\n", plain.stderr
    rdb = tmp_path_factory.mktemp("textures") / "rdb"
    rec, _ = run([sys.executable, "-m", "mneme", "record", "-rdb", rdb, "--", fake / "textures_app", ptx], env)
    assert rec.returncode == 0 and rec.stdout == plain.stdout, rec.stderr[-3000:]  # the application's own output
    assert "error" not in rec.stderr and "not captured" not in rec.stderr, rec.stderr[-3000:]
    return rdb, _databases(rdb)


def test_objects_passed_as_arguments_are_captured_with_their_arrays(recorded):
    rdb, dbs = recorded
    (inst,) = dbs[SAMPLE].instances.values()
    assert inst.supported, inst.unsupported
    canvas, lin, img = inst.textures  # by kind, then handle
    assert (lin.kind, lin.handle, lin.args, lin.resource.type) == ("texture", 1, (0,), "linear")
    assert (img.kind, img.handle, img.args, img.resource.type) == ("texture", 2, (8,), "array")
    # Handle 1 again, read by a surface instruction: the surface object, not the texture.
    assert (canvas.kind, canvas.handle, canvas.args, canvas.resource.type) == ("surface", 1, (16,), "array")
    assert lin.resource.size == 4 * N and lin.texture.address_mode == (1, 1, 1) and lin.texture.border_color[1] == 0.25
    store = dbs[SAMPLE].store
    pro = {r.base: r for r in inst.load_prologue().regions if r.kind == "array"}
    epi = {r.base: r for r in inst.load_epilogue().regions if r.kind == "array"}
    assert sorted(pro) == sorted([img.resource.array, canvas.resource.array])
    image = struct.pack(f"<{WIDTH * HEIGHT}f", *(100.0 + i for i in range(WIDTH * HEIGHT)))
    assert pro[img.resource.array].read(store) == epi[img.resource.array].read(store) == image
    assert pro[canvas.resource.array].read(store) == bytes(4 * WIDTH * HEIGHT)
    painted = struct.unpack(f"<{WIDTH * HEIGHT}f", epi[canvas.resource.array].read(store))
    assert painted == tuple(0.5 * i + 100.0 + i for i in range(WIDTH * HEIGHT))  # the surface writes
    assert pro[img.resource.array].array.to_dict() == {"width": WIDTH, "height": HEIGHT, "depth": 0, "format": 0x20,
                                                        "channels": 1, "flags": 0}  # fmt: skip
    assert pro[canvas.resource.array].array.flags == 2  # surface load/store


def test_a_handle_in_device_memory_is_found_and_no_array_is_kept(recorded):
    _, dbs = recorded
    (inst,) = dbs[TABLE].instances.values()
    assert inst.supported, inst.unsupported
    (lin,) = inst.textures
    handles = struct.unpack_from("<Q", inst.arguments, 0)[0]
    assert (lin.kind, lin.handle, lin.args, lin.memory) == ("texture", 1, (), (handles,))
    assert not [r for r in inst.load_prologue().regions if r.kind == "array"]


def test_the_recording_restores_with_new_objects_and_handles(recorded, monkeypatch, tmp_path):
    from mneme.replay import Replayer, placement
    from mneme.replay import engine as eng
    from mneme.replay.placement import ProcessReservations
    from mneme.testing.fake_native_engine import AddressSpace, FakeKernel, native_module

    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    space = AddressSpace(kernel=FakeKernel())
    monkeypatch.setattr(eng, "_engine", native_module(space))
    monkeypatch.setattr(placement, "_process", ProcessReservations())
    _, dbs = recorded
    rec = dbs[SAMPLE]
    with Replayer(rec, rec.single_instance().record_id) as r:
        assert r.run(r.baseline(), iterations=1, warmup=0).verified
        lin, img, canvas = sorted(space.objects.values(), key=lambda o: (o.surface, o.resource["type"] == "array"))
        args = struct.unpack_from("<QQQ", space.kernel.runs[-1].args)
        assert args == (lin.handle, img.handle, canvas.handle) and canvas.surface
        assert len(space.arrays) == 2 and len(space.kernel.runs[-1].array_readbacks) == 2
