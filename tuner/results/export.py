"""The tuned-kernels export (``proteus_tuned_kernels.json``).

The file lists tuned kernels by name and static hash with the best
configuration and its knobs split into what the application sets at launch
(grid, block, dynamic shared memory) and what its JIT sets when compiling
(pipeline, codegen level, specialization, launch bounds), so an application
(or its JIT) can look a kernel up and apply them. Several runs can share one
file: an entry is replaced only by a run on the same kernel.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mneme import __version__
from mneme.errors import ConfigurationError
from tuner.errors import cannot_write
from tuner.recording import KernelIdentity
from tuner.results.directory import dumps

FORMAT = "mneme-tuned-kernels"
VERSION = 1
LAUNCH_KNOBS = ("grid", "block", "shared_mem")
COMPILE_KNOBS = ("passes", "codegen_opt", "codegen_method", "specialize", "specialize_dims",
                 "set_launch_bounds", "max_threads", "min_blocks_per_sm", "prune", "internalize")


def kernel_entry(identity: KernelIdentity, best: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    config = best["configuration"]
    compile_knobs = {k: config[k] for k in COMPILE_KNOBS if k in config}
    if not config.get("set_launch_bounds"):
        compile_knobs.pop("max_threads", None)
        compile_knobs.pop("min_blocks_per_sm", None)
    return {
        "name": identity.name,
        "static_hash": identity.static_hash,
        "record_id": identity.record_id,
        "configuration": config,
        "knobs": {"launch": {k: config[k] for k in LAUNCH_KNOBS}, "compile": compile_knobs},
        "hash": best["hash"],
        "metric": options.get("metric"),
        "time_ns": best["metric"],
        "speedup": best.get("speedup"),
    }


def write_export(path: Path, identity: KernelIdentity, best: dict[str, Any], options: dict[str, Any]) -> Path:
    """Add or replace this kernel's entry in the export file at ``path``."""
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "kernels": []}
    if path.exists():
        try:
            existing = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{path} exists but is not JSON ({exc}); move it away or pick another --proteus-output") from None
        if not isinstance(existing, dict) or existing.get("format") != FORMAT:
            raise ConfigurationError(f"{path} exists and is not a {FORMAT} file; pick another --proteus-output")
        doc["kernels"] = [k for k in existing.get("kernels", [])
                          if (k.get("name"), k.get("static_hash")) != (identity.name, identity.static_hash)]
    doc["generator"] = f"mneme {__version__}"
    doc["kernels"].append(kernel_entry(identity, best, options))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(dumps(doc, indent=2) + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise cannot_write(path, exc) from exc
    return path
