"""The replay tests run the fake native engine in this process: ``mneme replay``'s proof, which
runs in a child process with the real engine, runs in this process instead."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def proof_in_this_process(monkeypatch):
    import mneme.replay.proof

    monkeypatch.setattr(mneme.replay.proof, "decide_resets", lambda *args, **kwargs: None)
