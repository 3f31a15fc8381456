"""Standalone reproducers: one recorded kernel launch as a folder that builds and runs without mneme.

``export_reproducer(recording, record_id, directory, config)`` writes the
kernel's code (cubin and PTX, as recorded or as the configuration compiles
it), the recorded memory before and after the launch in a raw format
(``raw_format``), and a C++ program using only the CUDA driver API, with its
CMakeLists.txt, that restores the memory, launches, times and compares
(``templates/``). ``mneme export-reproducer`` is its command line;
docs/replay.md#standalone-reproducer describes the folder.
"""

from __future__ import annotations

from mneme.reproducer.exporter import ExportedReproducer, ExportError, export_reproducer

__all__ = ["ExportError", "ExportedReproducer", "export_reproducer"]
