"""Static and dynamic hashes: the ids of a recorded kernel and of one of its launches.

Both are the decimal string of an unsigned 64-bit integer, as the reference's
ids are (``"15941914485064662553"``), formed by the first 8 bytes (big-endian)
of a SHA-256 over a domain tag and the identifying bytes. The definitions are
part of the format (docs/format.md): changing them orphans every recording, so
tests pin golden values.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from mneme.model.experiment import Dim3

STATIC_TAG = b"mneme-static-v1\0"
DYNAMIC_TAG = b"mneme-dynamic-v1\0"
ATTRIBUTES_TAG = b"\0attributes\0"
_U32_MAX = 2**32 - 1


def hash_id(payload: bytes) -> str:
    """The decimal id of ``payload``: first 8 bytes of SHA-256, big-endian unsigned."""
    return str(int.from_bytes(hashlib.sha256(payload).digest()[:8], "big"))


def static_hash(kernel_name: str, code: bytes | str) -> str:
    """Identity of a kernel: its (mangled) name and its code.

    ``code`` is the PTX text of the kernel's module when it was recorded, else
    the cubin bytes: the same source built the same way gives the same id on
    every run, and a rebuilt kernel with different code gets a new one.

    Args:
        kernel_name: the mangled name.
        code: the module's PTX text, or the cubin bytes.

    Returns:
        The static hash (hex).
    """
    if isinstance(code, str):
        code = code.encode("utf-8")
    return hash_id(STATIC_TAG + kernel_name.encode("utf-8") + b"\0" + bytes(code))


def dynamic_hash(
    static: str,
    grid: Any,
    block: Any,
    shared_mem: int,
    arg_bytes: bytes,
    occurrence: int = 0,
    attributes: bytes = b"",
) -> str:
    """Identity of one launch of kernel ``static``: launch shape, dynamic shared memory, argument bytes.

    Launches that repeat the same shape and arguments (e.g. iterations of a
    solver, whose memory differs) are told apart by ``occurrence`` (the n-th
    such launch); occurrence 0 adds nothing, so the first launch's id only
    depends on what the launch itself says. ``attributes`` is the canonical
    encoding of the launch's attributes (``database.attributes_key``: cluster
    dimensions, cooperative, ...); empty adds nothing, so launches without
    attributes keep the ids they always had.

    Args:
        static: the kernel's static hash.
        grid, block: the launch's extents (``Dim3`` or its dict form).
        shared_mem: dynamic shared memory in bytes.
        arg_bytes: the exact parameter bytes.
        occurrence: which repeat of an identical launch (``--record-duplicates``; 0: the first).
        attributes: the launch attributes' encoded bytes.

    Returns:
        The dynamic hash (hex).
    """
    g, b = Dim3.from_value(grid), Dim3.from_value(block)
    values = (*g.as_tuple(), *b.as_tuple(), shared_mem)
    for v in values:
        if not 0 <= v <= _U32_MAX:
            raise ValueError(f"launch value {v} does not fit an unsigned 32-bit integer")
    if occurrence < 0 or occurrence > _U32_MAX:
        raise ValueError(f"occurrence {occurrence} must be in 0..{_U32_MAX}")
    payload = DYNAMIC_TAG + static.encode("utf-8") + b"\0" + struct.pack("<7I", *values) + bytes(arg_bytes)
    if attributes:
        payload += ATTRIBUTES_TAG + struct.pack("<I", len(attributes)) + bytes(attributes)
    if occurrence > 0:
        payload += struct.pack("<I", occurrence)
    return hash_id(payload)
