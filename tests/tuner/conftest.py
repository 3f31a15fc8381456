"""Fixtures of the tuner tests; the test doubles themselves live in tuner_fakes.py."""

from tuner_fakes import kernel, loader, space_module  # noqa: F401  (pytest fixtures)
