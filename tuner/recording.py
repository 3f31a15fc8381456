"""Find the recorded kernel instance a run tunes, and the identity it is exported under."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mneme.errors import (
    ArtifactError,
    ConfigurationError,
    MnemeError,
    NotAvailableError,
)


@dataclass(frozen=True)
class KernelIdentity:
    """What names a tuned kernel in the export: its symbol, static hash and instance."""

    name: str
    static_hash: str
    record_id: str


def _first_attr(obj: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value not in (None, ""):
            return value
    return None


def load_instance(record_database: str, record_id: str | None) -> tuple[Any, KernelIdentity]:
    """The ``KernelInstance`` of ``record_id`` in the database (the only one when None), and its identity."""
    try:
        from mneme.recording.execution import RecordedExecution
    except ImportError as exc:
        raise NotAvailableError(
            f"mneme.recording.execution is not available in this installation ({exc}); reinstall mneme"
        ) from exc
    if "://" not in record_database and not Path(record_database).exists():
        raise ConfigurationError(
            f"--record-database {record_database}: no such file; give the <static-hash>.json a recording wrote"
        )
    try:
        recording = RecordedExecution.from_json(record_database)
    except MnemeError:
        raise
    except Exception as exc:  # a reader bug or an unexpected format: name the file
        raise ArtifactError(f"cannot read the recording database {record_database}: {exc}") from exc
    try:
        kernel = recording.select(record_id)
    except ArtifactError as exc:  # several instances and no id, or an unknown id: the choices are in it
        raise ConfigurationError(f"--record-database {record_database}: {exc}") from None
    record_id = str(kernel.record_id)
    require = getattr(kernel, "require_supported", None)
    if require is not None:  # before any server starts: the recorder's reasons, exit status 2
        require()
    name = _first_attr(kernel, ("kernel_name", "name", "function_name")) or _first_attr(
        recording, ("kernel_name", "name", "function_name")) or "unknown"
    static = _first_attr(recording, ("static_hash",)) or _first_attr(kernel, ("static_hash",)) \
        or Path(record_database).stem
    return kernel, KernelIdentity(str(name), str(static), str(record_id))


def check_region_selectors(kernel: Any, policies: dict[str, Any]) -> None:
    """Explicit ``--tolerance SEL=SPEC`` policies must select recorded regions: a typo is an error here,
    before any replay server starts (the servers would refuse the instance the same way, later)."""
    load_prologue = getattr(kernel, "load_prologue", None)
    if not policies or load_prologue is None:
        return
    from mneme.replay.tolerance import ToleranceOverrides

    regions = load_prologue().regions
    unused = ToleranceOverrides.from_mapping(policies).unused_selectors((r.name, r.base) for r in regions)
    if unused:
        names = ", ".join(r.name or hex(r.base) for r in regions)
        raise ConfigurationError(f"--tolerance {', '.join(unused)}: no recorded region is called so; the regions "
                                 f"are: {names} (a name, a 0x base, or '*' for all)")
