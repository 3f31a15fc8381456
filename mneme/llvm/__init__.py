"""The LLVM IR tier: recompile a kernel's recorded bitcode with a chosen pipeline.

Public API (llvmlite is imported only when a function that needs it runs, so
``import mneme.llvm`` and the build-side modules work without it):

* :func:`compile_to_ptx` / :func:`compile_to_ptx_timed`: bitcode -> PTX with
  ``passes``, ``codegen_opt``, argument and launch-dimension specialization,
  launch bounds, ``prune`` and ``internalize`` (the replay engine's compile step).
* :func:`load`: a recorded module as an :class:`IRModule` to read (functions,
  blocks, instructions) and transform in Python.
* :func:`mneme.llvm.embedded.find_kernel_bitcode`: the bitcode an instrumented
  build embedded for a kernel (the recorder's side; standard library only).

See docs/llvm-tier.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from mneme.llvm.compile import CompileTimings, compile_to_ptx, compile_to_ptx_timed  # noqa: F401 (for type checkers)
    from mneme.llvm.module import IRModule, load  # noqa: F401

_LAZY = {
    "compile_to_ptx": "mneme.llvm.compile",
    "compile_to_ptx_timed": "mneme.llvm.compile",
    "CompileTimings": "mneme.llvm.compile",
    "IRModule": "mneme.llvm.module",
    "load": "mneme.llvm.module",
    "parse_pipeline": "mneme.llvm.pipeline",
    "find_kernel_bitcode": "mneme.llvm.embedded",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'mneme.llvm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
