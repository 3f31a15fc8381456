"""Which knobs of the built-in space can apply to a recorded kernel, and why the others cannot.

The PTX tier (codegen levels, launch bounds, specialization) recompiles the
kernel's recorded PTX; a kernel recorded without PTX (cuBLAS and cuDNN ship
SASS only; PyTorch's own kernels carry PTX for some architectures only) runs
only its recorded cubin. Pass pipelines need LLVM bitcode. Such knobs are
refused by name, with the reason, instead of failing every trial: left out of
the space when a preset would have tuned them, a configuration error when the
command line asks for the PTX tier's. (Pipelines given explicitly are still
tried on a kernel without bitcode, as the reference's examples give them; they
fail as compile errors.)

The block shape is fixed by code that declares one (PTX ``.reqntid``, the
cubin's EIATTR_REQNTID: Triton kernels, nvcc ``__block_size__``): every other
shape fails to launch, so ``block_shape`` is refused the same way. A thread
cap (``.maxntid``, EIATTR_MAX_THREADS: ``__launch_bounds__``) keeps the knob
but limits it to shapes under the cap (``max_block_threads``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mneme.errors import ConfigurationError
from mneme.model.experiment import DEFAULT_PASSES
from mneme.replay.block_limits import BlockLimits, recorded_block_limits
from mneme.replay.compile import BASELINE_CODEGEN_OPT

#: Knobs that recompile the recorded PTX, with the flags that ask for them.
PTX_KNOBS = {
    "codegen_opt": ("codegen_opt_range", "fixed_codegen_opt"),
    "specialize": ("specialize_space",),
    "specialize_dims": ("specialize_dims_space",),
    "set_launch_bounds": ("launch_bounds_space", "max_threads_range", "max_threads_policy",
                          "min_blocks_per_sm_range", "fixed_min_blocks_per_sm"),
}
LLVM_KNOBS = {"passes": ("passes", "fixed_passes", "pipeline_file")}
LAUNCH_KNOBS = {"block_shape": ("launch_dim",)}
#: Flag values that ask for nothing (a switch kept off, the recorded launch's own shape, the recorded
#: code's own level and pipeline).
_OFF = (None, "fixed", "off", "none", BASELINE_CODEGEN_OPT, [BASELINE_CODEGEN_OPT] * 2, DEFAULT_PASSES,
        [DEFAULT_PASSES])


@dataclass(frozen=True)
class KnobApplicability:
    """The knobs that apply to one recorded kernel, and the refused ones with their reasons."""

    applies: tuple[str, ...]
    refused: dict[str, str] = field(default_factory=dict)
    limited: dict[str, str] = field(default_factory=dict)  # knobs that apply to part of their range: which
    max_block_threads: int | None = None  # the code's thread cap: block shapes above it cannot launch

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"apply": list(self.applies), "refused": dict(self.refused)}
        if self.limited:
            out["limited"] = dict(self.limited)
        return out

    def check_requested(self, options: Any) -> None:
        """ConfigurationError naming every refused knob the command line asks for, with the reason."""
        problems = []
        for knob, flags in {**LAUNCH_KNOBS, **PTX_KNOBS}.items():
            if knob not in self.refused:
                continue
            asked = [f for f in flags if getattr(options, f, None) not in _OFF]
            if asked:
                flag_names = ", ".join("--" + f.replace("_", "-") for f in asked)
                problems.append(f"{knob} ({flag_names}): {self.refused[knob]}")
        if problems:
            raise ConfigurationError("knobs that cannot apply to this kernel: " + "; ".join(problems)
                                     + "; drop those flags (mneme tune --print-space lists what applies)")


def knob_applicability(kernel: Any) -> KnobApplicability:
    """What the recording of ``kernel`` lets the built-in space tune (unknown code: everything)."""
    code = getattr(kernel, "code", None)
    name = getattr(kernel, "kernel_name", None) or getattr(kernel, "name", None) or "this kernel"
    refused: dict[str, str] = {}
    if code is not None and hasattr(code, "ptx") and code.ptx is None:
        reason = (f"{name} was recorded without PTX (SASS only, as cuBLAS/cuDNN kernels and code built without "
                  "PTX for this GPU are): the PTX tier cannot recompile it, only its launch shape can be tuned")
        refused.update(dict.fromkeys(PTX_KNOBS, reason))
    if code is not None and hasattr(code, "bitcode") and code.bitcode is None:
        refused["passes"] = (f"{name} was recorded without LLVM bitcode: pipelines other than default<O3> need a "
                             "build made with `mneme config cxx` / CMake add_mneme() (the presets leave them out)")
    limited, cap = _block_shape_limits(recorded_block_limits(kernel), name, refused)
    knobs = (*LAUNCH_KNOBS, *LLVM_KNOBS, *PTX_KNOBS)
    return KnobApplicability(tuple(k for k in knobs if k not in refused), refused, limited, cap)


def _block_shape_limits(limits: BlockLimits, name: str, refused: dict[str, str]) -> tuple[dict[str, str], int | None]:
    """Refuse ``block_shape`` (into ``refused``) for code that fixes its block; (limited, cap) for code
    that caps its threads per block."""
    required, cap = limits.required, limits.max_threads
    if required is not None:
        shape = "x".join(str(d) for d in required.dims)
        refused["block_shape"] = (f"{name}'s code requires blocks of exactly {shape} ({required.describe()}): any "
                                  "other block shape fails to launch, so only the recorded launch shape runs")
        return {}, None
    if cap is None:
        return {}, None
    return {"block_shape": f"at most {cap.threads} threads per block ({cap.describe()}): larger blocks "
                           "cannot launch and are left out"}, cap.threads
