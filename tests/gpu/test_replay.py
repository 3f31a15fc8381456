"""GPU tests of the replay engine on synthetic recordings (real kernels, host-computed epilogues).

Each test restores a recording on the GPU and checks what the replay reports:
the baseline verifies bitwise, launches that leave work undone fail, PTX-tier
knobs change what they should and still verify, in-place and atomic kernels
verify on every launch, globals and relocated pointers are followed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.model.experiment import ExperimentConfiguration
from mneme.model.verification import VerificationSettings
from mneme.recording.execution import RecordedExecution
from mneme.testing.gpu import child_env

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    import mneme.replay.compile as compile_mod

    monkeypatch.setattr(compile_mod, "_default_cache", None)


def _open(path: Path):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(path))
    inst = rec.single_instance()
    return rec, inst, Replayer(rec, inst.record_id)


@pytest.fixture(scope="module")
def vecadd_path(tmp_path_factory) -> Path:
    return synth.vecadd(tmp_path_factory.mktemp("vecadd"), n=1 << 20, block=256)


@pytest.fixture(scope="module")
def vecadd(vecadd_path):
    rec, inst, replayer = _open(vecadd_path)
    yield rec, inst, replayer
    replayer.close()


def test_self_test_passes():
    from mneme.replay import self_test

    self_test(0)


def test_baseline_replays_the_recorded_cubin_bitwise(vecadd):
    rec, inst, replayer = vecadd
    config = replayer.baseline()
    result = replayer.run(config, iterations=5, warmup=2)
    assert result.status == "verified", result.error
    assert result.verified and result.executed and not result.failed
    assert len(result.exec_time) == 7 and result.warmup == 2
    assert all(t > 0 for t in result.exec_time)
    assert result.obj_size == len(rec.load_code("cubin"))
    assert result.reg_usage > 0 and result.local_mem_usage == 0
    assert result.gpu_id == 0 and result.start_time and result.end_time
    assert not result.mismatches
    assert not replayer.relocated, replayer.relocation_reason  # fixed window, no globals
    assert not result.relocated


def test_cupti_timing_times_the_same_kernels(vecadd_path):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(vecadd_path))
    with Replayer(rec, rec.single_instance().record_id, timing="cupti") as replayer:
        result = replayer.run(replayer.baseline(), iterations=5, warmup=2)
        assert result.status == "verified", result.error
        cupti, events = replayer.last_timing["times_ns"], replayer.last_timing["event_times_ns"]
    assert result.exec_time == cupti and len(cupti) == 7 and all(t > 0 for t in cupti)
    # Both time the same launches: the kernel record lies inside its events.
    assert all(c <= e + 1000 for c, e in zip(cupti, events))


def test_block_size_that_still_covers_verifies(vecadd):
    _, inst, replayer = vecadd
    n = 1 << 20
    config = replayer.baseline().replace(block={"x": 512, "y": 1, "z": 1}, grid={"x": n // 512, "y": 1, "z": 1})
    result = replayer.run(config)
    assert result.status == "verified", result.error


def test_launch_that_leaves_work_undone_fails_verification(vecadd):
    _, inst, replayer = vecadd
    config = replayer.baseline().replace(block={"x": 128, "y": 1, "z": 1})  # recorded grid: half the threads
    result = replayer.run(config)
    assert result.status == "failed_verification"
    assert not result.verified and result.executed
    (mismatch,) = result.mismatches
    assert mismatch["region"] == "c"
    assert mismatch["mismatched_bytes"] > 0
    assert mismatch["first_mismatch_offset"] == (1 << 20) // 2 * 4  # the first element nobody computed
    assert "at_first_mismatch" in mismatch
    # The next configuration starts clean again.
    assert replayer.run(replayer.baseline()).status == "verified"


def test_deliberately_wrong_rewrite_fails_verification(vecadd):
    from mneme.replay.compile import CompiledCode, default_cache, ptxas_flags

    rec, _, replayer = vecadd
    ptx = rec.load_code("ptx").decode()
    assert "add.f32" in ptx
    wrong = ptx.replace("add.f32", "sub.f32")
    product = default_cache().compile(wrong, ptxas_flags(3, replayer.arch), replayer.arch)
    code = CompiledCode(product.image, "ptx", product.key, replayer.arch, wrong)
    result = replayer.run(replayer.baseline(), compiled=code)
    assert result.status == "failed_verification"
    assert result.mismatches[0]["region"] == "c"


@pytest.mark.parametrize("opt", [0, 1, 2, 4])
def test_codegen_opt_recompiles_and_verifies(vecadd, opt):
    _, _, replayer = vecadd
    config = replayer.baseline().replace(codegen_opt=opt)
    code = replayer.compile(config)
    assert code.tier == "ptx" and code.key
    result = replayer.run(config)
    assert result.status == "verified", result.error
    assert result.codegen_time > 0
    again = replayer.run(config)
    assert again.compile_cached and again.status == "verified"


def test_launch_bounds_directive_and_limit(vecadd):
    _, _, replayer = vecadd
    config = replayer.baseline().replace(set_launch_bounds=True, max_threads=256, min_blocks_per_sm=4)
    code = replayer.compile(config)
    assert ".maxntid 256, 1, 1" in code.ptx and ".minnctapersm 4" in code.ptx
    result = replayer.run(config)
    assert result.status == "verified", result.error
    # The driver enforces the bound: a bigger block cannot launch this code.
    too_big = config.replace(max_threads=128)
    assert too_big.validation_errors()  # 256 threads > max_threads: caught before any GPU work
    assert replayer.run(too_big).status == "invalid_config"


def test_register_cap_lowers_registers(tmp_path, vecadd_path):
    from mneme.replay import Replayer
    from mneme.replay.compile import CompileOptions

    rec = RecordedExecution.from_json(str(vecadd_path))
    inst = rec.single_instance()
    with Replayer(rec, inst.record_id, compile_options=CompileOptions(max_registers=16)) as capped:
        code = capped.compile(capped.baseline())
        result = capped.run(capped.baseline())
    assert code.tier == "ptx"  # a register cap recompiles
    assert result.status == "verified", result.error
    assert 0 < result.reg_usage <= 16


def test_specialize_replaces_scalar_loads(vecadd):
    _, _, replayer = vecadd
    config = replayer.baseline().replace(specialize=True)
    code = replayer.compile(config)
    assert "_param_3]" not in code.ptx.split(".entry")[1]  # n is an immediate now
    assert f"{1 << 20};" in code.ptx
    result = replayer.run(config)
    assert result.status == "verified", result.error


def test_specialize_dims_replaces_special_registers(vecadd):
    _, _, replayer = vecadd
    config = replayer.baseline().replace(specialize_dims=True)
    code = replayer.compile(config)
    body = code.ptx.split(".entry")[1]
    assert "%ntid.x" not in body
    result = replayer.run(config)
    assert result.status == "verified", result.error


def test_llvm_tier_without_bitcode_is_a_compile_error(vecadd):
    _, _, replayer = vecadd
    result = replayer.run(replayer.baseline().replace(passes="default<O1>"))
    assert result.status == "compile_error"
    assert "bitcode" in result.error and "mneme config cxx" in result.error


def test_invalid_config_is_a_failed_result(vecadd):
    _, _, replayer = vecadd
    result = replayer.run(ExperimentConfiguration.from_dict({"block": {"x": 2048}}))
    assert result.status == "invalid_config" and result.failed
    assert replayer.healthy


def test_in_place_and_atomic_kernel_verifies_on_every_launch(tmp_path):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(synth.axpy_count(tmp_path)))
    replayer = Replayer(rec, rec.single_instance().record_id, verification=VerificationSettings(every_iteration=True))
    with replayer:
        result = replayer.run(replayer.baseline(), iterations=5, warmup=2)
        assert result.status == "verified", result.error
        assert replayer.last_timing["checked_launches"] == list(range(7))
        # Recompiled code too (the counter and x are reset before every launch).
        result = replayer.run(replayer.baseline().replace(codegen_opt=1, specialize=True), iterations=5)
        assert result.status == "verified", result.error


def test_in_place_kernel_without_resets_fails_from_the_second_launch(tmp_path, monkeypatch):
    """The per-launch check can fail: skip the resets and every launch after the first is wrong."""
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(synth.axpy_count(tmp_path)))
    with Replayer(rec, rec.single_instance().record_id, verification=VerificationSettings(every_iteration=True)) as replayer:
        monkeypatch.setattr(replayer._state, "iteration_resets", lambda homes: [])
        result = replayer.run(replayer.baseline(), iterations=3, warmup=0)
        assert result.status == "failed_verification"
        failed = {m["region"]: m["failed_launches"] for m in result.mismatches}
        assert failed == {"x": [1, 2], "counter": [1, 2]}


def test_module_globals_are_restored_and_verified(tmp_path):
    rec, inst, replayer = _open(synth.scale_by_global(tmp_path))
    with replayer:
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1)
        assert result.status == "verified", result.error
        result = replayer.run(replayer.baseline().replace(codegen_opt=2), iterations=3, warmup=1)
        assert result.status == "verified", result.error


def test_relocatable_recording_follows_pointers_in_memory(tmp_path):
    rec, inst, replayer = _open(synth.gather_sum(tmp_path))
    with replayer:
        assert replayer.relocated
        result = replayer.run(replayer.baseline())
        assert result.status == "verified", result.error


def test_fixed_recording_replays_relocated_when_asked(vecadd_path):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(vecadd_path))
    with Replayer(rec, rec.single_instance().record_id, verification=VerificationSettings(relocate=True)) as replayer:
        assert replayer.relocated
        result = replayer.run(replayer.baseline())
        assert result.status == "verified", result.error
        assert result.relocated and result.relocation_reason == "relocation was asked for (relocate=True)"


def test_idempotent_kernel_is_reset_only_before_each_configuration(vecadd_path):
    """reset='auto': the baseline ran twice unreset and matched the epilogue both times, so launches after a
    configuration's first skip the copies; reset='always' keeps them."""
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(vecadd_path))
    record_id = rec.single_instance().record_id
    with Replayer(rec, record_id) as replayer:
        result = replayer.run(replayer.baseline(), iterations=5, warmup=2)
        assert result.status == "verified", result.error
        assert replayer.idempotent is True and replayer.last_timing["reset_each_launch"] is False
        undone = replayer.run(replayer.baseline().replace(grid={"x": 2048, "y": 1, "z": 1}), iterations=3, warmup=0)
        assert undone.status == "failed_verification"  # still checked, first launch and last
        assert replayer.run(replayer.baseline(), iterations=3).verified  # the next configuration starts clean
    with Replayer(rec, record_id, reset="always") as replayer:
        result = replayer.run(replayer.baseline(), iterations=5, warmup=2)
        assert result.status == "verified", result.error
        assert replayer.idempotent is None and replayer.last_timing["reset_each_launch"] is True


def test_get_ready_proves_the_reset_policy_before_any_configuration(vecadd_path):
    """What a server's Prepare does on each worker: the proof's two baseline launches happen then, and the
    first configuration's result is the same as without it."""
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(vecadd_path))
    record_id = rec.single_instance().record_id
    with Replayer(rec, record_id) as replayer:
        assert replayer.idempotent is None
        assert replayer.get_ready() == ""
        assert replayer.idempotent is True and replayer.healthy
        result = replayer.run(replayer.baseline(), iterations=5, warmup=2)
        assert result.status == "verified", result.error
        assert replayer.last_timing["reset_each_launch"] is False
        assert replayer.get_ready() == ""  # once proven, nothing more to do


def test_a_variant_that_is_correct_but_not_idempotent_is_judged_with_resets(vecadd_path):
    """reset='auto' proves the recorded vector add idempotent; a rewrite that is right from the recorded memory
    (c starts at 12345: c = a + b + (c - 12345)) but wrong on its own output is replayed again with the resets
    and verifies, as it would in the application."""
    from mneme.replay import Replayer
    from mneme.replay.compile import CompiledCode, default_cache, ptxas_flags

    rec = RecordedExecution.from_json(str(vecadd_path))
    with Replayer(rec, rec.single_instance().record_id) as replayer:
        assert replayer.run(replayer.baseline()).verified and replayer.idempotent is True
        ptx = rec.load_code("ptx").decode()
        store = "st.global.f32 \t[%rd10], %f3;"
        assert store in ptx and ".reg .f32 \t%f<4>;" in ptx
        c_minus_12345 = "ld.global.f32 \t%f4, [%rd10];\n\tsub.f32 \t%f5, %f4, 0f4640E400;\n\t"  # 12345.0f
        reads_c = ptx.replace(".reg .f32 \t%f<4>;", ".reg .f32 \t%f<6>;").replace(
            store, c_minus_12345 + "add.f32 \t%f3, %f3, %f5;\n\t" + store
        )
        product = default_cache().compile(reads_c, ptxas_flags(3, replayer.arch), replayer.arch)
        code = CompiledCode(product.image, "ptx", product.key, replayer.arch, reads_c)
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1, compiled=code)
        assert result.status == "verified", result.error
        assert replayer.last_timing["reset_each_launch"] is True
        assert replayer.run(replayer.baseline()).verified and replayer.last_timing["reset_each_launch"] is False


def test_in_place_kernel_is_not_idempotent_and_keeps_its_resets(tmp_path):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(synth.axpy_count(tmp_path)))
    with Replayer(rec, rec.single_instance().record_id, verification=VerificationSettings(every_iteration=True)) as replayer:
        assert replayer.uses_resets() and replayer.idempotent is False
        result = replayer.run(replayer.baseline(), iterations=4, warmup=1)
        assert result.status == "verified", result.error
        assert replayer.last_timing["reset_each_launch"] is True


def test_tolerance_policy_from_overrides(tmp_path):
    from mneme.replay import Replayer

    path = synth.vecadd(tmp_path, n=1 << 16, perturb=1e-6)
    rec = RecordedExecution.from_json(str(path))
    rid = rec.single_instance().record_id
    with Replayer(rec, rid) as bitwise:
        result = bitwise.run(bitwise.baseline())
        assert result.status == "failed_verification"
    for spec in ("f32:relative:1e-5", "f32:relative:1e-5:l2", "f32:absolute:1e-3:linf", "f32:relative:1e-5:l1"):
        with Replayer(rec, rid, verification=VerificationSettings(overrides={"c": spec})) as tolerant:
            result = tolerant.run(tolerant.baseline())
            assert result.status == "verified", (spec, result.error)
    with Replayer(rec, rid, verification=VerificationSettings(overrides={"c": "f32:relative:1e-9"})) as strict:
        result = strict.run(strict.baseline())
        assert result.status == "failed_verification"
        assert result.mismatches[0]["mismatched_elements"] > 0
        assert result.mismatches[0]["max_rel_diff"] > 1e-9


def test_engine_tolerance_statistics_match_numpy():
    import numpy as np

    from mneme.format.policy import VerifyPolicy
    from mneme.replay.engine import require_driver
    from mneme.replay.tolerance import engine_check, judge, norms

    native = require_driver()
    ctx = native.Context(0)
    rng = np.random.default_rng(5)
    ref = rng.standard_normal(10_001).astype(np.float64)
    got = ref + rng.standard_normal(ref.size) * 1e-7
    a, b = ctx.alloc(ref.nbytes), ctx.alloc(ref.nbytes)
    ctx.upload(a.ptr, got.tobytes())
    ctx.upload(b.ptr, ref.tobytes())
    d = np.abs(got - ref)
    for norm, expect in (("l1", d.sum()), ("l2", np.sqrt((d * d).sum())), ("linf", d.max())):
        policy = VerifyPolicy("f64", "absolute", 1.0, norm)
        ((stats, counters),) = ctx.compare([engine_check(a.ptr, b.ptr, ref.nbytes, policy)])
        assert norms(norm, stats)[0] == pytest.approx(expect, rel=1e-9)
        assert judge(policy, stats, counters, ref.nbytes).passed
    policy = VerifyPolicy("f64", "absolute", float(np.sort(d)[-4]), "none")  # 3 elements above
    ((stats, counters),) = ctx.compare([engine_check(a.ptr, b.ptr, ref.nbytes, policy)])
    assert counters[0] == 3
    a.free(), b.free()


def test_faulting_kernel_is_a_runtime_error_and_poisons_the_replayer(tmp_path):
    """Run in a child: the fault destroys the CUDA context of its process."""
    path = synth.vecadd_wild_pointer(tmp_path)
    code = textwrap.dedent(
        f"""
        import json
        from mneme.recording.execution import RecordedExecution
        from mneme.replay import Replayer
        rec = RecordedExecution.from_json({str(path)!r})
        r = Replayer(rec, rec.single_instance().record_id)
        first = r.run(r.baseline())
        second = r.run(r.baseline())
        print(json.dumps([first.status, first.error, r.healthy, second.status, second.error]))
        """
    )
    env = child_env()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    status, error, healthy, second_status, second_error = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == "runtime_error" and "ILLEGAL_ADDRESS" in error
    assert healthy is False
    assert second_status == "runtime_error" and "fresh process" in second_error


def test_hanging_kernel_times_out_and_poisons_the_replayer(tmp_path):
    """Run in a child: the hanging kernel keeps its context busy until the process ends."""
    path = synth.hang(tmp_path)
    code = textwrap.dedent(
        f"""
        import json, time
        from mneme.recording.execution import RecordedExecution
        from mneme.replay import Replayer
        rec = RecordedExecution.from_json({str(path)!r})
        r = Replayer(rec, rec.single_instance().record_id, timeout_s=1.0)
        t0 = time.monotonic()
        result = r.run(r.baseline(), iterations=1, warmup=0)
        print(json.dumps([result.status, result.error, r.healthy, time.monotonic() - t0]), flush=True)
        import os; os._exit(0)  # as the CLI does: the kernel still runs, clean-up would wait for it
        """
    )
    env = child_env()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    status, error, healthy, seconds = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == "timeout" and "timeout" in error and healthy is False
    assert seconds < 10


def test_cli_replay_prints_config_and_result(vecadd_path):
    env = child_env()
    out = subprocess.run(
        [sys.executable, "-m", "mneme", "replay", "-rdb", str(vecadd_path), "-bidx", "512", "-gidx", str((1 << 20) // 512),
         "-it", "4", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout
    data = json.loads(out.stdout)
    assert data["Replay-config"]["block"]["x"] == 512
    assert data["Result"]["verified"] is True and len(data["Result"]["exec_time"]) == 6
    plain = subprocess.run(
        [sys.executable, "-m", "mneme", "replay", "-rdb", str(vecadd_path), "-bidx", "128"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert plain.returncode == 1
    assert plain.stdout.startswith('"Replay-config": {') and '"Result": {' in plain.stdout


# -- several configurations in one engine call (Replayer.start_many / run_many) ---------------------------------

def test_a_batch_of_configurations_gives_what_each_alone_gives(vecadd):
    """One engine call, one synchronization: the same statuses and fields as one call each, kernel times
    within a few percent, and the mismatch report of the one that leaves work undone read from its own
    output (it is replayed alone for it)."""
    _, _, replayer = vecadd
    n = 1 << 20
    shapes = [(256, n // 256), (512, n // 512), (128, n // 256), (1024, n // 1024), (64, n // 64)]
    configs = [replayer.baseline().replace(block={"x": b, "y": 1, "z": 1}, grid={"x": g, "y": 1, "z": 1})
               for b, g in shapes]
    alone = [replayer.run(c, iterations=20, warmup=2) for c in configs]
    together = replayer.run_many([(c, 20, 2, None) for c in configs])
    assert [r.status for r in together] == [r.status for r in alone] == \
        ["verified", "verified", "failed_verification", "verified", "verified"]
    for a, b in zip(alone, together):
        assert len(a.exec_time) == len(b.exec_time) == 22 and a.reg_usage == b.reg_usage
        if a.verified:
            ratio = (sum(b.measured_times) / len(b.measured_times)) / (sum(a.measured_times) / len(a.measured_times))
            assert 0.9 < ratio < 1.1, (a.measured_times, b.measured_times)
    (mismatch,) = together[2].mismatches
    assert mismatch["first_mismatch_offset"] == (1 << 20) // 2 * 4 and "at_first_mismatch" in mismatch
    assert mismatch == alone[2].mismatches[0]


def test_the_next_batch_is_enqueued_while_one_runs(vecadd):
    _, _, replayer = vecadd
    n = 1 << 20
    configs = [replayer.baseline().replace(block={"x": b, "y": 1, "z": 1}, grid={"x": n // b, "y": 1, "z": 1})
               for b in (128, 256, 512, 1024)]
    first = replayer.start_many([(c, 50, 2, None) for c in configs[:2]])
    second = replayer.start_many([(c, 50, 2, None) for c in configs[2:]])
    assert [r.status for r in first.results() + second.results()] == ["verified"] * 4
    assert replayer.run(replayer.baseline()).status == "verified"  # and a single replay after them


def test_a_batch_dropped_without_waiting_spoils_nothing_after_it(vecadd):
    """A batch nobody waits for (dropped while the GPU runs it) gives its buffers and events back once the GPU
    is done with it, seen without waiting where it is dropped: the batches after it take them and verify."""
    _, _, replayer = vecadd
    n = 1 << 20
    configs = [replayer.baseline().replace(block={"x": b, "y": 1, "z": 1}, grid={"x": n // b, "y": 1, "z": 1})
               for b in (128, 256, 512, 1024)]
    for _ in range(3):
        dropped = replayer.start_many([(c, 100, 2, None) for c in configs[:2]])
        del dropped  # the engine's batch goes with it, unwaited
        kept = replayer.start_many([(c, 20, 2, None) for c in configs[2:]])
        assert [r.status for r in kept.results()] == ["verified"] * 2
    assert [r.status for r in replayer.run_many([(c, 5, 2, None) for c in configs])] == ["verified"] * 4


def test_a_batch_of_recompiled_variants_verifies(vecadd):
    _, _, replayer = vecadd
    configs = [replayer.baseline().replace(codegen_opt=opt) for opt in (0, 1, 2, 3, 4)]
    compiled = [replayer.compile(c) for c in configs]
    results = replayer.run_many([(c, 5, 2, code) for c, code in zip(configs, compiled)])
    assert [r.status for r in results] == ["verified"] * 5, [r.error for r in results]
