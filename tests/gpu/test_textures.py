"""Texture and surface objects, recorded unmodified: captured, recreated at replay, verified.

Six programs of ours (tests/gpu/programs/textures/, README.md there): 1-D textures over linear
memory (one starting inside its allocation), a 2-D texture over pitched memory (linear filtering,
normalized coordinates), textures over a 2-D CUDA array (point and linear filtering, clamp and
wrap addressing), surface writes and reads over CUDA arrays, texture handles stored in a table in
device memory rather than passed as arguments, and a texture over a mipmapped array. For each:

* the program's own output is the same under `mneme record` as when it runs alone;
* every recorded instance of every kernel replays verified with `mneme replay`'s defaults (the
  recorder captured the objects the launch reaches, their resources and descriptors and the
  memory behind them; the replay recreated them and gave the kernel the new handles);
* except the mipmapped array's: recorded unsupported with a reason naming mipmapped arrays, and
  `mneme replay` refuses it with exit status 2 naming them (never a CUDA fault).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_record import PROGRAMS, _nvcc, mneme_record, recorder_lib  # noqa: F401 (fixture)

from mneme.format.database import DATABASE_NAME
from mneme.recording.execution import RecordedExecution
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu

#: program -> {kernel (a substring of the mangled name): None to replay verified, or the word its refusal names}
TEXTURES = {
    "tex1d_linear": {"gather_linear": None},
    "tex2d_pitched": {"resample": None},
    "tex2d_array": {"sample_point_clamp": None, "resample": None},
    "surface_write": {"write_surface": None, "blur_surface": None},
    "tex_in_struct": {"gather_through_table": None},
    "tex_mipmapped": {"read_levels": "mipmapped"},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("textures")
    subprocess.run(["make", "-s", "-j4", "-C", PROGRAMS, "textures", f"OUTDIR={out}", f"NVCC={_nvcc()}"], check=True)
    return out


def mneme(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """A fresh `mneme` process."""
    return subprocess.run([sys.executable, "-m", "mneme", *argv], cwd=cwd,
                          env=child_env(MNEME_CACHE_DIR=str(cwd / "cache")), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("program", sorted(TEXTURES))
def test_texture_program_records_and_replays_verified_or_refused_by_name(recorder_lib, built, tmp_path,  # noqa: F811
                                                                          program):
    expected = TEXTURES[program]
    alone = subprocess.run([built / program], capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0 and alone.stdout == f"{program}: ok\n", (alone.stdout, alone.stderr)
    rdb = tmp_path / "rdb"
    recorded = mneme_record(recorder_lib, rdb, [built / program])
    assert recorded.stdout == alone.stdout, (recorded.stdout, recorded.stderr[-3000:])  # the application's own output

    by_kernel: dict[str, RecordedExecution] = {}
    for path in sorted(rdb.glob("*.json")):
        if DATABASE_NAME.fullmatch(path.name):
            rec = RecordedExecution.from_json(path)
            names = [k for k in expected if k in rec.kernel_name]
            assert len(names) == 1, f"{program}: recorded kernel {rec.kernel_name} is not one of {list(expected)}"
            by_kernel[names[0]] = rec
    assert sorted(by_kernel) == sorted(expected), recorded.stderr[-3000:]

    for kernel, refusal in expected.items():
        rec = by_kernel[kernel]
        db = str(rdb / rec.database_name)
        assert rec.instances, (program, kernel)
        for inst in rec.instances.values():
            where = f"{program}: {rec.kernel_name} instance {inst.record_id}"
            if refusal is not None:
                assert not inst.supported, (where, "recorded as supported")
                assert any(refusal in reason.lower() for reason in inst.unsupported), (where, inst.unsupported)
                replay = mneme("replay", "-rdb", db, "-rid", inst.record_id, cwd=tmp_path)
                assert replay.returncode == 2 and refusal in replay.stderr.lower(), (where, replay.returncode,
                                                                                     replay.stderr[-3000:])
                assert "CUDA_ERROR" not in replay.stderr, (where, replay.stderr[-3000:])
                continue
            assert inst.supported, (where, inst.unsupported)
            replay = mneme("replay", "-rdb", db, "-rid", inst.record_id, "--json", cwd=tmp_path)
            assert replay.returncode == 0, (where, replay.stdout[-3000:], replay.stderr[-3000:])
            result = json.loads(replay.stdout)["Result"]
            assert result["verified"] and result["status"] == "verified", (where, result)
