"""Build the search space a run tunes: a user's ``--space-module`` class or the built-in one."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from mneme.errors import ConfigurationError
from mneme.model.experiment import DEFAULT_PASSES
from mneme.replay.compile import BASELINE_CODEGEN_OPT
from tuner.options import TuneOptions
from tuner.space.builtin import (
    BuiltinSearchSpace,
    BuiltinSpaceSettings,
    preset_settings,
)
from tuner.space.knobs import PTX_KNOBS, KnobApplicability, knob_applicability
from tuner.space.search_space import SearchSpace, dimensions_of


def load_space_class(spec: str) -> type[SearchSpace]:
    """Import ``MODULE_OR_PATH:CLASS`` (a dotted module name, or a path to a .py file)."""
    target, sep, class_name = spec.rpartition(":")
    if not sep or not target or not class_name:
        raise ConfigurationError(
            f"--space-module {spec!r}: expected MODULE_OR_PATH:CLASS, e.g. examples/tuning_vecadd_exhaustive.py:EntireSpace"
        )
    if target.endswith(".py") or "/" in target or Path(target).is_file():
        path = Path(target)
        if not path.is_file():
            raise ConfigurationError(f"--space-module: no file {path}; check the path")
        # one name per file, the same in every process (the class's name in search_space.json and the fingerprint)
        module_name = f"mneme_space_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ConfigurationError(
                f"--space-module: importing {path} failed: {type(exc).__name__}: {exc}"
            ) from exc
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise ConfigurationError(
                f"--space-module: cannot import module {target!r}: {type(exc).__name__}: {exc}"
            ) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigurationError(f"--space-module: {target} has no class {class_name!r}")
    if not (inspect.isclass(cls) and issubclass(cls, SearchSpace)):
        raise ConfigurationError(
            f"--space-module: {class_name} in {target} is not a tuner.space.search_space.SearchSpace subclass"
        )
    return cls


def kernel_has_bitcode(kernel: Any) -> bool | None:
    """Whether the recording carries LLVM bitcode (pass pipelines need it); None when it cannot tell."""
    code = getattr(kernel, "code", None)
    if code is None or not hasattr(code, "bitcode"):
        return None
    return code.bitcode is not None


def builtin_settings(options: TuneOptions, has_bitcode: bool | None = None,
                     knobs: KnobApplicability | None = None) -> BuiltinSpaceSettings:
    """The built-in space's settings: the preset, overridden by the given flags.

    A recording without LLVM bitcode (a plain nvcc build) can run only the
    default pipeline: unless pipelines were asked for explicitly, the preset's
    other pipelines are left out instead of failing as compile errors. Knobs
    that cannot apply (``knobs.refused``: the PTX tier's, for a kernel recorded
    without PTX) are left at the recorded code's values the same way, and so is the
    block shape of code that fixes it (``.reqntid``).
    """
    passes = options.passes
    if options.fixed_passes is not None:
        passes = [options.fixed_passes]
    elif options.pipeline_file is not None:
        passes = read_pipeline_file(options.pipeline_file)

    def span(rng: list[int] | None, fixed: int | None) -> list[int] | None:
        if fixed is not None:
            return [fixed]
        return list(range(rng[0], rng[1] + 1)) if rng is not None else None

    overrides: dict[str, Any] = {
        "launch_dim": options.launch_dim,
        "launch_safety": options.launch_safety,
        "passes": passes,
        "codegen_opt": span(options.codegen_opt_range, options.fixed_codegen_opt),
        "specialize": options.specialize_space,
        "specialize_dims": options.specialize_dims_space,
        "launch_bounds": options.launch_bounds_space,
        "max_threads_policy": options.max_threads_policy,
        "max_threads_range": tuple(options.max_threads_range) if options.max_threads_range else None,
        "min_blocks_per_sm": span(options.min_blocks_per_sm_range, options.fixed_min_blocks_per_sm),
    }
    if passes is None and has_bitcode is False:
        overrides["passes"] = [DEFAULT_PASSES]
    if knobs is not None and any(k in knobs.refused for k in PTX_KNOBS):
        overrides.update(codegen_opt=[BASELINE_CODEGEN_OPT], specialize="fixed", specialize_dims="fixed",
                         launch_bounds="fixed")
    if knobs is not None and "block_shape" in knobs.refused:
        overrides["launch_dim"] = "none"
    return preset_settings(options.space_preset, overrides)


def read_pipeline_file(path: str) -> list[str]:
    """One pipeline per line; blank lines and ``#`` comments are ignored."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigurationError(f"cannot read --pipeline-file {path}: {exc.strerror}") from None
    pipelines = [ln.split("#", 1)[0].strip() for ln in lines]
    pipelines = [p for p in pipelines if p]
    if not pipelines:
        raise ConfigurationError(f"--pipeline-file {path} lists no pipeline (one per line, e.g. default<O3>)")
    return list(dict.fromkeys(pipelines))


def build_space(options: TuneOptions, kernel: Any) -> SearchSpace:
    """The run's search space, constructed for the recorded kernel instance and checked."""
    if options.space_module:
        cls = load_space_class(options.space_module)
        try:
            space = cls(kernel, **options.space_args)
        except TypeError as exc:
            raise ConfigurationError(
                f"--space-module: constructing {cls.__name__}(kernel, **{options.space_args}) failed: {exc}; "
                "check the --space-arg names"
            ) from exc
    else:
        knobs = knob_applicability(kernel)
        knobs.check_requested(options)
        space = BuiltinSearchSpace(kernel, builtin_settings(options, kernel_has_bitcode(kernel), knobs), knobs)
    dimensions_of(space)  # fail early on a malformed dimensions()
    return space
