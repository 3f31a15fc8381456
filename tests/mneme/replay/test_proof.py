"""``mneme replay``'s proof in a child process: its answer, a child that hangs or dies, the cache."""

from __future__ import annotations

import json
import sys

import pytest

import mneme.replay.proof as proof
import mneme.testing.synthetic_recordings as synth
from mneme.model.verification import ResetDecision, VerificationSettings
from mneme.recording.execution import RecordedExecution
from mneme.replay.proof import decide_resets as real_decide_resets  # (the tests' conftest patches the module's)


@pytest.fixture
def recording(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_CACHE_DIR", str(tmp_path / "cache"))
    db = synth.vecadd(tmp_path / "rec", n=1024, block=128)
    rec = RecordedExecution.from_json(str(db))
    return rec, rec.single_instance().record_id


def child_printing(monkeypatch, body: str) -> list:
    """The child is a Python snippet: what it prints is the proof's answer."""
    calls = []

    def command(module, *args):
        calls.append(args)
        return [sys.executable, "-c", body]

    monkeypatch.setattr(proof, "python_command", command)
    return calls


def test_the_childs_decision_is_used_and_cached(recording, monkeypatch):
    rec, rid = recording
    answer = {"decision": {"each_launch": True, "reason": "the kernel is not idempotent: x"}, "problem": "lost"}
    calls = child_printing(monkeypatch, f"print('noise'); print({json.dumps(json.dumps(answer))})")
    first = real_decide_resets(rec, rid, 0, VerificationSettings(mode="auto"))
    again = real_decide_resets(rec, rid, 0, VerificationSettings())
    assert first == again == ResetDecision(True, "the kernel is not idempotent: x")
    assert len(calls) == 1  # the second came from the cache
    location, record_id, device, settings = calls[0]
    assert location.endswith(rec.database_name) and record_id == rid and device == "0"
    assert json.loads(settings)["mode"] == "auto"


def test_a_child_that_hangs_decides_resets_before_every_launch(recording, monkeypatch):
    rec, rid = recording
    child_printing(monkeypatch, "import time; time.sleep(60)")
    monkeypatch.setattr(proof, "CHILD_START_S", 1.0)
    decision = real_decide_resets(rec, rid, 0, VerificationSettings())
    assert decision.each_launch and "did not answer within 1 s" in decision.reason


def test_a_child_that_dies_decides_resets_and_is_not_cached(recording, monkeypatch):
    rec, rid = recording
    calls = child_printing(monkeypatch, "import os; os.abort()")
    decision = real_decide_resets(rec, rid, 0, VerificationSettings())
    assert decision.each_launch and "idempotence is not proven" in decision.reason
    real_decide_resets(rec, rid, 0, VerificationSettings())
    assert len(calls) == 2


def test_an_instance_that_cannot_replay_decides_nothing(recording, monkeypatch):
    rec, rid = recording
    child_printing(monkeypatch, "import json; print(json.dumps({'decision': None, 'problem': 'no GPU'}))")
    assert real_decide_resets(rec, rid, 0, VerificationSettings()) is None
