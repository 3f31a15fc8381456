"""Checked access to parsed JSON: every problem becomes an ArtifactError naming the object and the field.

The readers of the snapshot header and the recording database go through
these helpers so that a hand-edited or corrupt file gives
``"123.json: instances.456.grid.x: expected an integer, got 'a'"`` instead of a
``KeyError`` deep inside the replay.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from mneme.errors import ArtifactError


class JsonReader:
    """Typed getters over JSON values of one object (``what`` names it in errors)."""

    def __init__(self, what: str):
        self.what = what

    def error(self, where: str, message: str) -> ArtifactError:
        location = f"{where}: " if where else ""
        return ArtifactError(f"{self.what}: {location}{message}")

    def obj(
        self,
        value: Any,
        where: str,
        required: Collection[str],
        optional: Collection[str] = (),
    ) -> Mapping[str, Any]:
        """A JSON object with exactly the ``required`` keys plus any of ``optional``."""
        if not isinstance(value, dict):
            raise self.error(where, f"expected an object, got {_kind(value)}")
        missing = [k for k in required if k not in value]
        if missing:
            raise self.error(where, f"missing key(s) {', '.join(map(repr, missing))}")
        allowed = set(required) | set(optional)
        unknown = sorted(str(k) for k in value if k not in allowed)
        if unknown:
            raise self.error(
                where,
                f"unknown key(s) {', '.join(map(repr, unknown))}; "
                "was it written by a newer mneme? upgrade mneme",
            )
        return value

    def mapping(self, value: Any, where: str) -> Mapping[str, Any]:
        """A JSON object with any keys (e.g. ``instances`` keyed by id)."""
        if not isinstance(value, dict):
            raise self.error(where, f"expected an object, got {_kind(value)}")
        return value

    def int(self, value: Any, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(where, f"expected an integer, got {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.error(where, f"{value} is below the minimum {minimum}")
        if maximum is not None and value > maximum:
            raise self.error(where, f"{value} is above the maximum {maximum}")
        return value

    def optional_int(self, value: Any, where: str, minimum: int | None = None) -> int | None:
        return None if value is None else self.int(value, where, minimum)

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(where, f"expected a number, got {_kind(value)}")
        if value != value or value in (float("inf"), float("-inf")):
            raise self.error(where, f"expected a finite number, got {value}")
        return float(value)

    def str(self, value: Any, where: str, nonempty: bool = False) -> str:
        if not isinstance(value, str):
            raise self.error(where, f"expected a string, got {_kind(value)}")
        if nonempty and not value:
            raise self.error(where, "must not be empty")
        return value

    def optional_str(self, value: Any, where: str) -> str | None:
        return None if value is None else self.str(value, where)

    def list(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.error(where, f"expected a list, got {_kind(value)}")
        return value

    def choice(self, value: Any, where: str, choices: Collection[str]) -> str:
        if not isinstance(value, str) or value not in choices:
            raise self.error(where, f"expected one of {', '.join(map(repr, choices))}, got {_short(value)}")
        return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({_short(value)})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
