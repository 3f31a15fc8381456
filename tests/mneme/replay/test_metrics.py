"""Hardware counters on the CPU: the curated names, their resolution per chip, the errors, and the replayer's step.

The replayer's plumbing runs against the fake native engine (``mneme.testing.fake_native_engine``: a chip
with a fixed set of metrics, ``profile`` returning the kernel's counters); the resolution of every curated
metric runs against CUPTI's real host side where the engine is built with it (no GPU needed: the host side
works from the chip's name). tests/gpu/test_metrics_gpu.py collects real counters.
"""

from __future__ import annotations

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.errors import ConfigurationError, NotAvailableError
from mneme.recording.execution import RecordedExecution
from mneme.replay import engine as eng
from mneme.replay import placement
from mneme.replay.metrics import (
    CURATED,
    GROUPS,
    STALL_REASONS,
    CounterProfiler,
    expand,
    explain,
    objective_direction,
    parse_metric_names,
    resolve,
)
from mneme.replay.placement import ProcessReservations
from mneme.testing import fake_native_engine as fake
from mneme.testing.fake_native_engine import AddressSpace, FakeKernel, cuda_error, native_module, profiler_error

N, BLOCK = 4096, 256


# -- names -----------------------------------------------------------------------------------------------
def test_names_are_comma_separated_repeatable_and_kept_once_in_order():
    assert parse_metric_names("dram_bytes, l2_hit_rate") == ("dram_bytes", "l2_hit_rate")
    assert parse_metric_names(["dram_bytes,achieved_occupancy", "dram_bytes", "lts__t_sectors.sum,"]) == (
        "dram_bytes", "achieved_occupancy", "lts__t_sectors.sum")
    assert parse_metric_names(None) == () and parse_metric_names([]) == () and parse_metric_names(" , ") == ()
    assert parse_metric_names("warp_stalls") == ("warp_stalls",)  # groups open later, on the chip


def test_an_unknown_name_is_an_error_with_close_curated_names():
    with pytest.raises(ConfigurationError, match=r"--metrics dram_byte: not a metric mneme knows; close names: "
                                                 r"dram_bytes"):
        parse_metric_names("dram_byte")
    with pytest.raises(ConfigurationError, match="raw CUPTI metric name such as dram__bytes.sum"):
        parse_metric_names("occupancy percent")


def test_the_curated_list_covers_the_issues_metrics():
    assert CURATED["dram_bytes"].raw == ("dram__bytes.sum",)
    assert CURATED["achieved_occupancy"].raw == ("sm__warps_active.avg.pct_of_peak_sustained_active",)
    assert CURATED["sm_throughput"].raw == ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)
    assert CURATED["l2_hit_rate"].raw == ("lts__t_sector_hit_rate.pct",)
    assert CURATED["stall_long_scoreboard"].raw == (
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",)
    assert GROUPS["warp_stalls"] == tuple(f"stall_{r}" for r in STALL_REASONS)
    assert CURATED["dram_read_bytes"].raw[1] == "dram__bytes_op_read.sum"  # GB20x's name


def test_groups_open_into_their_members_once():
    opened = expand(["stall_wait", "warp_stalls", "dram_bytes"])
    assert opened[0] == ("stall_wait", False) and opened[-1] == ("dram_bytes", False)
    assert [n for n, grouped in opened if grouped] == [f"stall_{r}" for r in STALL_REASONS if r != "wait"]


def test_objective_directions():
    assert objective_direction("dram_bytes") == "minimize"
    assert objective_direction("achieved_occupancy") == "maximize"
    assert objective_direction("l2_hit_rate") == "maximize"
    assert objective_direction("lts__t_sectors.sum") == "minimize"
    with pytest.raises(ConfigurationError, match="is not better when lower or higher"):
        objective_direction("sm_throughput")
    with pytest.raises(ConfigurationError, match="give one metric"):
        objective_direction("warp_stalls")


# -- resolution on a chip -----------------------------------------------------------------------------------
class _Chip:
    """A host side that knows ``metrics`` (the fake engine's error type and suggestions)."""

    ProfilerError = fake.ProfilerError

    def __init__(self, metrics):
        self.metrics = set(metrics)

    def profiler_metric_properties(self, chip, name):
        if name not in self.metrics:
            raise profiler_error("cuptiProfilerHostGetMetricProperties", 17, "CUPTI_ERROR_INVALID_METRIC_NAME")
        return {}

    def profiler_base_metrics(self, chip, type_):
        return sorted({m.split(".")[0] for m in self.metrics}) if type_ == 0 else []

    def profiler_sub_metrics(self, chip, base, type_):
        return sorted(m[len(base):] for m in self.metrics if m.startswith(base + "."))


def test_a_curated_metric_takes_the_first_raw_metric_the_chip_has():
    chip = _Chip({"dram__bytes.sum", "dram__bytes_op_read.sum"})
    plan = resolve(["dram_read_bytes", "dram_bytes", "dram__bytes.sum"], "GB202", chip)
    assert plan.names == ("dram_read_bytes", "dram_bytes", "dram__bytes.sum")
    assert plan.raw == ("dram__bytes_op_read.sum", "dram__bytes.sum", "dram__bytes.sum") and plan.chip == "GB202"
    with pytest.raises(ConfigurationError, match=r"metric l2_hit_rate: the GB202 has none of its raw metrics "
                                                 r"\(lts__t_sector_hit_rate.pct\)"):
        resolve(["l2_hit_rate"], "GB202", chip)


def test_group_members_the_chip_lacks_are_left_out():
    raw = {CURATED[f"stall_{r}"].raw[0] for r in STALL_REASONS if r != "imc_miss"}
    plan = resolve(["warp_stalls"], "GB100", _Chip(raw))
    assert "stall_imc_miss" not in plan.names and plan.missing == ("stall_imc_miss",)
    assert len(plan.names) == len(STALL_REASONS) - 1
    with pytest.raises(ConfigurationError, match="stall_imc_miss: the GB100 has none"):
        resolve(["stall_imc_miss"], "GB100", _Chip(raw))


def test_an_unknown_raw_name_lists_close_names_the_chip_has():
    chip = _Chip({"dram__bytes.sum", "dram__bytes.avg", "lts__t_sectors.sum"})
    with pytest.raises(ConfigurationError, match=r"the GH100 has no such metric; close names: dram__bytes.sum"):
        resolve(["dram__byts.sum"], "GH100", chip)
    with pytest.raises(ConfigurationError, match=r"close names: dram__bytes.sum"):
        resolve(["dram__bytes.summ"], "GH100", chip)  # the base is right: its suffixes


# -- errors -----------------------------------------------------------------------------------------------
def test_insufficient_privileges_names_the_cause_and_the_fix():
    exc = profiler_error("cuptiRangeProfilerEnable", 35, "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES")
    text = explain(exc)
    assert text.startswith("hardware counters cannot be collected: the NVIDIA driver lets only administrators")
    assert "NVreg_RestrictProfilingToAdminUsers=0" in text and "run as root" in text
    assert "[cuptiRangeProfilerEnable]" in text and "\n" not in text


def test_other_host_causes_are_named():
    assert "vGPU" in explain(profiler_error("cuptiRangeProfilerEnable", 40, "X"))
    assert "MIG" in explain(profiler_error("cuptiRangeProfilerEnable", 43, "X"))
    busy = explain(profiler_error("cuptiRangeProfilerStart", 26, "CUPTI_ERROR_HARDWARE_BUSY"))
    assert "another profiler" in busy and "dcgm" in busy.lower()
    unknown = profiler_error("cuptiRangeProfilerEnable", 999, "CUPTI_ERROR_UNKNOWN")
    assert explain(unknown) == f"hardware counters cannot be collected: {unknown.args[0]}"
    vgpu = explain(unknown, {"vgpu": 2, "architecture": 3})
    assert "profiling is not enabled for this vGPU" in vgpu and "CUPTI_ERROR_UNKNOWN" in vgpu


# -- the replayer's step (fake engine) ----------------------------------------------------------------------
@pytest.fixture
def space(monkeypatch, tmp_path) -> AddressSpace:
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    space = AddressSpace(kernel=FakeKernel(counters={"dram__bytes.sum": 3.0 * N * 4,
                                                     "lts__t_sector_hit_rate.pct": 12.5}))
    monkeypatch.setattr(eng, "_engine", native_module(space))
    monkeypatch.setattr(placement, "_process", ProcessReservations())
    return space


@pytest.fixture
def replayer(space, tmp_path):
    from mneme.replay import Replayer

    rec = RecordedExecution.from_json(str(synth.vecadd(tmp_path / "rec", n=N, block=BLOCK)))
    with Replayer(rec, rec.single_instance().record_id) as replayer:
        yield replayer


def test_counters_are_collected_after_the_timed_launches_from_the_recorded_memory(space, replayer):
    kernel = space.kernel
    config = replayer.baseline()
    result = replayer.run(config, iterations=3, warmup=1, metrics=("dram_bytes", "l2_hit_rate"))
    assert result.status == "verified" and result.metrics_error == ""
    assert result.metrics == {"dram_bytes": 3.0 * N * 4, "l2_hit_rate": 12.5}
    assert result.exec_time == [1000] * 4  # the timed launches are the replay's own
    profile, = kernel.profiles
    assert profile.config.metrics == ["dram__bytes.sum", "lts__t_sector_hit_rate.pct"]
    assert profile.config.chip == "GH100" and profile.config.counter_availability == b"fake-availability"
    assert profile.grid == (N // BLOCK, 1, 1) and profile.block == (BLOCK, 1, 1) and profile.shared_mem == 0
    # every region back to its prologue before each pass (a, b, c), and the L2 flushed (twice its size)
    regions = {r.live: r for r in replayer.regions}
    assert sorted(dst for dst, _, _ in profile.resets) == sorted(regions)
    assert all(src == regions[dst].reset_source and size == regions[dst].size for dst, src, size in profile.resets)
    assert profile.l2_flush_bytes == 2 * (50 << 20)
    assert replayer.last_profile == {"chip": "GH100", "passes": 1, "missing": [],
                                     "raw": {"dram_bytes": "dram__bytes.sum",
                                             "l2_hit_rate": "lts__t_sector_hit_rate.pct"}}
    assert len(kernel.runs) == 3  # the proof's two launches and the timed run: profiling is not a run
    again = replayer.run(config, iterations=1, warmup=0, metrics=("dram__bytes.sum",))
    assert again.metrics == {"dram__bytes.sum": 3.0 * N * 4} and len(kernel.profiles) == 2


def test_no_metrics_asked_no_profile(space, replayer):
    result = replayer.run(replayer.baseline())
    assert result.metrics == {} and result.metrics_error == "" and space.kernel.profiles == []


def test_a_host_that_refuses_profiling_keeps_the_replay_and_says_why(space, replayer):
    space.kernel.profile_errors.append(
        profiler_error("cuptiRangeProfilerEnable", 35, "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"))
    result = replayer.run(replayer.baseline(), metrics=("dram_bytes",))
    assert result.status == "verified" and result.verified and result.metrics == {}
    assert "NVreg_RestrictProfilingToAdminUsers=0" in result.metrics_error
    assert replayer.healthy


def test_no_profiler_in_this_build(space, replayer):
    space.profiler_reason = "libcupti not found (set MNEME_CUPTI_LIB)"
    result = replayer.run(replayer.baseline(), metrics=("dram_bytes",))
    assert result.verified and result.metrics_error == (
        "hardware counters are not available here: libcupti not found (set MNEME_CUPTI_LIB)")


def test_an_unknown_metric_is_a_metrics_error(space, replayer):
    result = replayer.run(replayer.baseline(), metrics=("dram__byts.sum",))
    assert result.verified and "the GH100 has no such metric; close names: dram__bytes.sum" in result.metrics_error
    assert space.kernel.profiles == []


def test_a_replay_that_did_not_run_collects_nothing(space, replayer):
    result = replayer.run(replayer.baseline().replace(passes="default<O1>"), metrics=("dram_bytes",))
    assert result.status == "compile_error" and result.metrics == {}
    assert result.metrics_error == "not collected: the replay ended with status compile_error"
    assert space.kernel.profiles == []


def test_a_fault_in_a_profiled_launch_loses_the_context(space, replayer):
    space.kernel.profile_errors.append(cuda_error("cuLaunchKernelEx(profiled)", 700, "CUDA_ERROR_ILLEGAL_ADDRESS"))
    result = replayer.run(replayer.baseline(), metrics=("dram_bytes",))
    assert result.verified and "the profiled launch failed" in result.metrics_error
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in result.metrics_error and not replayer.healthy


def test_plans_and_configurations_are_made_once_per_metric_list(space):
    ctx = eng.load_engine().Context(0)
    profiler = CounterProfiler(ctx, eng.load_engine())
    assert profiler.plan(["dram_bytes"]) is profiler.plan(["dram_bytes"])
    plan = profiler.plan(["warp_stalls"])
    assert plan.missing == ("stall_imc_miss",)  # not among the fake chip's metrics
    assert profiler.config(plan) is profiler.config(plan) and profiler.config(plan).passes == 6
    space.profiler_reason = "gone"
    with pytest.raises(NotAvailableError, match="hardware counters are not available here: gone"):
        profiler.plan(["l2_hit_rate"])


# -- CUPTI's real host side (no GPU needed) -----------------------------------------------------------------
@pytest.fixture(scope="module")
def host():
    native = pytest.importorskip("mneme._engine", reason="engine not built in this checkout")
    if not hasattr(native, "profiler_unavailable_reason"):
        pytest.skip("this engine build has no profiler")
    reason = native.profiler_unavailable_reason()
    if reason:
        pytest.skip(f"CUPTI's profiler does not load here: {reason}")
    return native


@pytest.mark.parametrize("chip", ["GA100", "GH100", "AD102", "GB100"])
def test_every_curated_metric_resolves_on_data_centre_chips(host, chip):
    plan = resolve([n for n in CURATED if not n.startswith("stall_")] + ["warp_stalls"], chip, host)
    lacking = {"GB100": ("stall_imc_miss",)}.get(chip, ())
    assert set(plan.names) == set(CURATED) - set(lacking) and plan.missing == lacking
    curated = host.MetricConfig(chip, list(dict.fromkeys(plan.raw)))
    assert curated.passes >= 1 and len(curated.image) > 0


def test_dram_bytes_takes_one_pass_on_the_h100(host):
    assert host.MetricConfig("GH100", ["dram__bytes.sum"]).passes == 1
    plan = resolve(["dram_bytes", "achieved_occupancy", "l2_hit_rate"], "GH100", host)
    alone = sum(host.MetricConfig("GH100", [raw]).passes for raw in plan.raw)
    assert 1 <= host.MetricConfig("GH100", list(plan.raw)).passes <= alone


def test_real_host_side_names_close_raw_metrics(host):
    with pytest.raises(ConfigurationError, match=r"no such metric; close names: .*dram__bytes"):
        resolve(["dram__byts.sum"], "GH100", host)
    with pytest.raises(ConfigurationError, match=r"close names: dram__bytes.sum"):
        resolve(["dram__bytes.summ"], "GH100", host)


def test_real_profiler_errors_carry_the_cupti_result(host):
    with pytest.raises(host.ProfilerError) as caught:
        host.MetricConfig("XX100", ["dram__bytes.sum"])
    message, code, name, call = caught.value.args
    assert code == 46 and name == "CUPTI_ERROR_INVALID_CHIP_NAME" and call == "cuptiProfilerHostInitialize(XX100)"
    assert message == "cuptiProfilerHostInitialize(XX100) failed: CUPTI_ERROR_INVALID_CHIP_NAME (46)"
