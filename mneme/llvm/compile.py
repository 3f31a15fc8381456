"""Recorded bitcode -> PTX: preprocessing, the ``passes`` pipeline, NVPTX code generation.

This is the replay engine's compile step for the LLVM tier (it passes the PTX
on to the PTX tier: driver JIT with ``codegen_opt``). The three phases are
timed separately because the reference reports them (``preprocess_ir_time``,
``opt_time``, ``codegen_time``).

Preprocessing, in order: retarget to ``arch``; internalize (every defined
function except the kernel); specialize launch dimensions; specialize
arguments; add launch bounds; link libdevice if ``__nv_*`` calls remain; inline
the specialized body; prune (global DCE, dead prototypes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mneme.errors import ConfigurationError
from mneme.llvm import _binding, ir_text, libdevice, names, pipeline
from mneme.llvm import specialize as spec

Dims = tuple[tuple[int, int, int], tuple[int, int, int]]


@dataclass(frozen=True)
class CompileTimings:
    """Seconds spent in each phase of :func:`compile_to_ptx_timed`."""

    preprocess_ir_time: float
    opt_time: float
    codegen_time: float

    @property
    def total(self) -> float:
        return self.preprocess_ir_time + self.opt_time + self.codegen_time


def _check_options(codegen_opt: int, launch_bounds, dims) -> None:
    if not isinstance(codegen_opt, int) or not 0 <= codegen_opt <= 4:
        raise ConfigurationError(f"codegen_opt={codegen_opt!r} must be in 0..4")
    if launch_bounds is not None:
        max_threads, min_blocks = launch_bounds
        if not (isinstance(max_threads, int) and 1 <= max_threads <= 1024):
            raise ConfigurationError(f"launch bound max_threads={max_threads!r} must be in 1..1024")
        if min_blocks is not None and not (isinstance(min_blocks, int) and min_blocks >= 0):
            raise ConfigurationError(f"launch bound min_blocks_per_sm={min_blocks!r} must be >= 0")
    if dims is not None and (len(dims) != 2 or any(len(d) != 3 for d in dims)):
        raise ConfigurationError(f"dims={dims!r} must be ((grid x, y, z), (block x, y, z))")


def _name_kernel(module, kernel: str) -> None:
    """Give the kernel the name the replay launches (the recorded, nvcc-mangled one) and
    external linkage, so the PTX entry is visible under that name."""
    binding = _binding.llvm()
    kernels = ir_text.kernel_names(str(module))
    index = names.pick(kernel, kernels)
    if index is None:
        raise ConfigurationError(
            f"kernel {kernel!r} is not in the IR; it defines {', '.join(kernels) or 'no kernels'}"
        )
    fn = module.get_function(kernels[index])
    if fn.name != kernel:
        fn.name = kernel
    if fn.linkage in (binding.Linkage.internal, binding.Linkage.private):
        fn.linkage = binding.Linkage.external


def preprocess(
    bitcode: bytes,
    *,
    kernel: str,
    specialize: dict[int, bytes] | None = None,
    dims: Dims | None = None,
    launch_bounds: tuple[int, int | None] | None = None,
    prune: bool = True,
    internalize: bool = True,
    arch: str = "sm_90",
):
    """The module ready for the pipeline (a llvmlite ModuleRef) and the NVPTX target features."""
    binding = _binding.llvm()
    module = _binding.parse_bitcode(bitcode)
    if not module.triple.startswith("nvptx"):
        raise ConfigurationError(f"the IR targets {module.triple!r}, not NVPTX; it is not CUDA device code")
    _name_kernel(module, kernel)
    text = str(module)
    params = spec.describe_params(module, kernel) if specialize else []
    if internalize:
        for fn in module.functions:
            if not fn.is_declaration and fn.name != kernel:
                fn.linkage = binding.Linkage.internal
        text = str(module)
    features = ir_text.ptx_features(text, arch)
    text = ir_text.retarget(text, arch, features)
    if dims is not None:
        text = ir_text.specialize_dims(text, tuple(dims[0]), tuple(dims[1]))
    if specialize:
        text = spec.specialize_arguments(text, kernel, params, specialize)
    if launch_bounds is not None:
        text = ir_text.add_launch_bounds(
            text, kernel, launch_bounds[0], launch_bounds[1], attributes=_binding.llvm_version() >= (21, 0, 0)
        )
    module = _binding.parse_assembly(text, "the preprocessed kernel IR")
    if libdevice.needs_libdevice(module):
        libdevice.link_libdevice(module)
    manager = binding.create_new_module_pass_manager()
    if specialize:
        module.get_function(kernel + spec.BODY_SUFFIX).add_function_attribute("alwaysinline")
        manager.add_always_inliner_pass()
    if prune:
        manager.add_global_dead_code_eliminate_pass()
        manager.add_strip_dead_prototype_pass()
    tm = _binding.target_machine(arch, features, 3)
    manager.run(module, binding.create_pass_builder(tm, binding.create_pipeline_tuning_options(0)))
    return module, features


def compile_to_ptx_timed(
    bitcode: bytes,
    *,
    kernel: str,
    passes: str = "default<O3>",
    codegen_opt: int = 3,
    specialize: dict[int, bytes] | None = None,
    dims: Dims | None = None,
    launch_bounds: tuple[int, int | None] | None = None,
    prune: bool = True,
    internalize: bool = True,
    arch: str = "sm_90",
) -> tuple[str, CompileTimings]:
    """:func:`compile_to_ptx` plus the time of each phase."""
    steps = pipeline.parse_pipeline(passes)  # a bad pipeline fails before any work
    _check_options(codegen_opt, launch_bounds, dims)
    t0 = time.perf_counter()
    module, features = preprocess(
        bitcode, kernel=kernel, specialize=specialize, dims=dims, launch_bounds=launch_bounds,
        prune=prune, internalize=internalize, arch=arch,
    )
    # LLVM's code generator has levels 0..3; the driver JIT's level 4 maps to LLVM's highest.
    tm = _binding.target_machine(arch, features, min(codegen_opt, 3))
    t1 = time.perf_counter()
    pipeline.run_pipeline(module, steps, tm)
    t2 = time.perf_counter()
    try:
        ptx = tm.emit_assembly(module)
    except RuntimeError as exc:
        raise ConfigurationError(f"NVPTX code generation failed for {kernel}: {str(exc).strip()}") from None
    t3 = time.perf_counter()
    return ptx, CompileTimings(preprocess_ir_time=t1 - t0, opt_time=t2 - t1, codegen_time=t3 - t2)


def compile_to_ptx(
    bitcode: bytes,
    *,
    kernel: str,
    passes: str = "default<O3>",
    codegen_opt: int = 3,
    specialize: dict[int, bytes] | None = None,
    dims: Dims | None = None,
    launch_bounds: tuple[int, int | None] | None = None,
    prune: bool = True,
    internalize: bool = True,
    arch: str = "sm_90",
) -> str:
    """Compile ``kernel`` of ``bitcode`` to PTX text.

    ``passes``: ``default<O0..O3|Os|Oz>`` or comma-separated pass names (see
    :mod:`mneme.llvm.pipeline`). ``specialize``: parameter index -> recorded
    argument bytes, folded in as constants. ``dims``: ``((grid), (block))`` to
    fold the launch dimensions. ``launch_bounds``: ``(max_threads,
    min_blocks_per_sm)`` as NVVM attributes (``.maxntid``/``.minnctapersm``).
    Raises ConfigurationError for a bad option or IR that does not compile,
    ArtifactError for unreadable bitcode.
    """
    ptx, _ = compile_to_ptx_timed(
        bitcode, kernel=kernel, passes=passes, codegen_opt=codegen_opt, specialize=specialize, dims=dims,
        launch_bounds=launch_bounds, prune=prune, internalize=internalize, arch=arch,
    )
    return ptx
