"""What the settings objects that travel whole (``VerificationSettings``, ``MeasurementSettings``) share:
changed copies, their dict form and back, and the canonical key a server keys prepared instances by."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Any, Mapping, TypeVar

from mneme.errors import ConfigurationError

S = TypeVar("S", bound="Settings")


class Settings:
    """Mixin of frozen settings dataclasses (``what`` names them in errors)."""

    what = "settings"

    def with_(self: S, **changes: Any) -> S:
        """These settings with ``changes`` (validated again).

        Args:
            **changes: fields and their new values.

        Returns:
            The new settings.
        """
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain JSON-able values (every field).

        Returns:
            ``{field: value}``.
        """
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls: type[S], data: Mapping[str, Any]) -> S:
        """Settings from :meth:`to_dict`'s form; missing fields take their defaults.

        Args:
            data: ``{field: value}``.

        Returns:
            The settings.

        Raises:
            ConfigurationError: an unknown field or an invalid value.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigurationError(f"{cls.what}: unknown field(s) {', '.join(unknown)}")
        return cls(**dict(data))

    def key(self) -> str:
        """A canonical text of the settings: equal settings, equal keys (what a server keys the instances it
        prepares by).

        Returns:
            The key.
        """
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
