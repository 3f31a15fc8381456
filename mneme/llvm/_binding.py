"""The one place that imports llvmlite: lazy, initialized once, with a clear error when missing."""

from __future__ import annotations

import functools
import threading
from types import ModuleType

from mneme.errors import ArtifactError, ConfigurationError, NotAvailableError

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def llvm() -> ModuleType:
    """``llvmlite.binding`` with the NVPTX target initialized."""
    try:
        import llvmlite.binding as binding
    except ImportError:
        raise NotAvailableError(
            "the LLVM IR tier needs llvmlite (pip install 'llvmlite==0.50.0' or pip install 'mneme[llvm]')"
        ) from None
    binding.initialize_all_targets()
    binding.initialize_all_asmprinters()
    return binding


def llvm_version() -> tuple[int, int, int]:
    return tuple(llvm().llvm_version_info)  # type: ignore[return-value]


def parse_bitcode(bitcode: bytes):
    """A ModuleRef from bitcode; ArtifactError when the bytes are not readable bitcode."""
    if not isinstance(bitcode, (bytes, bytearray, memoryview)) or len(bitcode) < 4:
        raise ArtifactError("the kernel IR is empty or not bytes; expected LLVM bitcode (RecordedIR_<static>.bc)")
    try:
        return llvm().parse_bitcode(bytes(bitcode))
    except RuntimeError as exc:
        raise ArtifactError(f"the kernel IR is not readable LLVM bitcode: {str(exc).strip()}") from None


def parse_assembly(text: str, what: str = "the IR"):
    """A verified ModuleRef from textual IR; ConfigurationError naming LLVM's complaint."""
    try:
        module = llvm().parse_assembly(text)
        module.verify()
    except RuntimeError as exc:
        raise ConfigurationError(f"{what} is not valid LLVM IR: {str(exc).strip()}") from None
    return module


_per_thread = threading.local()


def target_machine(arch: str, features: str, opt_level: int):
    """An NVPTX TargetMachine, cached per thread (creating one costs more than a small
    kernel's code generation; LLVM does not promise concurrent use of one machine)."""
    cache = getattr(_per_thread, "machines", None)
    if cache is None:
        cache = _per_thread.machines = {}
    key = (arch, features, opt_level)
    if key not in cache:
        binding = llvm()
        with _lock:
            target = binding.Target.from_triple(NVPTX_TRIPLE)
            cache[key] = target.create_target_machine(cpu=arch, features=features, opt=opt_level)
    return cache[key]
