"""Fixtures of the scale tests: a real PostgreSQL server for shared Optuna studies."""

from pg_server import postgres_url  # noqa: F401  (pytest fixture)
