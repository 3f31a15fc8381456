"""Object names of a recording directory (a store prefix).

The reference's names are kept (``<static>.json``,
``DeviceState.{prologue,epilogue}.<static>.<dynamic>.mneme``,
``RecordedIR_<static>.bc``); mneme adds the kernel's PTX and cubin and the
shared, content-addressed ``chunks/`` tree.
"""

from __future__ import annotations

import re

from mneme.errors import ArtifactError

PHASES = ("prologue", "epilogue")
CHUNKS_DIR = "chunks"

_HASH_ID = re.compile(r"[0-9]{1,20}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_hash_id(value: object) -> bool:
    """Whether ``value`` is a static/dynamic hash: the decimal string of an unsigned 64-bit integer."""
    return isinstance(value, str) and bool(_HASH_ID.fullmatch(value)) and int(value) < 2**64


def is_sha256_hex(value: object) -> bool:
    """Whether ``value`` is 64 lowercase hex digits (a SHA-256 or BLAKE3 digest)."""
    return isinstance(value, str) and bool(_SHA256_HEX.fullmatch(value))


def _check_id(value: str, what: str) -> str:
    if not is_hash_id(value):
        raise ArtifactError(f"{what} {value!r} is not a hash id (a decimal unsigned 64-bit integer)")
    return value


def database_name(static_hash: str) -> str:
    return f"{_check_id(static_hash, 'static hash')}.json"


def snapshot_name(phase: str, static_hash: str, dynamic_hash: str) -> str:
    if phase not in PHASES:
        raise ArtifactError(f"snapshot phase {phase!r} is not one of {PHASES}")
    return (
        f"DeviceState.{phase}.{_check_id(static_hash, 'static hash')}."
        f"{_check_id(dynamic_hash, 'dynamic hash')}.mneme"
    )


def ptx_name(static_hash: str) -> str:
    return f"Kernel_{_check_id(static_hash, 'static hash')}.ptx"


def cubin_name(static_hash: str) -> str:
    return f"Kernel_{_check_id(static_hash, 'static hash')}.cubin"


def bitcode_name(static_hash: str) -> str:
    return f"RecordedIR_{_check_id(static_hash, 'static hash')}.bc"


def chunk_name(digest_hex: str) -> str:
    """``chunks/<first 2 hex>/<hex digest>`` (BLAKE3, or SHA-256 in version 1): the fan-out keeps directories small."""
    if not is_sha256_hex(digest_hex):
        raise ArtifactError(f"chunk id {digest_hex!r} is not a 256-bit hex digest")
    return f"{CHUNKS_DIR}/{digest_hex[:2]}/{digest_hex}"
