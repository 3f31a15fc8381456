"""Texture and surface objects in the agent: which a launch reaches, where its kernel finds their handles (CPU).

The recorder lists every object alive at a launch with its descriptors and copies the CUDA arrays behind
them; the agent follows the handles of the kernel's texture and surface instructions back through its PTX
(to argument words, or to loads from memory, then found in the captured prologue), keeps the objects it
confirms and the arrays they read, and refuses by name what it cannot capture. The PTX here is written like
nvcc's; ``test_the_handles_of_the_gpu_test_programs_are_followed`` reads nvcc's own.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from mneme.format import RecorderInfo
from mneme.format.hashing import static_hash
from mneme.recording.execution import RecordedExecution
from mneme.store import open_store
from record_agent.convert import SpoolConverter
from record_agent.spool import read_entry
from record_agent.testing import (
    WINDOW,
    array_shape,
    array_texture,
    linear_texture,
    surface_object,
    write_entry,
    write_module,
)
from record_agent.textures import MAX_MEMORY_SITES, plan_textures, ptx_handles, scan_words

N = 256  # the vector add's floats per buffer: buffers of 1024 bytes at WINDOW, WINDOW + 1024, WINDOW + 2048
A, B, C = WINDOW, WINDOW + 1024, WINDOW + 2048
GATHER, TABLE, BLUR, PICK, OPAQUE, TEXREF, PLAIN, CALLS = (
    "_Z6gatheryPfi", "_Z5tablePKyPfi", "_Z4bluryyii", "_Z4pickyybPf", "_Z6opaqueyPf", "_Z6texrefPf", "_Z5plainPf",
    "_Z5callsyPf",
)  # fmt: skip

PTX = f"""//
// Generated like nvcc's output (only what the agent reads).
.version 8.0
.target sm_90
.address_size 64

.global .texref legacy;

.visible .entry {GATHER}(
	.param .u64 {GATHER}_param_0,
	.param .u64 {GATHER}_param_1,
	.param .u32 {GATHER}_param_2
)
{{
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd1, [{GATHER}_param_0];
	ld.param.u64 	%rd2, [{GATHER}_param_1];
$L__BB0_1:
	tex.1d.v4.f32.s32 	{{%f1, %f2, %f3, %f4}}, [%rd1, {{%r1}}];
	st.global.f32 	[%rd2], %f1;
	ret;
}}
.visible .entry {TABLE}(
	.param .u64 {TABLE}_param_0,
	.param .u64 {TABLE}_param_1,
	.param .u32 {TABLE}_param_2
)
{{
	ld.param.u64 	%rd3, [{TABLE}_param_0];
	cvta.to.global.u64 	%rd4, %rd3;
	ld.global.u64 	%rd1, [%rd4];
	tex.1d.v4.f32.s32 	{{%f1, %f2, %f3, %f4}}, [%rd1, {{%r1}}];
	ret;
}}
.visible .entry {BLUR}(
	.param .u64 {BLUR}_param_0,
	.param .u64 {BLUR}_param_1,
	.param .u32 {BLUR}_param_2,
	.param .u32 {BLUR}_param_3
)
{{
	ld.param.u64 	%rd1, [{BLUR}_param_0];
	ld.param.u64 	%rd2, [{BLUR}_param_1];
	suld.b.2d.b32.clamp {{%r13}}, [%rd1, {{%r12, %r2}}];
	@%p1 sust.b.2d.b32.trap 	[%rd2, {{%r11, %r2}}], {{%r17}};
	ret;
}}
.visible .entry {PICK}(
	.param .u64 {PICK}_param_0,
	.param .u64 {PICK}_param_1,
	.param .u8 {PICK}_param_2,
	.param .u64 {PICK}_param_3
)
{{
	ld.param.u64 	%rd1, [{PICK}_param_0];
	ld.param.u64 	%rd2, [{PICK}_param_1];
	selp.b64 	%rd3, %rd1, %rd2, %p1;
	mov.b64 	%rd4, %rd3;
	txq.width.b32 	%r1, [%rd4];
	ret;
}}
.visible .entry {OPAQUE}(
	.param .u64 {OPAQUE}_param_0,
	.param .u64 {OPAQUE}_param_1
)
{{
	ld.param.u64 	%rd1, [{OPAQUE}_param_0];
	add.s64 	%rd2, %rd1, 1;
	tex.1d.v4.f32.s32 	{{%f1, %f2, %f3, %f4}}, [%rd2, {{%r1}}];
	ret;
}}
.visible .entry {TEXREF}(
	.param .u64 {TEXREF}_param_0
)
{{
	tex.1d.v4.f32.s32 	{{%f1, %f2, %f3, %f4}}, [legacy, {{%r1}}];
	ret;
}}
.visible .entry {PLAIN}(
	.param .u64 {PLAIN}_param_0
)
{{
	ld.param.u64 	%rd1, [{PLAIN}_param_0];
	ret;
}}
.func  (.param .align 16 .b8 func_retval0[16]) _Z5fetchyi(
	.param .b64 _Z5fetchyi_param_0,
	.param .b32 _Z5fetchyi_param_1
)
{{
	.loc	5 115 4
	ld.param.u64 	%rd1, [_Z5fetchyi_param_0];
	mov.b64 	%rd2, %rd1;
	tex.1d.v4.f32.s32 	{{%f1, %f2, %f3, %f4}}, [%rd2, {{%r3}}];
	ret;
}}
.func _Z6unusedy(
	.param .b64 _Z6unusedy_param_0
)
{{
	ld.param.u64 	%rd1, [_Z6unusedy_param_0];
	suq.width.b32 	%r1, [%rd1];
	ret;
}}
.visible .entry {CALLS}(
	.param .u64 {CALLS}_param_0,
	.param .u64 {CALLS}_param_1
)
{{
	ld.param.u64 	%rd1, [{CALLS}_param_0];
	mov.b64 	%rd3, %rd1;
	{{ // callseq 0, 0
	.param .b64 param0;
	st.param.b64 	[param0], %rd3;
	.param .b32 param1;
	st.param.b32 	[param1], %r2;
	.param .align 16 .b8 retval0[16];
	call.uni (retval0),
	_Z5fetchyi,
	(
	param0,
	param1
	);
	ld.param.f32 	%f1, [retval0];
	}} // callseq 0
	ret;
}}
"""


def handles(kernel: str, offsets=(0, 8, 16, 24)):
    return ptx_handles(PTX, kernel, offsets)


def test_handles_are_followed_to_argument_words():
    use = handles(GATHER).texture
    assert use.args == {0} and not use.memory and not use.untraced and use.instructions == 1
    blur = handles(BLUR)
    assert blur.surface.args == {0, 8} and blur.surface.instructions == 2 and not blur.texture.reads
    pick = handles(PICK).texture  # through selp and mov: either parameter may be the handle
    assert pick.args == {0, 8} and not pick.untraced
    assert handles(CALLS, (0, 8)).texture.args == {0}  # through a call: what the caller stored for the parameter
    assert not handles(PLAIN).reads


def test_handles_loaded_from_memory_and_handles_that_cannot_be_followed():
    table = handles(TABLE).texture
    assert table.memory and table.args == set() and not table.untraced
    (why,) = handles(OPAQUE).texture.untraced
    assert why == f"tex.1d.v4.f32.s32 in {OPAQUE} (its handle comes from add.s64)"
    (why,) = handles(TEXREF).texture.untraced
    assert "reads legacy: a texture or surface reference?" in why
    # A function no kernel calls is not read: _Z6unusedy's suq does not count for any kernel.
    assert not handles(GATHER).surface.reads


NVCC = shutil.which("nvcc")
PROGRAMS = Path(__file__).resolve().parents[1] / "gpu" / "programs"


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("debug", [False, True], ids=["O2", "G"])
def test_the_handles_of_the_gpu_test_programs_are_followed(tmp_path, debug):
    """nvcc's PTX of tests/gpu/programs/textures and the corpus's texture object, optimized and with -G
    (where every handle passes through a function that is not inlined)."""
    expected = {  # program -> {kernel: (texture args, textures from memory, surface args)}
        "textures/tex1d_linear": {"_Z13gather_linearyyPKiPfi": ({0, 8}, False, set())},
        "textures/tex2d_pitched": {"_Z8resampleyPfiiff": ({0}, False, set())},
        "textures/tex2d_array": {"_Z18sample_point_clampyPfii": ({0}, False, set())},
        "textures/surface_write": {"_Z13write_surfaceyii": (set(), False, {0}),
                                   "_Z12blur_surfaceyyii": (set(), False, {0, 8})},
        "textures/tex_in_struct": {"_Z20gather_through_tablePK7SampleriPKiPfi": (set(), True, set())},
        "textures/tex_mipmapped": {"_Z11read_levelsyPf": ({0}, False, set())},
        "corpus/texture_object": {"_Z13fetch_textureyPfi": ({0}, False, set()),
                                  "_Z17plain_copy_scaledPKfPfi": (set(), False, set())},
    }  # fmt: skip
    for program, kernels in expected.items():
        out = tmp_path / (Path(program).name + ".ptx")
        subprocess.run([NVCC, "-G" if debug else "-O2", "-arch=sm_90", "-ptx", "-o", out, PROGRAMS / f"{program}.cu"],
                       check=True)  # fmt: skip
        ptx = out.read_text()
        for kernel, (tex_args, from_memory, surf_args) in kernels.items():
            found = ptx_handles(ptx, kernel, [8 * i for i in range(6)])
            assert (found.texture.args, found.texture.memory, found.surface.args) == (tex_args, from_memory, surf_args), \
                (program, kernel)
            assert not found.texture.untraced and not found.surface.untraced, (program, kernel)


def test_scanning_finds_aligned_words_by_device_address():
    data = struct.pack("<QQQ", 7, 1, 7)
    assert scan_words(data, 0x1000, {7}, 10) == [(0x1000, 7), (0x1010, 7)]
    assert scan_words(b"\0" * 4 + data, 0x1004, {7}, 10) == [(0x1008, 7), (0x1018, 7)]  # aligned by address
    assert scan_words(data, 0x1000, {7}, 0) == [(0x1000, 7)]  # the limit plus one
    assert scan_words(data, 0x1000, set(), 10) == []


# -- conversion -----------------------------------------------------------------------------------------------


def args_of(*words: int, tail: int = N) -> bytes:
    return struct.pack(f"<{len(words)}Qi", *words, tail)


def texture_entry(spool: Path, kernel: str, args: bytes, objects: list, *, seq: int = 0, ptx: bool = True, **kw):
    """A spool entry of ``kernel`` (the vector add's buffers A, B, C captured) with these objects alive."""
    if not (spool / "modules").exists():
        write_module(spool, with_ptx_source=ptx, kernels=(GATHER, TABLE, BLUR, PICK, OPAQUE, TEXREF, PLAIN, CALLS),
                     ptx=PTX)  # fmt: skip
    words = (len(args) - 4) // 8
    extra = {"kernel": kernel, "demangled": kernel, "args": args.hex(), "param_buffer_size": len(args),
             "param_offsets": [8 * i for i in range(words + 1)], "param_sizes": [8] * words + [4],
             "objects": objects, **kw.pop("extra", {})}  # fmt: skip
    return write_entry(spool, seq, n=N, extra=extra, **kw)


def convert(tmp_path: Path, kernel: str, args: bytes, objects: list, **kw):
    spool, out = tmp_path / "spool", tmp_path / "out"
    texture_entry(spool, kernel, args, objects, **kw)
    converter = SpoolConverter(spool, open_store(out), executable=None,
                               recorder=RecorderInfo("t", "host", None, "2026-01-01T00:00:00Z", ("app",)))
    converter.convert_ready()
    (db,) = [p for p in out.glob("*.json") if p.stem.isdigit()]
    rec = RecordedExecution.from_json(db)
    return db, rec, rec.single_instance()


def test_a_texture_over_linear_memory_passed_as_an_argument_is_captured(tmp_path):
    tex = linear_texture(1, A + 512, 512, filter_mode=0)
    db, rec, inst = convert(tmp_path, GATHER, args_of(1, C), [tex, linear_texture(2, B, 1024)])
    assert inst.supported, inst.unsupported
    assert rec.static_hash == static_hash(GATHER, PTX)  # the kernel is identified by the PTX that was followed
    (record,) = inst.textures  # the object the kernel reads; the other one it does not reach is left out
    assert (record.kind, record.handle, record.args, record.memory) == ("texture", 1, (0,), ())
    assert record.resource.to_dict() == tex["resource"] and record.texture.to_dict() == tex["texture"]
    stored = json.loads(db.read_text())["instances"][inst.record_id]["textures"]
    assert stored == [{**tex, "args": [0], "memory": []}]
    assert not [r for r in inst.load_prologue().regions if r.kind == "array"]


def test_arrays_behind_textures_and_surfaces_are_stored_with_their_shapes_and_only_those(tmp_path):
    first, second, unused = 0x5550_0000, 0x5551_0000, 0x5552_0000
    before = struct.pack("<64f", *range(64))
    after = struct.pack("<64f", *(2.0 * i for i in range(64)))
    regions = [("array", "", first, before, after, array_shape(8, 8, flags=2)),
               ("array", "", second, before, before, array_shape(64, flags=2)),
               ("array", "", unused, before, before, array_shape(16, 4))]  # fmt: skip
    objects = [surface_object(1, first), surface_object(2, second), array_texture(3, unused)]
    _, _, inst = convert(tmp_path, BLUR, args_of(2, 1), objects, extra_regions=regions)
    assert inst.supported, inst.unsupported
    assert [(t.kind, t.handle, t.args, t.resource.array) for t in inst.textures] == [
        ("surface", 1, (8,), first), ("surface", 2, (0,), second)]
    pro, epi = inst.load_prologue(), inst.load_epilogue()
    arrays = {r.base: r for r in pro.regions if r.kind == "array"}
    assert sorted(arrays) == [first, second]  # the texture no kernel instruction reaches keeps its array out
    assert arrays[first].array.to_dict() == array_shape(8, 8, flags=2) and arrays[first].size == 256
    assert arrays[first].read(open_store(tmp_path / "out")) == before
    (written,) = [r for r in epi.regions if r.base == first]
    assert written.read(open_store(tmp_path / "out")) == after and written.name == f"array@{first:#x}"


def test_handles_the_kernel_loads_from_memory_are_found_in_the_captured_prologue(tmp_path, monkeypatch):
    table = struct.pack("<QfiQfi", 5, 2.0, 100, 6, -0.5, 200) + bytes(1024 - 48)  # two samplers, then zeros
    regions = [("heap", "", WINDOW + 4096, table, table)]
    objects = [linear_texture(5, A, 1024), linear_texture(6, B, 1024), linear_texture(7, C, 1024)]
    db, _, inst = convert(tmp_path, TABLE, args_of(WINDOW + 4096, C), objects, extra_regions=regions)
    assert inst.supported, inst.unsupported
    assert [(t.handle, t.args, t.memory) for t in inst.textures] == [(5, (), (WINDOW + 4096,)),
                                                                     (6, (), (WINDOW + 4096 + 16,))]
    assert any("2 word(s) of captured memory equal to live handles are taken as handles" in w for w in inst.warnings)


def test_a_kernel_that_loads_handles_from_memory_none_of_which_is_captured_is_unsupported(tmp_path):
    _, _, inst = convert(tmp_path, TABLE, args_of(A, C), [linear_texture(0x77, B, 1024)])
    assert inst.unsupported == ("the kernel loads texture handles from memory, and the captured memory holds none "
                                "of the 1 texture object(s) alive at the launch",)  # fmt: skip
    assert inst.textures == ()


def test_memory_handles_in_pieces_the_recorder_did_not_copy_again_are_found(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    table = struct.pack("<Q", 9) + bytes(1016)
    seen: set = set()
    objects = [linear_texture(9, A, 1024)]
    regions = [("heap", "", WINDOW + 4096, table, table)]
    texture_entry(spool, TABLE, args_of(WINDOW + 4096, C), objects, seq=0, digests=seen, extra_regions=regions)
    converter = SpoolConverter(spool, open_store(out), executable=None,
                               recorder=RecorderInfo("t", "host", None, "2026-01-01T00:00:00Z", ("app",)))
    converter.convert_ready()
    # The second launch's table is a hole in its stripe file (its digest was captured): read from the chunks.
    path = texture_entry(spool, TABLE, args_of(WINDOW + 4096, C, tail=N + 1), objects, seq=1, digests=seen,
                         extra_regions=regions)  # fmt: skip
    assert read_entry(path).regions[3].phases["prologue"].skipped
    converter.convert_ready()
    rec = RecordedExecution.from_json(next(p for p in out.glob("*.json") if p.stem.isdigit()))
    assert [inst.textures[0].memory for inst in rec.instances.values()] == [(WINDOW + 4096,)] * 2


def test_too_many_words_equal_to_handles_is_unsupported(tmp_path):
    table = struct.pack("<Q", 1) * (MAX_MEMORY_SITES + 1)
    regions = [("heap", "", WINDOW + 16384, table, table)]
    _, _, inst = convert(tmp_path, TABLE, args_of(WINDOW + 16384, C), [linear_texture(1, A, 1024)],
                         extra_regions=regions)  # fmt: skip
    (why,) = inst.unsupported
    assert why.startswith(f"more than {MAX_MEMORY_SITES} words of captured memory equal live texture or surface handles")


@pytest.mark.parametrize("kernel,args,objects,reason", [
    (GATHER, args_of(3, C), [linear_texture(1, A, 1024)],
     "argument 0 is read as a texture object but holds 0x3, no texture object alive at the launch"),
    (GATHER, args_of(1, C), [{**linear_texture(1, A, 1024), "resource": None,
                             "unsupported": "mipmapped array texture objects are not captured"}],
     "the kernel reads texture object 0x1, which is not captured: mipmapped array texture objects are not captured"),
    (GATHER, args_of(1, C), [linear_texture(1, A + 512, 1024)],
     f"the kernel reads texture object 0x1, over 1024 bytes at {A + 512:#x}, which lie in no captured heap "
     "allocation"),
    (GATHER, args_of(1, C), [array_texture(1, 0x5550_0000)],
     "the kernel reads texture object 0x1, whose CUDA array 0x55500000 the recorder did not copy"),
    (OPAQUE, args_of(1, C), [linear_texture(1, A, 1024)],
     f"the kernel reads texture objects through handles mneme cannot follow to its arguments or to memory: "
     f"tex.1d.v4.f32.s32 in {OPAQUE} (its handle comes from add.s64)"),
])  # fmt: skip
def test_objects_that_cannot_be_captured_make_the_launch_unsupported_by_name(tmp_path, kernel, args, objects, reason):
    _, _, inst = convert(tmp_path, kernel, args, objects)
    assert inst.unsupported == (reason,) and inst.textures == ()


def test_a_null_handle_argument_is_no_object(tmp_path):
    # A kernel whose texture is optional: this launch passes 0 and reads the other argument's object only.
    _, _, inst = convert(tmp_path, PICK, args_of(0, 1), [linear_texture(1, A, 1024)])
    assert inst.supported and [(t.handle, t.args) for t in inst.textures] == [(1, (8,))]


def test_objects_do_not_matter_to_a_kernel_that_reads_none(tmp_path):
    region = ("array", "", 0x5550_0000, bytes(64), bytes(64), array_shape(16))
    _, _, inst = convert(tmp_path, PLAIN, args_of(1, C), [array_texture(1, 0x5550_0000)], extra_regions=[region])
    assert inst.supported and inst.textures == ()
    assert not [r for r in inst.load_prologue().regions if r.kind == "array"]  # nor is its array stored


def test_without_ptx_eight_byte_arguments_equal_to_live_handles_are_taken_with_a_warning(tmp_path):
    _, _, inst = convert(tmp_path, GATHER, args_of(1, 2), [linear_texture(1, A, 1024), surface_object(2, 0x99)],
                         ptx=False)  # fmt: skip
    assert not inst.supported  # argument 1 equals the surface object, whose array was not copied
    _, _, inst = convert(tmp_path / "b", GATHER, args_of(1, C), [linear_texture(1, A, 1024)], ptx=False)
    assert inst.supported and [(t.handle, t.args) for t in inst.textures] == [(1, (0,))]
    assert any("without the kernel's PTX, 1 8-byte argument(s) equal to live texture or surface handles are taken"
               in w for w in inst.warnings)  # fmt: skip


def test_an_entry_of_a_recorder_that_lists_handles_only_is_unsupported_when_its_kernel_reads_one(tmp_path):
    _, _, inst = convert(tmp_path, GATHER, args_of(1, C), [], extra={"objects": None, "texture_objects": [1]})
    assert inst.unsupported == ("the kernel reads texture object 0x1, which is not captured: the recorder that "
                                "wrote this spool entry does not capture texture and surface objects",)  # fmt: skip


def test_plan_without_live_objects_is_empty(tmp_path):
    path = texture_entry(tmp_path / "spool", GATHER, args_of(1, C), [])
    plan = plan_textures(read_entry(path), PTX)
    assert plan.records == () and plan.unsupported == () and plan.arrays == frozenset()
