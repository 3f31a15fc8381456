"""LLVM pass pipelines (``passes``) parsed from new-pass-manager syntax and run with llvmlite.

llvmlite 0.50 has no textual pipeline parser; it exposes the per-module default
pipelines (by speed level) and a fixed set of named passes. So mneme parses
the string itself:

* ``default<O0>`` .. ``default<O3>``: LLVM's per-module default pipeline,
  tuned like clang at that level (loop unrolling and vectorization from O2).
* ``default<Os>`` / ``default<Oz>``: llvmlite 0.50 cannot build LLVM's Os/Oz
  pipelines (its ``LLVMPY_buildPerModuleDefaultPipeline`` takes a speed level
  0..3 only, and ``libllvmlite.so`` exports nothing else that builds one; the
  details are in docs/llvm-tier.md). These run the O2 pipeline set up as
  clang's -Os/-Oz: functions marked ``optsize`` (Os) or ``optsize minsize``
  (Oz), LLVM's inliner threshold for the size level, no loop vectorizer at Oz.
* a comma-separated list of pass names (``sroa,instcombine,simplifycfg``),
  optionally grouped as ``function(...)``, ``module(...)``, ``cgscc(...)`` or
  ``loop(...)`` (flattened: each pass runs over the whole module in turn); a
  ``default<..>`` may appear in the list too.

An unknown name, or an LLVM pass llvmlite does not expose, is a
ConfigurationError that lists the available names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mneme.errors import ConfigurationError

DEFAULT_LEVELS = ("O0", "O1", "O2", "O3", "Os", "Oz")

# LLVM new-pass-manager name -> llvmlite ModulePassManager method.
NAMED_PASSES: dict[str, str] = {
    "adce": "add_aggressive_dce_pass",
    "aggressive-instcombine": "add_aggressive_instcombine_pass",
    "always-inline": "add_always_inliner_pass",
    "argpromotion": "add_argument_promotion_pass",
    "break-crit-edges": "add_break_critical_edges_pass",
    "constmerge": "add_constant_merge_pass",
    "dce": "add_dead_code_elimination_pass",
    "deadargelim": "add_dead_arg_elimination_pass",
    "dse": "add_dead_store_elimination_pass",
    "function-attrs": "add_post_order_function_attributes_pass",
    "globaldce": "add_global_dead_code_eliminate_pass",
    "globalopt": "add_global_opt_pass",
    "instcombine": "add_instruction_combine_pass",
    "instnamer": "add_instruction_namer_pass",
    "ipsccp": "add_ipsccp_pass",
    "jump-threading": "add_jump_threading_pass",
    "lcssa": "add_lcssa_pass",
    "loop-deletion": "add_loop_deletion_pass",
    "loop-extract": "add_loop_extract_pass",
    "loop-reduce": "add_loop_strength_reduce_pass",
    "loop-rotate": "add_loop_rotate_pass",
    "loop-simplify": "add_loop_simplify_pass",
    "loop-unroll": "add_loop_unroll_pass",
    "loop-unroll-and-jam": "add_loop_unroll_and_jam_pass",
    "lower-atomic": "add_lower_atomic_pass",
    "lower-switch": "add_lower_switch_pass",
    "lowerinvoke": "add_lower_invoke_pass",
    "memcpyopt": "add_mem_copy_opt_pass",
    "mergefunc": "add_merge_functions_pass",
    "mergereturn": "add_unify_function_exit_nodes_pass",
    "newgvn": "add_new_gvn_pass",
    "partial-inliner": "add_partial_inliner_pass",
    "reassociate": "add_reassociate_pass",
    "reg2mem": "add_register_to_memory_pass",
    "rpo-function-attrs": "add_rpo_function_attrs_pass",
    "sccp": "add_sccp_pass",
    "simplifycfg": "add_simplify_cfg_pass",
    "sink": "add_sinking_pass",
    "sroa": "add_sroa_pass",
    "strip": "add_strip_symbols_pass",
    "strip-dead-debug-info": "add_strip_dead_debug_info_pass",
    "strip-dead-prototypes": "add_strip_dead_prototype_pass",
    "strip-debug-declare": "add_strip_debug_declare_pass",
    "strip-nondebug": "add_strip_non_debug_symbols_pass",
    "tailcallelim": "add_tail_call_elimination_pass",
    "verify": "add_verifier",
}
# LLVM passes users often name that llvmlite 0.50 does not expose, with what to use instead.
_NOT_EXPOSED = {
    "gvn": "newgvn",
    "mem2reg": "sroa",
    "early-cse": "newgvn or instcombine",
    "licm": "a default<..> pipeline",
    "inline": "always-inline, partial-inliner or a default<..> pipeline",
    "loop-vectorize": "a default<O2|O3> pipeline",
    "slp-vectorizer": "a default<O2|O3> pipeline",
    "indvars": "a default<..> pipeline",
    "instsimplify": "instcombine",
    "internalize": "the internalize configuration knob (it keeps the kernel and device variables)",
}
_GROUPS = ("function", "module", "cgscc", "loop")
_DEFAULT = re.compile(r"default<([^>]*)>")


@dataclass(frozen=True)
class PipelineStep:
    """One unit the runner executes: a default pipeline (``level``) or a run of named passes."""

    level: str | None = None
    passes: tuple[str, ...] = ()


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
            if depth < 0:
                raise ConfigurationError(f"unbalanced brackets in passes={text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ConfigurationError(f"unbalanced brackets in passes={text!r}")
    parts.append("".join(current).strip())
    return parts


def _unknown(name: str, pipeline: str) -> ConfigurationError:
    hint = _NOT_EXPOSED.get(name)
    if hint:
        return ConfigurationError(
            f"pass {name!r} in passes={pipeline!r} is an LLVM pass that llvmlite does not expose; use {hint}"
        )
    return ConfigurationError(
        f"unknown pass {name!r} in passes={pipeline!r}; use default<O0|O1|O2|O3|Os|Oz> or comma-separated "
        f"pass names from: {', '.join(sorted(NAMED_PASSES))}"
    )


def _flatten(element: str, pipeline: str) -> list[str | tuple[str]]:
    """Names of one top-level element; a default level comes back as a 1-tuple."""
    if not element:
        raise ConfigurationError(f"empty pass name in passes={pipeline!r}")
    match = _DEFAULT.fullmatch(element)
    if match:
        level = match.group(1)
        if level not in DEFAULT_LEVELS:
            raise ConfigurationError(
                f"unknown optimization level {level!r} in passes={pipeline!r}; use one of "
                + ", ".join(f"default<{lvl}>" for lvl in DEFAULT_LEVELS)
            )
        return [(level,)]
    for group in _GROUPS:
        if element.startswith(group + "(") and element.endswith(")"):
            out: list[str | tuple[str]] = []
            for inner in _split_top(element[len(group) + 1 : -1]):
                out.extend(_flatten(inner, pipeline))
            return out
    if element not in NAMED_PASSES:
        raise _unknown(element, pipeline)
    return [element]


def parse_pipeline(passes: str) -> list[PipelineStep]:
    """Parse ``passes`` into steps; ConfigurationError for anything that would not run."""
    if not isinstance(passes, str) or not passes.strip():
        raise ConfigurationError("passes must name a pipeline, e.g. 'default<O3>' or 'sroa,instcombine'")
    steps: list[PipelineStep] = []
    pending: list[str] = []
    for element in _split_top(passes.strip()):
        for item in _flatten(element, passes):
            if isinstance(item, tuple):
                if pending:
                    steps.append(PipelineStep(passes=tuple(pending)))
                    pending = []
                steps.append(PipelineStep(level=item[0]))
            else:
                pending.append(item)
    if pending:
        steps.append(PipelineStep(passes=tuple(pending)))
    return steps


# Size level -> (function attribute clang sets, LLVM's inliner threshold at that level:
# InlineConstants::OptSizeThreshold / OptMinSizeThreshold, what getInlineParams(2, size) picks).
_SIZE_LEVELS = {"Os": ("optsize", 50), "Oz": ("minsize", 5)}


def _speed_and_size(level: str) -> tuple[int, str | None]:
    if level in _SIZE_LEVELS:
        return 2, level
    return int(level[1]), None


def _tuning_options(speed: int, size: str | None = None):
    from mneme.llvm._binding import llvm

    pto = llvm().create_pipeline_tuning_options(speed)
    pto.loop_unrolling = speed >= 2  # clang: -funroll-loops from -O2 (Os and Oz are speed level 2)
    pto.loop_vectorization = speed >= 2 and size != "Oz"  # clang vectorizes loops at -Os, not at -Oz
    pto.slp_vectorization = speed >= 2
    if size is not None:
        pto.inlining_threshold = _SIZE_LEVELS[size][1]
    return pto


def _mark_size(module, size: str) -> None:
    for fn in module.functions:
        if not fn.is_declaration:
            fn.add_function_attribute("optsize")
            if _SIZE_LEVELS[size][0] == "minsize":
                fn.add_function_attribute("minsize")


def run_pipeline(module, steps: list[PipelineStep], target_machine) -> None:
    """Run ``steps`` on ``module`` in place (the target machine registers the NVPTX passes)."""
    from mneme.llvm._binding import llvm

    binding = llvm()
    for step in steps:
        if step.level is not None:
            speed, size = _speed_and_size(step.level)
            if size:
                _mark_size(module, size)
            builder = binding.create_pass_builder(target_machine, _tuning_options(speed, size))
            builder.getModulePassManager().run(module, builder)
        else:
            builder = binding.create_pass_builder(target_machine, _tuning_options(2))
            manager = binding.create_new_module_pass_manager()
            for name in step.passes:
                getattr(manager, NAMED_PASSES[name])()
            manager.run(module, builder)
