"""mneme's per-user cache directory: one rule for every cache under it.

``$MNEME_CACHE_DIR``, else ``~/.cache/mneme``. Each cache has its own
subdirectory: ``store`` (chunks of remote recordings), ``compile`` (compiled
code), ``servers`` (kept local replay servers).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The directory every mneme cache of this user lives under."""
    return Path(os.environ.get("MNEME_CACHE_DIR") or Path.home() / ".cache" / "mneme").expanduser()
