"""The replay server's modules import each other without cycles (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "replay_server"


def _imports(path: Path) -> set[str]:
    """Modules of replay_server that ``path`` imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n.split(".")[1] for n in names if n.startswith("replay_server.") and n.count(".") == 1)
    return found - {path.stem}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_replay_server_modules_form_no_import_cycle():
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py")}
    assert "cuda_engine" not in graph["engine"], "the engine interface must not import its implementation"
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def _loaded_after(modules: str, watched: tuple[str, ...]) -> str:
    """Which of ``watched`` a fresh interpreter has loaded after importing ``modules`` (as printed)."""
    import subprocess
    import sys

    probe = f"import sys; import {modules}; print(sorted(m for m in {watched!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    return done.stdout.strip() + done.stderr


def test_a_worker_on_a_local_store_does_not_import_the_s3_client():
    """The S3 client (minio and urllib3: ~0.3 s) is imported only by those who talk to S3; a worker
    restoring a recording from a directory reaches its first replay without it."""
    modules = ("replay_server.worker, replay_server.cuda_engine, mneme.replay.replayer, mneme.store.cache, "
               "mneme.store.transfer, mneme.store.uploader, mneme.recorded_execution")
    assert _loaded_after(modules, ("minio", "urllib3")) == "[]"


def test_a_worker_reaches_its_first_replay_without_the_record_agent_or_numpy():
    """A worker's imports are on the critical path of `mneme tune`'s first result: its start, the first
    context's window reservation (mneme.replay.placement, mneme.recording_window) and the replay stack it
    warms up (EngineSpec.warm_up) import neither the record agent nor numpy (~0.4 s together on the GPU
    host); numpy comes in only where a replay scans snapshots for pointers (relocation, globals)."""
    modules = ("replay_server.worker, replay_server.cuda_engine, mneme.replay.engine, mneme.replay.selftest, "
               "mneme.replay.placement, mneme.recording_window, replay_server.device_info, mneme.replay.replayer, "
               "mneme.recorded_execution, mneme.replay.tolerance")
    assert _loaded_after(modules, ("record_agent", "numpy")) == "[]"
