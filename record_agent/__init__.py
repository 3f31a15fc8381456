"""The record agent: runs an application under the native recorder and turns what it spools into recordings.

``mneme record`` is its command line. The pieces, one job each:

* :mod:`record_agent.options`: the validated settings of one recording run (selection, limits, ranks)
* :mod:`record_agent.ranks`: MPI rank detection from the launchers' environment variables
* :mod:`record_agent.spool`: reading the spool the recorder writes (the contract is README.md)
* :mod:`record_agent.fatbin`: PTX and cubins out of CUDA fatbins and executables
* :mod:`record_agent.convert`: spool entries -> recording databases (through ``mneme.format``)
* :mod:`record_agent.session`: starting the application, converting while it runs, signals, upload
"""

from __future__ import annotations

__all__ = ["RecordOptions", "RecordSummary", "record"]


def __getattr__(name: str) -> object:
    # Loaded when first used (PEP 562): `mneme record` imports its options and starts the application
    # before the conversion machinery (mneme.format, zstandard, BLAKE3) is loaded.
    if name == "RecordOptions":
        from record_agent.options import RecordOptions

        return RecordOptions
    if name == "RecordSummary":
        from record_agent.feedback import RecordSummary

        return RecordSummary
    if name == "record":
        from record_agent.session import record

        return record
    raise AttributeError(f"module 'record_agent' has no attribute {name!r}")
