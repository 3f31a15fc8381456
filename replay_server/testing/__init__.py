"""Fixtures for tests of the replay servers and their clients: the test engine (``fake_engine``:
replays without a GPU) and real servers running it (``servers``)."""
