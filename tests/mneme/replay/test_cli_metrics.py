"""`mneme replay --metrics` and `--list-metrics` on the CPU, over the fake native engine."""

from __future__ import annotations

import json

import pytest

import mneme.testing.synthetic_recordings as synth
from mneme.cli import build_parser, main
from mneme.cli import replay as cli
from mneme.model.experiment import ExperimentResult
from mneme.replay import engine as eng
from mneme.replay import placement
from mneme.replay.placement import ProcessReservations
from mneme.testing.fake_native_engine import AddressSpace, FakeKernel, native_module, profiler_error
from replay_server.protocol.convert import result_from_proto, result_to_proto

N = 4096


@pytest.fixture
def space(monkeypatch, tmp_path) -> AddressSpace:
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    space = AddressSpace(kernel=FakeKernel(counters={"dram__bytes.sum": 49152.0,
                                                     "sm__warps_active.avg.pct_of_peak_sustained_active": 87.5}))
    monkeypatch.setattr(eng, "_engine", native_module(space))
    monkeypatch.setattr(placement, "_process", ProcessReservations())
    return space


@pytest.fixture
def db(tmp_path):
    return synth.vecadd(tmp_path / "rec", n=N, block=256)


def test_the_flags_parse():
    args = build_parser().parse_args(["replay", "-rdb", "x.json", "--metrics", "dram_bytes,l2_hit_rate",
                                      "--metrics", "warp_stalls"])
    assert args.metrics == ["dram_bytes,l2_hit_rate", "warp_stalls"] and not args.list_metrics
    args = build_parser().parse_args(["replay", "--list-metrics", "--chip", "GA100"])
    assert args.list_metrics and args.chip == "GA100" and args.record_db is None


def test_metrics_come_back_in_the_result(space, db, capsys):
    assert main(["replay", "-rdb", str(db), "--json", "--metrics", "dram_bytes,achieved_occupancy"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)["Result"]
    assert result["metrics"] == {"dram_bytes": 49152.0, "achieved_occupancy": 87.5}
    assert result["metrics_error"] == "" and result["verified"]
    assert "mneme replay: metrics: 1 profiler pass(es) on the GH100" in captured.err
    assert len(space.kernel.profiles) == 1


def test_an_unknown_metric_stops_before_the_replay(space, db, capsys):
    assert main(["replay", "-rdb", str(db), "--metrics", "dram__byts.sum"]) == 2
    err = capsys.readouterr().err
    assert "mneme replay: error: metric dram__byts.sum: the GH100 has no such metric; close names: dram__bytes.sum" \
        in err
    assert space.kernel.runs == []
    assert main(["replay", "-rdb", str(db), "--metrics", "dram_byte"]) == 2
    assert "close names: dram_bytes" in capsys.readouterr().err


def test_a_host_that_refuses_profiling_prints_the_result_and_exits_2(space, db, capsys):
    space.kernel.profile_errors.append(
        profiler_error("cuptiRangeProfilerEnable", 35, "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"))
    assert main(["replay", "-rdb", str(db), "--json", "--metrics", "dram_bytes"]) == 2
    captured = capsys.readouterr()
    result = json.loads(captured.out)["Result"]
    assert result["verified"] and result["metrics"] == {}
    assert "NVreg_RestrictProfilingToAdminUsers=0" in result["metrics_error"]
    assert "mneme replay: error: metrics: hardware counters cannot be collected: the NVIDIA driver" in captured.err


def test_no_profiler_here_stops_before_the_replay(space, db, capsys):
    space.profiler_reason = "libcupti not found"
    assert main(["replay", "-rdb", str(db), "--metrics", "dram_bytes"]) == 2
    assert "--metrics: hardware counters are not available here: libcupti not found" in capsys.readouterr().err
    assert space.kernel.runs == []


def test_record_db_is_required_unless_listing(capsys):
    assert main(["replay"]) == 2
    assert "-rdb/--record-db is required" in capsys.readouterr().err


def test_list_metrics_names_every_curated_metric_and_its_raw_metric(space, capsys):
    assert main(["replay", "--list-metrics"]) == 0
    out = capsys.readouterr().out
    assert "raw CUPTI metric on the GH100" in out  # the (fake) GPU's chip
    assert "dram_bytes" in out and "dram__bytes.sum" in out and "achieved_occupancy" in out
    assert "stall_imc_miss" in out and "(none on the GH100)" in out  # the fake chip lacks it
    assert "warp_stalls" in out and "(group)" in out


def test_list_metrics_without_a_profiler_lists_the_candidates(monkeypatch):
    monkeypatch.setattr(cli, "_profiler_engine", lambda: None)
    text = cli.list_metrics(None)
    assert "raw CUPTI metric (first the chip has)" in text
    assert "dram__bytes_read.sum | dram__bytes_op_read.sum" in text


def test_metrics_round_trip_through_dict_and_proto():
    result = ExperimentResult(verified=True, executed=True, status="verified", exec_time=[5],
                              metrics={"dram_bytes": 1.5e8, "l2_hit_rate": 33.25}, metrics_error="")
    failed = ExperimentResult(verified=True, metrics_error="hardware counters cannot be collected: busy")
    for original in (result, failed, ExperimentResult()):
        for back in (ExperimentResult.from_dict(original.to_dict()),
                     result_from_proto(result_to_proto(original)),
                     ExperimentResult.from_dict(json.loads(json.dumps(original.to_dict())))):
            assert back == original
    assert result.to_dict()["metrics"] == {"dram_bytes": 1.5e8, "l2_hit_rate": 33.25}
