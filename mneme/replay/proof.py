"""The reset policy's proof, made where a kernel that hangs or faults costs nothing but a process.

A kernel that consumes its own state (work queues, tickets, spin-waits on
counters, locks) may spin forever or fault when launched a second time
without a reset. Its CUDA context is then lost: a kernel that never ends
cannot be stopped but by ending its process. So a single-process replay
(``mneme replay``) proves idempotence in a child process first
(:func:`decide_resets`): the child restores the instance, runs the proof
under its watchdog (:func:`mneme.replay.readiness.proof_watchdog`), prints the
decision and exits, taking any hung kernel with it; the replay then runs in
the parent with that decision and no proof of its own. Decisions are kept in
the cache directory (``$MNEME_CACHE_DIR/proofs``), keyed by the recording
database's content, so an instance is proven once per machine.

The replay servers need none of this: their workers are disposable processes
already (``replay_server.server``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mneme._internal.cache_dir import cache_root
from mneme._internal.child_process import child_env, python_command
from mneme.errors import MnemeError
from mneme.model.verification import ResetDecision, VerificationSettings

#: How long the child may take besides the proof's own watchdog: its start, the CUDA context, the restore.
CHILD_START_S = 120.0


def decide_resets(recording: Any, record_id: str, device: int, verification: VerificationSettings,
                  timeout_s: float = 0.0) -> ResetDecision | None:
    """The reset policy of ``recording[record_id]``: cached, else proven in a child process.

    Args:
        recording: the :class:`mneme.recording.execution.RecordedExecution` (its database is read
            again, by location, in the child).
        record_id: the instance.
        device: the GPU's index.
        verification: how the proof's launches are judged (its checks use the same policies).
        timeout_s: the replay's own watchdog (0: none); the child's deadline adds it to ``CHILD_START_S``.

    Returns:
        The decision; None when none could be made (the recorded launch itself fails: the replay
        will say why).
    """
    key = _cache_key(recording, record_id)
    cached = _read(key)
    if cached is not None:
        return cached
    location = f"{recording.store.url.rstrip('/')}/{recording.database_name}"
    command = python_command("mneme.replay.proof", location, str(record_id), str(device),
                             json.dumps(verification.to_dict()))
    deadline = CHILD_START_S + max(timeout_s, 0.0)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=deadline, env=child_env())
    except subprocess.TimeoutExpired:
        decision = ResetDecision(True, f"the kernel is not idempotent: the process proving it did not answer within "
                                       f"{deadline:g} s; the written memory is reset before every launch")
        _write(key, decision)
        return decision
    answer = _answer(done.stdout)
    if answer is None:  # the child died (a signal, a crash in the driver): the proof is not made
        return ResetDecision(True, f"idempotence is not proven: the process proving it ended with status "
                                   f"{done.returncode} ({(done.stderr or '').strip()[-300:]})")
    if answer.get("decision") is None:
        return None
    decision = ResetDecision(**answer["decision"])
    _write(key, decision)
    return decision


def _answer(stdout: str) -> dict | None:
    for line in reversed((stdout or "").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _cache_key(recording: Any, record_id: str) -> str:
    content = recording.store.get(recording.database_name)
    return f"{recording.static_hash}-{record_id}-{hashlib.sha256(content).hexdigest()[:24]}"


def _path(key: str) -> Path:
    return cache_root() / "proofs" / f"{key}.json"


def _read(key: str) -> ResetDecision | None:
    try:
        data = json.loads(_path(key).read_text())
        return ResetDecision(bool(data["each_launch"]), str(data.get("reason", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(key: str, decision: ResetDecision) -> None:
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"each_launch": decision.each_launch, "reason": decision.reason}))
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written only costs the next replay another proof


def main(argv: list[str]) -> int:
    """The child: prove, print ``{"decision": ..., "problem": ...}`` on one line, leave at once."""
    from mneme.recording.execution import RecordedExecution
    from mneme.replay import Replayer

    location, record_id, device, settings = argv
    try:
        recording = RecordedExecution.from_json(location)
        replayer = Replayer(recording, record_id, int(device), verification=VerificationSettings.from_dict(
            json.loads(settings)))
    except MnemeError as exc:  # the replay in the parent says it again, as its error
        print(json.dumps({"decision": None, "problem": str(exc)}), flush=True)
        return 0
    problem = replayer.get_ready()
    decision = replayer.reset_decision()
    print(json.dumps({"decision": None if decision is None else {"each_launch": decision.each_launch,
                                                                  "reason": decision.reason},
                      "problem": problem}), flush=True)
    sys.stderr.flush()
    os._exit(0)  # a kernel that never ends: leave without the interpreter's clean-up, which would wait for it


if __name__ == "__main__":  # pragma: no cover (run as a child)
    sys.exit(main(sys.argv[1:]))
