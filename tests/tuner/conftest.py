"""Fixtures of the tuner tests; the test doubles themselves live in tuner.testing."""

from tuner.testing import cli_doubles, kernel, loader, space_module  # noqa: F401  (pytest fixtures)
