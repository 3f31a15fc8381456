"""Python access to a recorded kernel's IR: read it, transform it, compile the result.

>>> m = mneme.llvm.load("rdb/1234.json")               # RecordedIR_1234.bc beside it
>>> for fn in m.defined_functions():
...     for block in fn.blocks:
...         for inst in block.instructions:
...             print(inst.opcode, inst)
>>> faster = m.transform(lambda ir: ir.replace("fdiv float", "fdiv fast float"))
>>> ptx = faster.to_ptx(passes="default<O3>")           # or faster.bitcode for a replay

Functions, blocks and instructions are llvmlite ``ValueRef`` objects (``name``,
``type``, ``blocks``, ``instructions``, ``operands``, ``opcode``...). An
:class:`IRModule` is immutable: transformations return a new one, so the
recorded IR is never changed by accident.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from mneme.errors import ArtifactError, ConfigurationError
from mneme.llvm import _binding, ir_text, names


class IRModule:
    """One LLVM module of kernel code (usually one kernel and what it calls)."""

    def __init__(self, bitcode: bytes, *, kernel: str | None = None, origin: str = "") -> None:
        self._bitcode = bytes(bitcode)
        self._module = _binding.parse_bitcode(self._bitcode)
        self.origin = origin
        kernels = self.kernels
        index = names.pick(kernel, kernels) if kernel is not None else None
        if kernel is not None and index is None:
            raise ConfigurationError(f"kernel {kernel!r} is not in {origin or 'the IR'}; it has {kernels}")
        #: the kernel's name in this IR (clang's mangling)
        self.kernel = kernels[index] if index is not None else (kernels[0] if len(kernels) == 1 else None)
        #: the name the replay launches (the recorded one: nvcc's mangling); to_ptx names the entry so
        self.launch_name = kernel if kernel is not None else self.kernel

    # -- reading ------------------------------------------------------------
    @property
    def module(self):
        """The llvmlite ``ModuleRef`` (treat as read-only; use :meth:`apply` to change it)."""
        return self._module

    @property
    def text(self) -> str:
        return str(self._module)

    @property
    def bitcode(self) -> bytes:
        return self._bitcode

    @property
    def kernels(self) -> list[str]:
        return ir_text.kernel_names(self.text)

    def functions(self) -> Iterator[Any]:
        return iter(self._module.functions)

    def defined_functions(self) -> Iterator[Any]:
        return (fn for fn in self._module.functions if not fn.is_declaration)

    def function(self, name: str):
        try:
            return self._module.get_function(name)
        except NameError:
            raise ConfigurationError(f"no function {name!r} in {self.origin or 'the IR'}") from None

    def global_variables(self) -> Iterator[Any]:
        return iter(self._module.global_variables)

    def instructions(self, function: str | None = None) -> Iterator[Any]:
        """Every instruction of ``function`` (default: the kernel), in block order."""
        name = function or self._require_kernel()
        for block in self.function(name).blocks:
            yield from block.instructions

    def opcode_histogram(self, function: str | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for inst in self.instructions(function):
            counts[inst.opcode] = counts.get(inst.opcode, 0) + 1
        return counts

    def _require_kernel(self) -> str:
        if self.kernel is None:
            raise ConfigurationError(f"the IR has kernels {self.kernels}; name one (kernel=...)")
        return self.kernel

    # -- transforming ---------------------------------------------------------
    def transform(self, edit: Callable[[str], str]) -> "IRModule":
        """A new module from ``edit(textual IR)``; ConfigurationError if the result is not valid IR."""
        new_text = edit(self.text)
        if not isinstance(new_text, str):
            raise ConfigurationError(f"a transformation must return the IR text (str), got {type(new_text).__name__}")
        module = _binding.parse_assembly(new_text, "the transformed IR")
        return self._successor(module.as_bitcode(), "transformed")

    def apply(self, mutate: Callable[[Any], None]) -> "IRModule":
        """A new module after ``mutate(module_ref)`` changed a private copy in place
        (llvmlite's binding: linkage, names, function attributes, named passes...)."""
        copy = _binding.parse_bitcode(self._bitcode)
        mutate(copy)
        try:
            copy.verify()
        except RuntimeError as exc:
            raise ConfigurationError(f"the mutated IR is not valid: {str(exc).strip()}") from None
        return self._successor(copy.as_bitcode(), "transformed")

    def optimize(self, passes: str) -> "IRModule":
        """A new module after the ``passes`` pipeline (same syntax as the configuration's)."""
        from mneme.llvm import pipeline

        steps = pipeline.parse_pipeline(passes)
        copy = _binding.parse_bitcode(self._bitcode)
        features = ir_text.ptx_features(self.text, "sm_90")
        pipeline.run_pipeline(copy, steps, _binding.target_machine("sm_90", features, 3))
        return self._successor(copy.as_bitcode(), passes)

    def _successor(self, bitcode: bytes, how: str) -> "IRModule":
        """The module a transformation made; it keeps the launch name unless the kernel was renamed."""
        following = IRModule(bitcode, origin=f"{self.origin} ({how})")
        if self.launch_name is not None and names.pick(self.launch_name, following.kernels) is not None:
            return IRModule(bitcode, kernel=self.launch_name, origin=following.origin)
        return following

    # -- output -----------------------------------------------------------------
    def to_ptx(self, **options: Any) -> str:
        """PTX through :func:`mneme.llvm.compile_to_ptx` (same keyword options)."""
        from mneme.llvm.compile import compile_to_ptx

        self._require_kernel()
        options.setdefault("kernel", self.launch_name)
        return compile_to_ptx(self._bitcode, **options)

    def save(self, path: str | os.PathLike) -> Path:
        out = Path(path)
        out.write_bytes(self._bitcode)
        return out

    def __repr__(self) -> str:
        return f"IRModule(kernel={self.kernel!r}, functions={sum(1 for _ in self.defined_functions())}, origin={self.origin!r})"


def _bitcode_beside_database(path: Path) -> Path:
    from mneme.format.layout import bitcode_name

    static = path.stem
    try:
        static = json.loads(path.read_text()).get("static_hash", static)
    except (OSError, ValueError, AttributeError):
        pass
    candidate = path.with_name(bitcode_name(str(static)))
    if not candidate.exists():
        raise ArtifactError(
            f"{path}: the recording has no LLVM IR ({candidate.name} is missing); the program was not built "
            "through `mneme config cxx` or add_mneme(), so only the PTX tier applies"
        )
    return candidate


def load(recording_or_bitcode: Any, kernel: str | None = None) -> IRModule:
    """An :class:`IRModule` from: bitcode bytes; a ``.bc`` file; a recording database
    (``<static>.json``, reading ``RecordedIR_<static>.bc`` beside it); an instrumented
    executable (with ``kernel``); or an object with a ``bitcode`` attribute."""
    source = recording_or_bitcode
    if isinstance(source, (bytes, bytearray, memoryview)):
        if bytes(source[:4]) == b"\x7fELF":
            return _from_elf(bytes(source), kernel, "ELF bytes")
        return IRModule(bytes(source), kernel=kernel, origin="bitcode")
    if isinstance(source, IRModule):
        return source
    if hasattr(source, "bitcode") and not isinstance(source, (str, os.PathLike)):
        return IRModule(bytes(source.bitcode), kernel=kernel, origin=repr(source))
    path = Path(source)
    if not path.exists():
        raise ArtifactError(f"{path} does not exist")
    if path.suffix == ".json":
        path = _bitcode_beside_database(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"\x7fELF":
        return _from_elf(str(path), kernel, str(path))
    return IRModule(path.read_bytes(), kernel=kernel, origin=str(path))


def _from_elf(source, kernel: str | None, origin: str) -> IRModule:
    from mneme.llvm.embedded import embedded_kernels, find_kernel_bitcode

    if kernel is None:
        raise ConfigurationError(f"{origin} is an executable; name the kernel (kernel=...): {embedded_kernels(source)}")
    bitcode = find_kernel_bitcode(source, kernel)
    if bitcode is None:
        raise ArtifactError(
            f"{origin} carries no LLVM IR for kernel {kernel!r}; it has IR for {embedded_kernels(source)}"
        )
    return IRModule(bitcode, kernel=kernel, origin=origin)
