"""``Replayer.run`` on the CPU: statuses, judging, resets, the reset policy's proof and ``auto``'s bounds.

The fake native engine (mneme/testing/fake_native_engine.py) loads modules and runs launches
when its address space has a ``FakeKernel``: every run's arguments are recorded and the kernel
says which checks differ from the epilogue, so what the replayer asks the engine for and what it
makes of the answers are checked without a GPU (tests/gpu/test_replay.py runs the real thing).
"""

from __future__ import annotations

import json

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.model.verification import ResetDecision, VerificationSettings
from mneme.recording.execution import RecordedExecution
from mneme.replay import engine as eng
from mneme.replay import placement
from mneme.replay.placement import ProcessReservations
from mneme.replay.readiness import proof_watchdog
from mneme.testing.fake_native_engine import AddressSpace, FakeKernel, cuda_error, native_module

N, BLOCK = 4096, 256
A, B, C = range(3)  # the vector add's regions, in the order of the engine's checks


@pytest.fixture
def kernel(monkeypatch, tmp_path) -> FakeKernel:
    """The fake engine's kernel: modules load, launches run (nothing differs unless a test says so)."""
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    space = AddressSpace(kernel=FakeKernel())
    monkeypatch.setattr(eng, "_engine", native_module(space))
    monkeypatch.setattr(placement, "_process", ProcessReservations())
    return space.kernel


@pytest.fixture
def vecadd_db(tmp_path):
    return synth.vecadd(tmp_path / "rec", n=N, block=BLOCK)


def _replayer(db, **options):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(db))
    return Replayer(rec, rec.single_instance().record_id, **options)


def _is_proof(first, second) -> bool:
    """The proof: one launch from the recorded memory, then one more on what it left, under the proof's watchdog."""
    return (first.launches == second.launches == 1 and first.resets == second.resets == []
            and first.check_launches == second.check_launches == [0] and first.queue_ahead_ns == 0
            and first.from_recorded and not second.from_recorded and second.timeout_s == pytest.approx(0.05))


def _second_launch(run, launch) -> bool:
    """Whether ``launch`` of ``run`` starts from what an earlier launch left (no reset before it)."""
    return not run.resets and (launch > 0 or not run.from_recorded)


def test_the_baseline_verifies_after_the_proof_and_skips_the_resets(kernel, vecadd_db):
    with _replayer(vecadd_db) as replayer:
        assert replayer.idempotent is None
        result = replayer.run(replayer.baseline(), iterations=5, warmup=2)
        assert result.status == "verified", result.error
        assert replayer.idempotent is True and replayer.healthy
        first, second, timed = kernel.runs
        assert _is_proof(first, second) and first.grid == (N // BLOCK, 1, 1) and len(first.checks) == 3
        assert timed.launches == 7 and timed.resets == [] and timed.check_launches == [0, 6]
        assert timed.queue_ahead_ns == 20_000 + 20_000 * 7 and timed.l2_scrub_bytes == 0 and not timed.cupti
        assert replayer.last_timing == {
            "wall_ns": 12_000, "gpu_span_ns": 7000, "queue_ahead_ns": 160_000, "launches": 7,
            "times_ns": [1000] * 7, "event_times_ns": [1000] * 7, "checked_launches": [0, 6],
            "reset_each_launch": False,
        }  # fmt: skip
        again = replayer.run(replayer.baseline(), iterations=1, warmup=0)
        assert len(kernel.runs) == 4  # proven once
    assert result.exec_time == [1000] * 7 and result.warmup == 2 and result.executed and not result.failed
    assert result.reg_usage == 16 and result.shared_mem_usage == 0 and result.local_mem_usage == 0
    assert result.codegen_time == pytest.approx(0.001)  # the module's load, counted by the run that loaded it
    assert again.codegen_time == 0.0 and again.exec_time == [1000]
    assert result.verified_within == {} and result.nondeterminism == [] and result.exact
    assert not result.relocated and result.gpu_id == 0 and result.start_time and result.end_time


def test_reset_always_resets_before_every_launch_without_a_proof(kernel, vecadd_db):
    with _replayer(vecadd_db, reset="always") as replayer:
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1)
        assert result.status == "verified" and replayer.idempotent is None
        (timed,) = kernel.runs
        (c,) = [r for r in replayer.regions if r.name == "c"]
        assert timed.resets == [(c.live, c.pristine.ptr, N * 4)]
        assert replayer.last_timing["reset_each_launch"] is True


def test_every_iteration_checks_every_launch(kernel, vecadd_db):
    with _replayer(vecadd_db, verification=VerificationSettings(every_iteration=True)) as replayer:
        replayer.run(replayer.baseline(), iterations=3, warmup=1)
        assert kernel.runs[-1].check_launches == [0, 1, 2, 3]
        assert replayer.last_timing["checked_launches"] == [0, 1, 2, 3]


def test_a_kernel_whose_second_launch_differs_is_not_idempotent_and_keeps_its_resets(kernel, vecadd_db):
    kernel.differs = lambda run, launch, check: 4 if (check == C and _second_launch(run, launch)) else 0
    with _replayer(vecadd_db) as replayer:
        assert replayer.get_ready() == "" and replayer.idempotent is False
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1)
        assert result.status == "verified", result.error
        assert kernel.runs[-1].resets and replayer.last_timing["reset_each_launch"] is True


def test_a_variant_right_only_from_the_recorded_memory_is_judged_again_with_resets(kernel, vecadd_db):
    recorded_grid = (N // BLOCK, 1, 1)
    kernel.differs = lambda run, launch, check: (
        8 if (check == C and _second_launch(run, launch) and run.grid != recorded_grid) else 0)
    with _replayer(vecadd_db) as replayer:
        config = replayer.baseline().replace(grid={"x": 32, "y": 1, "z": 1})
        result = replayer.run(config, iterations=3, warmup=1)
        assert result.status == "verified", result.error
        first, second, unreset, reset = kernel.runs
        assert _is_proof(first, second) and unreset.resets == [] and reset.resets
        assert replayer.last_timing["reset_each_launch"] is True
        assert replayer.run(replayer.baseline()).verified
        assert replayer.last_timing["reset_each_launch"] is False


def test_a_mismatch_is_reported_per_region_with_the_failing_launches(kernel, vecadd_db):
    kernel.differs = lambda run, launch, check: 12 if check == C and run.grid == (8, 1, 1) else 0
    with _replayer(vecadd_db) as replayer:
        result = replayer.run(replayer.baseline().replace(grid={"x": 8, "y": 1, "z": 1}), iterations=2, warmup=1)
        assert replayer.run(replayer.baseline()).verified  # the next configuration starts clean
    assert result.status == "failed_verification" and result.executed and not result.verified
    assert not result.failed and result.exec_time == [1000] * 3
    (mismatch,) = result.mismatches
    base, recorded = _epilogue_of_c(vecadd_db)
    assert mismatch == {
        "region": "c", "kind": "heap", "base": hex(base), "size": N * 4,
        "failed_launches": [0, 2], "launches_checked": 2, "policy": "bitwise", "mismatched_bytes": 12,
        "first_mismatch_offset": 0,
        "at_first_mismatch": {"replayed": "00" * 16, "recorded": recorded[:16].hex()},  # the fake copies nothing
    }  # fmt: skip
    assert result.error == "verification failed: region c (heap): 12 of 16384 bytes differ (first at offset 0); " \
                           "failed launches [0, 2]"
    assert result.nondeterminism == []  # not the recorded launch: not probed


def _epilogue_of_c(db) -> tuple[int, bytes]:
    rec = RecordedExecution.from_json(str(db))
    (c,) = [r for r in rec.single_instance().load_epilogue().regions if r.name == "c"]
    return c.base, c.read(rec.store)


def test_a_failing_baseline_is_replayed_to_tell_nondeterminism(kernel, vecadd_db):
    """exact mode: the recorded launch that fails is replayed ``runs`` times; regions that differ run to run
    are named, with the hint that auto verifies them."""
    kernel.differs = lambda run, launch, check: (launch + 1) if check == C else 0
    with _replayer(vecadd_db) as replayer:
        result = replayer.run(replayer.baseline(), iterations=2, warmup=0)
        probe = kernel.runs[-1]
        assert probe.launches == 8 and probe.check_launches == list(range(8)) and probe.resets
        assert replayer.derived is None
    assert result.status == "failed_verification"
    (finding,) = result.nondeterminism
    assert finding["region"] == "c" and finding["classification"] == "nondeterministic"
    assert finding["dtype"] == "f32" and finding["max_ulp"] == 8 and finding["runs"] == 8
    assert "the recorded launch replayed 8 times: " in result.error
    assert result.error.endswith("; nondeterministic regions verify with --tolerance auto")


def test_auto_derives_bounds_stores_them_and_judges_with_them(kernel, vecadd_db):
    kernel.differs = lambda run, launch, check: (launch % 3 + 1) if check == C else 0
    auto = VerificationSettings(mode="auto")
    with _replayer(vecadd_db, verification=auto) as replayer:
        assert replayer.get_ready() == ""
        probe, first, second = kernel.runs
        assert probe.launches == 8 and _is_proof(first, second)
        assert replayer.idempotent is True  # the proof's checks judge with the derived bound
        assert replayer.derived_stored.startswith("written to ") and "tolerance.json" in replayer.derived_stored
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1)
    assert result.status == "verified", result.error
    assert not result.exact
    within = result.verified_within["c"]
    assert within["policy"] == "f32:ulp:12"
    assert within["source"] == "auto" and within["exact"] is False and within["derived"]["runs"] == 8
    assert within["worst"] == {"differing_elements": 1, "max_ulp": 1, "max_abs_diff": 1e-7, "max_rel_diff": 1e-7}
    assert [f["region"] for f in result.nondeterminism] == ["c"]
    sidecar = json.loads((vecadd_db.parent / vecadd_db.name.replace(".json", ".tolerance.json")).read_text())
    assert list(sidecar["instances"]) == [RecordedExecution.from_json(str(vecadd_db)).single_instance().record_id]
    kernel.runs.clear()
    with _replayer(vecadd_db, verification=auto) as again:  # the stored bounds: no probe
        assert again.run(again.baseline()).verified
        assert again.derived_stored.startswith("read from ") and not any(r.launches == 8 for r in kernel.runs)


def test_overrides_judge_their_regions_and_name_their_source(kernel, vecadd_db):
    kernel.differs = lambda run, launch, check: 3 if check == C else 0
    tolerant = VerificationSettings(overrides={"c": "f32:ulp:4"})
    with _replayer(vecadd_db, verification=tolerant, reset="always") as replayer:
        result = replayer.run(replayer.baseline())
    assert result.status == "verified", result.error
    assert result.verified_within["c"]["source"] == "flag" and "derived" not in result.verified_within["c"]
    with pytest.raises(Exception, match="match no recorded region"):
        _replayer(vecadd_db, verification=VerificationSettings(overrides={"nope": "f32:ulp:4"}))


def test_too_many_threads_and_too_much_shared_memory_are_invalid_launches(kernel, vecadd_db):
    kernel.attributes["max_threads_per_block"] = 256
    with _replayer(vecadd_db, reset="always") as replayer:
        wide = replayer.run(replayer.baseline().replace(block={"x": 512, "y": 1, "z": 1},
                                                        grid={"x": 8, "y": 1, "z": 1}))  # fmt: skip
        big = replayer.run(replayer.baseline().replace(shared_mem=64 * 1024))
        huge = replayer.run(replayer.baseline().replace(shared_mem=228 * 1024))
    assert wide.status == "invalid_launch" and wide.reg_usage == 16 and not wide.executed
    assert "512 threads per block exceed what this kernel can launch with (256" in wide.error
    assert big.status == "verified" and kernel.runs[-1].shared_mem == 64 * 1024
    assert huge.status == "invalid_launch" and huge.error.startswith("shared_mem=233472 is not possible: ")


def test_the_cluster_of_the_recorded_launch_constrains_the_grid(kernel, vecadd_db):
    from mneme.replay.launch_attrs import LaunchPlan

    with _replayer(vecadd_db, reset="always") as replayer:
        replayer.launch_plan = LaunchPlan(((4, b"\2\0\0\0" + bytes(60)),), ("cluster_dim",), (2, 1, 1))
        odd = replayer.run(replayer.baseline().replace(grid={"x": 15, "y": 1, "z": 1}))
        even = replayer.run(replayer.baseline())
    assert odd.status == "invalid_launch" and "cluster dimension x=2" in odd.error and odd.obj_size > 0
    assert even.status == "verified" and kernel.runs[-1].attributes == [(4, b"\2\0\0\0" + bytes(60))]


def test_invalid_configurations_fail_before_any_launch(kernel, vecadd_db):
    with _replayer(vecadd_db) as replayer:
        zero = replayer.run(replayer.baseline(), iterations=0)
        wrong = replayer.run({"block": 1})
    assert zero.status == "invalid_config" and "iterations=0 must be at least 1" in zero.error
    assert wrong.status == "invalid_config" and "expected an ExperimentConfiguration, got dict" in wrong.error
    assert kernel.runs == []


def test_a_compile_error_is_a_failed_result(kernel, vecadd_db):
    with _replayer(vecadd_db) as replayer:
        result = replayer.run(replayer.baseline().replace(passes="default<O1>"))
    assert result.status == "compile_error" and "bitcode" in result.error


@pytest.mark.parametrize(
    ("code", "name", "status", "healthy"),
    [(1, "CUDA_ERROR_INVALID_VALUE", "invalid_launch", True), (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "runtime_error", False),
     (702, "CUDA_ERROR_LAUNCH_TIMEOUT", "timeout", False), (2, "CUDA_ERROR_OUT_OF_MEMORY", "runtime_error", True)],
)  # fmt: skip
def test_driver_errors_of_a_launch_become_statuses(kernel, vecadd_db, code, name, status, healthy):
    with _replayer(vecadd_db, reset="always") as replayer:
        kernel.errors.append(cuda_error("cuLaunchKernel", code, name))
        result = replayer.run(replayer.baseline())
        assert result.status == status and name in result.error and replayer.healthy is healthy
        assert result.executed is (status != "invalid_launch") and result.reg_usage == 16
        later = replayer.run(replayer.baseline())
    assert later.status == ("verified" if healthy else "runtime_error")
    if not healthy:
        assert "fresh process" in later.error and "context is destroyed" in result.error


def test_a_proof_that_destroys_the_context_makes_the_replayer_unusable(kernel, vecadd_db):
    with _replayer(vecadd_db) as replayer:
        kernel.errors.append(cuda_error("cuLaunchKernel", 700, "CUDA_ERROR_ILLEGAL_ADDRESS"))
        why = replayer.get_ready()
        assert "launched to prove the kernel idempotent, failed" in why and not replayer.healthy
        later = replayer.run(replayer.baseline())
    assert later.status == "runtime_error" and "earlier fault" in later.error and not later.executed
    with _replayer(vecadd_db) as replayer:  # the proof as part of the first run: its failure is the run's
        kernel.errors.append(cuda_error("cuLaunchKernel", 702, "CUDA_ERROR_LAUNCH_TIMEOUT"))
        result = replayer.run(replayer.baseline())
    assert result.status == "timeout" and result.executed and result.failed
    assert result.error.startswith("the recorded baseline, launched to prove the kernel idempotent, did not finish")


def test_a_refused_proof_only_means_not_proven(kernel, vecadd_db):
    with _replayer(vecadd_db) as replayer:
        kernel.errors.append(cuda_error("cuLaunchKernel", 1, "CUDA_ERROR_INVALID_VALUE"))
        assert replayer.get_ready() == "" and replayer.idempotent is False and replayer.healthy


def test_a_bug_of_ours_is_an_internal_error(kernel, vecadd_db):
    kernel.errors.append(ValueError("boom"))
    with _replayer(vecadd_db, reset="always") as replayer:
        result = replayer.run(replayer.baseline())
    assert result.status == "internal_error" and "ValueError: boom" in result.error


def test_module_globals_are_checked_where_the_module_has_them(kernel, tmp_path):
    kernel.globals = {"g_scale": 16, "g_hits": 4}
    with _replayer(synth.scale_by_global(tmp_path), reset="always") as replayer:
        assert replayer.run(replayer.baseline()).verified
        (timed,) = kernel.runs
        assert len(timed.checks) == 3 and not replayer.relocated_heap
    kernel.globals = {"g_scale": 16}
    with _replayer(synth.scale_by_global(tmp_path / "again"), reset="always") as replayer:
        result = replayer.run(replayer.baseline())
    assert result.status == "compile_error" and "the recorded module has no global 'g_hits'" in result.error


# -- kernels that are not idempotent: the proof only ever speeds replays up ---------------------------------
def test_a_kernel_that_changes_its_output_on_a_second_launch_resets_every_launch_and_says_why(kernel, vecadd_db):
    kernel.differs = lambda run, launch, check: 4 if (check == C and _second_launch(run, launch)) else 0
    with _replayer(vecadd_db) as replayer:
        result = replayer.run(replayer.baseline(), iterations=3, warmup=1)
        assert replayer.reset_decision() == ResetDecision(True, result.reset_reason)
    assert result.verified and result.reset_each_launch
    assert result.reset_reason.startswith("the kernel is not idempotent: a second launch without a reset changed c")


@pytest.mark.parametrize(("code", "name", "what"), [(702, "CUDA_ERROR_LAUNCH_TIMEOUT", "did not finish"),
                                                     (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "failed")])
def test_a_second_launch_that_hangs_or_faults_decides_resets_for_the_next_process(kernel, vecadd_db, code, name, what):
    kernel.errors.extend([None, cuda_error("cuLaunchKernel", code, name)])  # the first launch runs, the second fails
    with _replayer(vecadd_db) as replayer:
        why = replayer.get_ready()
        assert "replay in a fresh process with resets before every launch" in why and not replayer.healthy
        decision = replayer.reset_decision()
    assert decision.each_launch and f"a second launch without a reset (watchdog 0.05 s) {what}" in decision.reason
    kernel.runs.clear()
    with _replayer(vecadd_db, reset_decision=decision) as fresh:  # the next process: no proof, resets every launch
        result = fresh.run(fresh.baseline(), iterations=2, warmup=1)
        (timed,) = kernel.runs
    assert result.verified and timed.resets and result.reset_each_launch and result.reset_reason == decision.reason


def test_a_recorded_launch_that_fails_by_itself_decides_nothing(kernel, vecadd_db):
    kernel.errors.append(cuda_error("cuLaunchKernel", 700, "CUDA_ERROR_ILLEGAL_ADDRESS"))
    with _replayer(vecadd_db) as replayer:
        assert "in its first launch" in replayer.get_ready()
        assert replayer.reset_decision() is None  # resets before every launch would not help


def test_idempotent_kernels_and_reset_always_say_so(kernel, vecadd_db):
    with _replayer(vecadd_db) as replayer:
        proven = replayer.run(replayer.baseline())
        assert replayer.reset_decision() == ResetDecision(False, "")
    with _replayer(vecadd_db, reset="always") as replayer:
        always = replayer.run(replayer.baseline())
        assert replayer.reset_decision() == ResetDecision(True, "the reset policy is always")
    assert not proven.reset_each_launch and proven.reset_reason == ""
    assert always.reset_each_launch and always.reset_reason == "the reset policy is always"


def test_the_proofs_watchdog_comes_from_the_kernels_time():
    assert proof_watchdog(None) == pytest.approx(1.0)  # unknown: 20 x 50 ms
    assert proof_watchdog(1000) == pytest.approx(0.05)  # short kernels: the floor
    assert proof_watchdog(10_000_000) == pytest.approx(0.2)  # 10 ms: 20 x


# -- several configurations in one engine call (Replayer.run_many) ------------------------------------------

_VOLATILE = ("start_time", "end_time", "codegen_time")


def _same(a, b) -> bool:
    """Two results alike but for their times of day and the module's load time (counted once)."""
    da, db = a.to_dict(), b.to_dict()
    return {k: v for k, v in da.items() if k not in _VOLATILE} == {k: v for k, v in db.items() if k not in _VOLATILE}


def _shapes(replayer, blocks=(128, 256, 512)):
    return [replayer.baseline().replace(grid={"x": N // b}, block={"x": b}) for b in blocks]


def test_run_many_gives_what_run_gives_in_one_engine_call(kernel, vecadd_db):
    space_batches = eng._engine.Context().space.batches
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        configs = _shapes(replayer)
        one_by_one = [replayer.run(c, iterations=3, warmup=2) for c in configs]
        runs_before = len(kernel.runs)
        together = replayer.run_many([(c, 3, 2, None) for c in configs])
    assert space_batches == [3]
    assert all(_same(a, b) for a, b in zip(one_by_one, together)) and all(r.verified for r in together)
    batch_runs = kernel.runs[runs_before:]
    assert [r.block for r in batch_runs] == [(128, 1, 1), (256, 1, 1), (512, 1, 1)]
    assert all(r.from_recorded and r.resets == [] and r.check_launches == [0, 4] for r in batch_runs)


def test_run_many_answers_invalid_configurations_alone_and_runs_the_rest(kernel, vecadd_db):
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        good = _shapes(replayer, (128, 256))
        bad = replayer.baseline().replace(block={"x": 2048})
        results = replayer.run_many([(good[0], 3, 2, None), (bad, 3, 2, None), (good[1], 3, 2, None)])
    assert [r.status for r in results] == ["verified", "invalid_config", "verified"]


def test_run_many_replays_a_configuration_right_only_from_the_recorded_memory_with_resets(kernel, vecadd_db):
    kernel.differs = lambda run, launch, check: 3 if check == C and run.block == (512, 1, 1) and launch > 0 \
        and not run.resets else 0
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        results = replayer.run_many([(c, 3, 2, None) for c in _shapes(replayer)])
    assert [r.status for r in results] == ["verified"] * 3
    assert [r.reset_each_launch for r in results] == [False, False, True]


def test_a_launch_the_driver_refuses_in_a_shared_call_is_replayed_alone(kernel, vecadd_db):
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        configs = _shapes(replayer)
        # the shared call fails at its first item; alone, the second configuration is refused again
        kernel.errors += [cuda_error("cuLaunchKernel", 1, "CUDA_ERROR_INVALID_VALUE"), None,
                          cuda_error("cuLaunchKernel", 1, "CUDA_ERROR_INVALID_VALUE")]
        results = replayer.run_many([(c, 3, 2, None) for c in configs])
        assert replayer.healthy
    assert [r.status for r in results] == ["verified", "invalid_launch", "verified"]


def test_a_shared_call_that_destroys_the_context_says_which_is_unknown(kernel, vecadd_db):
    from mneme.replay.replayer import BatchLost

    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        kernel.errors.append(cuda_error("cuLaunchKernel", 700, "CUDA_ERROR_ILLEGAL_ADDRESS"))
        with pytest.raises(BatchLost, match="replayed alone"):
            replayer.run_many([(c, 3, 2, None) for c in _shapes(replayer)])
        assert not replayer.healthy


def test_run_many_without_an_engine_call_for_several_runs_each(kernel, vecadd_db, monkeypatch):
    from mneme.testing.fake_native_engine import FakeContext

    monkeypatch.delattr(FakeContext, "start_batch")
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        results = replayer.run_many([(c, 3, 2, None) for c in _shapes(replayer)])
    assert [r.status for r in results] == ["verified"] * 3


def test_a_configuration_of_a_batch_that_does_not_verify_is_replayed_alone_for_its_report(kernel, vecadd_db):
    """After a shared call the memory holds the last configuration's output: a mismatch's report (the bytes
    read back) comes from a replay of its own."""
    kernel.differs = lambda run, launch, check: 5 if check == C and run.block == (512, 1, 1) else 0
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        before = len(kernel.runs)
        results = replayer.run_many([(c, 3, 2, None) for c in _shapes(replayer, (128, 512, 1024))])
    assert [r.status for r in results] == ["verified", "failed_verification", "verified"]
    assert [r.block[0] for r in kernel.runs[before:]] == [128, 512, 1024, 512]
    assert results[1].mismatches[0]["failed_launches"] == [0, 4]


def test_the_next_batch_is_enqueued_before_the_last_ones_results_are_taken(kernel, vecadd_db):
    space_batches = eng._engine.Context().space.batches
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        first = replayer.start_many([(c, 3, 2, None) for c in _shapes(replayer, (128, 256))])
        second = replayer.start_many([(c, 3, 2, None) for c in _shapes(replayer, (512, 1024))])
        assert space_batches == [2, 2] and [r.block[0] for r in kernel.runs[-4:]] == [128, 256, 512, 1024]
        assert [r.status for r in first.results() + second.results()] == ["verified"] * 4
        assert first.results() is first.results()  # taken once


def test_a_batch_whose_gpu_work_destroys_the_context_raises_when_its_results_are_taken(kernel, vecadd_db):
    from mneme.replay.replayer import BatchLost

    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        kernel.errors.append(cuda_error("cuLaunchKernel", 702, "CUDA_ERROR_LAUNCH_TIMEOUT"))
        batch = replayer.start_many([(c, 3, 2, None) for c in _shapes(replayer)])
        with pytest.raises(BatchLost):
            batch.results()
        assert not replayer.healthy


def test_a_batchs_results_wait_for_nothing_enqueued_after_it(kernel, vecadd_db):
    """A batch whose results are taken with another batch enqueued behind it (a pipelined worker) waits only
    for its own work: with a kernel that never ends behind it, its verified configurations are judged without
    a call that waits for the device (the fake records any as ``blocked``); one that did not verify, whose
    verdict needs a replay of its own (behind the hanging one), is left unjudged (None) to be replayed alone."""
    space = eng._engine.Context().space
    kernel.hangs = lambda run: run.block == (1024, 1, 1)
    kernel.differs = lambda run, launch, check: 5 if check == C and run.block == (256, 1, 1) else 0
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        first = replayer.start_many([(c, 3, 2, None) for c in _shapes(replayer, (128, 256))])
        behind = replayer.start_many([(c, 3, 2, None) for c in _shapes(replayer, (512, 1024))])
        assert first.enqueued and behind.enqueued and len(space.hung) == 1
        results = first.results(enqueued_behind=True)
        assert space.blocked == []
        assert results[0].status == "verified" and results[1] is None
        assert not behind.ready()
        space.hung.clear()  # (the fake's context outlives the hang: closing frees its memory)


def test_one_configuration_or_an_unbatchable_group_replays_when_its_results_are_taken(kernel, vecadd_db):
    """start_many of what cannot share an engine call launches nothing until its results are taken (the
    batch before it is answered first, and nothing is enqueued behind it: ``enqueued`` False)."""
    with _replayer(vecadd_db) as replayer:
        replayer.get_ready()
        first = replayer.start_many([(c, 3, 2, None) for c in _shapes(replayer, (128, 256))])
        runs = len(kernel.runs)
        lone = replayer.start_many([(c, 3, 2, None) for c in _shapes(replayer, (512,))])
        assert len(kernel.runs) == runs and not lone.enqueued and first.enqueued
        assert [r.status for r in first.results()] == ["verified"] * 2
        assert [r.status for r in lone.results()] == ["verified"] and len(kernel.runs) == runs + 1
        assert lone.results() is lone.results()
