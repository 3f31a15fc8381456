"""The apply plan built from real tuning runs (the tuner writing its results directory), without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from apply_support import WRONG_BLOCK_X, tuned_run

from mneme._internal.child_process import child_env, mneme_command
from mneme.apply import ApplyOptions, build_plan, read_results
from mneme.apply.plan import fnv1a64
from mneme.apply.session import results_from, run_with_apply
from mneme.errors import ConfigurationError, NotAvailableError
from mneme.recording.execution import RecordedExecution


def test_fnv1a64_known_values():
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_plan_holds_the_verified_best_and_the_recorded_launch(tmp_path):
    run = tuned_run(tmp_path)
    best = json.loads((run / "best.json").read_text())["best"]
    assert best["configuration"]["block"]["x"] != WRONG_BLOCK_X  # the fast wrong shape is not the best
    kernel = read_results(run / "proteus_tuned_kernels.json")  # the export file names its directory
    assert kernel.results_dir == run and kernel.exact
    plan = build_plan([kernel], ApplyOptions(), tmp_path)
    (entry,) = plan.entries
    rec = RecordedExecution.from_json(kernel.record_database)
    inst = rec[kernel.record_id]
    assert entry.kernel_name == rec.kernel_name == "_Z6vecaddPKfS0_Pfi"
    assert entry.recorded.grid == inst.grid_dim and entry.recorded.block == inst.block_dim
    assert entry.tuned.block.x == best["configuration"]["block"]["x"] == 128
    assert entry.tuned.grid.x * entry.tuned.block.x >= inst.grid_dim.x * inst.block_dim.x  # coverage kept
    assert entry.cubin_fnv == fnv1a64(rec.load_code("cubin"))
    assert entry.code_path is None and entry.tier == "recorded"  # only the launch shape changed
    assert entry.pointers == ((0, 0), (1, 0), (2, 0))  # a, b, c of vecadd(a, b, c, n)
    text = plan.write(tmp_path / "plan.txt").read_text().splitlines()
    assert text[0] == "mneme-apply-plan 1"
    assert "recorded 16 1 1 256 1 1 0" in text and "tuned 32 1 1 128 1 1 0" in text and "code -" in text


def test_recompiled_best_is_compiled_into_a_cubin_once(tmp_path):
    if not shutil.which("ptxas") and not Path("/usr/local/cuda/bin/ptxas").exists():
        pytest.skip("no ptxas on this machine (the CUDA toolkit)")
    run = tuned_run(tmp_path, fixed_codegen_opt=2)
    plan = build_plan([read_results(run)], ApplyOptions(apply_to="similar", verify=3), tmp_path)
    (entry,) = plan.entries
    assert entry.tier == "ptx" and entry.code_path.read_bytes()[:4] == b"\x7fELF"
    assert entry.similar
    text = plan.write(tmp_path / "plan.txt").read_text()
    assert f"code {entry.code_path}" in text and "verify 3" in text and "similar 1" in text


def test_specialized_code_is_pinned_to_the_recorded_arguments_and_shape(tmp_path):
    if not shutil.which("ptxas") and not Path("/usr/local/cuda/bin/ptxas").exists():
        pytest.skip("no ptxas on this machine (the CUDA toolkit)")
    kernel = read_results(tuned_run(tmp_path))
    specialized = replace(kernel, configuration=replace(kernel.configuration, specialize=True, specialize_dims=True))
    entry = build_plan([specialized], ApplyOptions(apply_to="similar"), tmp_path).entries[0]
    assert entry.tier == "ptx" and not entry.similar  # code that knows its dimensions runs only with them
    assert entry.fixed == ((3, (4096).to_bytes(4, "little")),)  # the scalar n the code was specialized on
    assert f"fixed 3 {(4096).to_bytes(4, 'little').hex()}" in build_plan(
        [specialized], ApplyOptions(), tmp_path).write(tmp_path / "plan.txt").read_text()


def test_a_run_without_a_verified_configuration_is_refused(tmp_path):
    run = tuned_run(tmp_path, all_wrong=True, launch_safety="conservative")
    best = json.loads((run / "best.json").read_text())
    if best["best"] is not None:  # the recorded shape itself verified: make it so no trial did
        (run / "trials.jsonl").write_text("")
    with pytest.raises(ConfigurationError, match="verified"):
        read_results(run)


def test_missing_recording_and_bad_paths_are_clear_errors(tmp_path):
    run = tuned_run(tmp_path)
    kernel = read_results(run)
    shutil.rmtree(Path(kernel.record_database).parent)
    with pytest.raises(ConfigurationError, match="recording .* is not there any more"):
        build_plan([kernel], ApplyOptions(), tmp_path)
    with pytest.raises(ConfigurationError, match="no such results directory"):
        read_results(tmp_path / "nowhere")
    with pytest.raises(ConfigurationError, match="--apply-to"):
        ApplyOptions(apply_to="close")
    with pytest.raises(ConfigurationError, match="nothing to apply"):
        build_plan([], ApplyOptions(), tmp_path)


def test_results_come_from_mneme_apply_when_not_given():
    assert results_from(["a"], {"MNEME_APPLY": "b"}) == ["a"]
    assert results_from([], {"MNEME_APPLY": f"b{os.pathsep}c d"}) == ["b", "c", "d"]
    assert results_from([], {}) == []


def test_an_application_exiting_early_leaves_nothing_behind(tmp_path):
    """The plan directory goes with the run, whatever the application does; its exit status is kept."""
    run = tuned_run(tmp_path)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    try:
        result = run_with_apply([sys.executable, "-c", "import os, sys; sys.exit(3)"], [str(run)], ApplyOptions(),
                                env=env)
    except NotAvailableError as exc:
        pytest.skip(f"the apply library is not built here: {exc}")
    assert result.exit_code == 3
    assert result.reports is None  # the application never used CUDA, so the library never reported
    killed = run_with_apply([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                            [str(run)], ApplyOptions(), env=env)
    assert killed.exit_code == 128 + 9
    assert list(private_tmp.iterdir()) == []


def test_mneme_run_refuses_a_missing_application(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mneme", "run", "--apply", str(tmp_path / "none"), "--"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 2 and "no application given" in proc.stderr


def test_sigterm_reaches_the_application_and_the_plan_goes(tmp_path):
    """A batch system's SIGTERM to `mneme run` ends the application, and the run still cleans up."""
    from mneme.apply.session import apply_library

    try:
        apply_library()
    except NotAvailableError as exc:
        pytest.skip(f"the apply library is not built here: {exc}")
    run = tuned_run(tmp_path)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    app = "import signal, sys, time; print('ready', flush=True); time.sleep(60)"
    # Started as mneme starts its own children, so it imports this mneme (the one with the built library)
    # even from a checkout, whose source tree would shadow it as the current directory.
    proc = subprocess.Popen(mneme_command("run", "--apply", str(run), "--", sys.executable, "-c", app),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env({"TMPDIR": str(private_tmp)}))
    ready = proc.stdout.readline().strip()
    if ready != "ready":
        proc.kill()
        pytest.fail(f"mneme run did not start the application: {proc.communicate()[1]}")
    assert len(list(private_tmp.iterdir())) == 1  # the plan directory, while the application runs
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert list(private_tmp.iterdir()) == []


def test_a_best_no_faster_than_the_recorded_launch_is_left_out(tmp_path):
    run = tuned_run(tmp_path, all_wrong=True, launch_safety="conservative")  # only the recorded shape verifies
    kernel = read_results(run)
    assert kernel.configuration.block.x == 256 and kernel.speedup == pytest.approx(1.0)
    plan = build_plan([kernel], ApplyOptions(), tmp_path)
    assert plan.entries == [] and "not faster than the recorded launch" in plan.notes[0]


def _tuned_under_driver(tmp_path: Path, version: int) -> Path:
    """A tuning run whose config.json names the CUDA driver it ran under (this machine has none)."""
    run = tuned_run(tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["device"]["driver_version"] = version
    (run / "config.json").write_text(json.dumps(config))
    return run


def test_another_driver_gets_nothing_unless_forced(tmp_path):
    kernel = read_results(_tuned_under_driver(tmp_path, 12080))
    assert kernel.driver_version == 12080
    refused = build_plan([kernel], ApplyOptions(), tmp_path, driver_here=13000)
    assert refused.entries == [] and list(tmp_path.glob("*.cubin")) == []
    (note,) = refused.notes
    assert "CUDA driver 12.8 (12080)" in note and "13.0 (13000)" in note and "runs unchanged" in note
    assert "give --apply-force" in note  # says what to do
    forced = build_plan([kernel], ApplyOptions(force=True), tmp_path, driver_here=13000)
    assert len(forced.entries) == 1 and "anyway (--apply-force)" in forced.notes[0]
    lines = forced.write(tmp_path / "plan.txt").read_text().splitlines()
    assert "force 1" in lines and "device 9 0 12080" in lines  # the apply library skips its own checks
    same = build_plan([kernel], ApplyOptions(), tmp_path, driver_here=12080)
    assert len(same.entries) == 1 and same.notes == []
    assert "force 0" in same.write(tmp_path / "plan.txt").read_text().splitlines()
    unknown = build_plan([replace(kernel, driver_version=None)], ApplyOptions(), tmp_path, driver_here=13000)
    assert len(unknown.entries) == 1  # results that did not record their driver: the GPU is checked only
    no_driver_here = build_plan([kernel], ApplyOptions(), tmp_path, driver_here=None)
    assert len(no_driver_here.entries) == 1  # undecided here; the library checks each context


def test_mneme_run_says_before_the_application_starts_that_another_driver_gets_nothing(tmp_path, monkeypatch):
    import mneme.apply.session as session

    run = _tuned_under_driver(tmp_path, 12080)
    monkeypatch.setattr(session, "driver_version", lambda: 13000)
    notes: list[str] = []
    try:
        result = run_with_apply([sys.executable, "-c", "pass"], [str(run)], ApplyOptions(), notes=notes.append)
        assert result.exit_code == 0 and result.plan.entries == []
    except NotAvailableError:  # the apply library is not built here: the note came before it was needed
        pass
    assert len(notes) == 1 and "tuned under CUDA driver 12.8" in notes[0] and "--apply-force" in notes[0]
