"""Writes spool directories the way the native recorder does (record_agent/README.md), for CPU tests of the agent.

Only plumbing is faked here: the bytes and layout follow the contract, the
code is the real vector-add PTX and cubin shipped with mneme.format.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from mneme.testing import vecadd_code

WINDOW = 0x7F0000000000
KERNEL = vecadd_code.KERNEL_NAME


def write_module(spool: Path, module_id: int = 7, *, with_ptx_source: bool = True, kernels=(KERNEL,), globals_=(),
                 ptx: str = vecadd_code.PTX) -> None:
    """A module the recorder kept: the vector add's cubin, and ``ptx`` as the source its load call passed."""
    mods = spool / "modules"
    mods.mkdir(parents=True, exist_ok=True)
    cubin = vecadd_code.CUBIN
    (mods / f"{module_id}.cubin").write_bytes(cubin)
    src = ptx.encode() if with_ptx_source else b""
    if src:
        (mods / f"{module_id}.src").write_bytes(src)
    (mods / f"{module_id}.json").write_text(json.dumps({
        "module_id": module_id, "cubin_size": len(cubin), "source_kind": "ptx" if src else "",
        "source_size": len(src), "kernels": list(kernels), "globals": list(globals_),
    }))


def vecadd_arrays(n: int, k: int = 0) -> tuple[bytes, bytes, bytes, bytes]:
    a = struct.pack(f"<{n}f", *(i * 0.5 for i in range(n)))
    b = struct.pack(f"<{n}f", *(2.0 - i * 0.25 for i in range(n)))
    c0 = struct.pack(f"<{n}f", *(k * (i * 0.5 + 2.0 - i * 0.25) for i in range(n)))
    c1 = struct.pack(f"<{n}f", *((k + 1) * (i * 0.5 + 2.0 - i * 0.25) for i in range(n)))
    return a, b, c0, c1


def write_entry(
    spool: Path,
    seq: int,
    *,
    n: int = 256,
    k: int = 0,
    launch_index: int = 0,
    module_id: int = 7,
    committed: bool = True,
    window_reserved: bool = True,
    policy: dict | None = None,
    warnings=(),
    extra_regions=(),
    device: int = 0,
    attributes=(),
    digests: set | None = None,
    extra: dict | None = None,
) -> Path:
    """One committed (or .tmp) entry of a vector add (``extra``: more launch.json keys). With ``digests`` (a set shared across calls: what the
    recorder has captured before), pieces get digests and those seen before are not copied: their bytes
    are zeros in the stripe file, as the recorder's holes read."""
    a, b, c0, c1 = vecadd_arrays(n, k)
    size = 4 * n
    stride = (size + 511) // 512 * 512
    bases = [WINDOW, WINDOW + stride, WINDOW + 2 * stride]
    stripes = 2
    pro, epi = [b""] * stripes, [b""] * stripes  # regions alternate between the stripe files, like the recorder's chunks
    regions = []
    contents = [(base, "heap", "", before, after, None) for base, before, after in zip(bases, (a, b, c0), (a, b, c1))]
    for region in extra_regions:  # (kind, name, base, before, after[, array shape])
        kind, name, base, before, after, *array = region
        contents.append((base, kind, name, before, after, array[0] if array else None))
    for i, (base, kind, name, before, after, array) in enumerate(contents):
        k = i % stripes
        r = {"kind": kind, "name": name, "base": base, "size": len(before), "pieces": [[k, len(pro[k]), len(before)]]}
        if array is not None:  # a CUDA array's contents: its shape (record_agent/README.md)
            r["array"] = array
        if base == bases[2] and policy:
            r["policy"] = policy
        if digests is not None:  # a stand-in for the GPU digest: any content hash will do for the agent
            for phase, data in (("prologue", before), ("epilogue", after)):
                d = hashlib.sha1(data).hexdigest()[:32]
                skipped = d in digests
                digests.add(d)
                r[phase] = {"digests": [d], "skipped": [0] if skipped else []}
            before = bytes(len(before)) if r["prologue"]["skipped"] else before
            after = bytes(len(after)) if r["epilogue"]["skipped"] else after
        regions.append(r)
        pro[k] += before
        epi[k] += after
    args = struct.pack("<QQQi", *bases, n)
    entry = {
        "format": "mneme-spool-entry/4", "stripes": stripes, "seq": seq, "pid": 1, "rank": "", "kernel": KERNEL,
        "demangled": vecadd_code.DEMANGLED, "api": "cuLaunchKernel", "launch_index": launch_index,
        "identity": "0", "device": device, "device_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90",
        "grid": [(n + 255) // 256, 1, 1], "block": [256, 1, 1], "shared_mem": 0, "module_id": module_id,
        "param_offsets": [0, 8, 16, 24], "param_sizes": [8, 8, 8, 4], "param_buffer_size": len(args),
        "args": args.hex(), "attributes": list(attributes),
        "allocations": [{"base": base, "size": size, "in_window": window_reserved} for base in bases],
        "windows": [{"device": device, "base": WINDOW, "size": 4 << 30, "reserved": window_reserved}],
        "snapshot_scope": "all", "regions": regions, "prologue_bytes": sum(map(len, pro)), "epilogue_bytes": sum(map(len, epi)),
        "prologue_seconds": 0.001, "epilogue_seconds": 0.001, "warnings": list(warnings),
        **(extra or {}),
    }
    # Like the recorder: write under .tmp, rename to commit (an agent polling meanwhile sees all or nothing).
    tmp = spool / "entries" / f"{seq:08d}.tmp"
    tmp.mkdir(parents=True)
    for k in range(stripes):
        (tmp / f"prologue.{k}.bin").write_bytes(pro[k])
        (tmp / f"epilogue.{k}.bin").write_bytes(epi[k])
    (tmp / "launch.json").write_text(json.dumps(entry))
    if not committed:
        return tmp
    final = spool / "entries" / f"{seq:08d}"
    tmp.rename(final)
    return final


def write_abandoned_entry(spool: Path, seq: int, reason: str, **kw) -> Path:
    """An entry the recorder abandoned at a deadline: the launch's metadata, ``abandoned`` (why), no regions and
    no snapshot files (``stripes`` 0), committed like any entry (``kw`` as for ``write_entry``)."""
    tmp = write_entry(spool, seq, committed=False, **kw)
    entry = json.loads((tmp / "launch.json").read_text())
    for f in tmp.glob("*.bin"):
        f.unlink()
    entry.update(stripes=0, regions=[], prologue_bytes=0, epilogue_bytes=0, abandoned=reason)
    for key in ("prologue_seconds", "epilogue_seconds"):
        entry.pop(key, None)
    (tmp / "launch.json").write_text(json.dumps(entry))
    final = spool / "entries" / f"{seq:08d}"
    tmp.rename(final)
    return final


# -- texture and surface objects (launch.json "objects", array regions) ------------------------------------------

FLOAT = 0x20  # CU_AD_FORMAT_FLOAT


def texture_desc(*, filter_mode: int = 0, normalized: bool = False, address_mode: int = 1) -> dict:
    """A texture descriptor as the recorder writes it (mneme.format.textures.TextureDesc)."""
    return {"address_mode": [address_mode] * 3, "filter_mode": filter_mode, "flags": 0x2 if normalized else 0x1,
            "max_anisotropy": 0, "mipmap_filter_mode": 0, "mipmap_level_bias": 0.0, "min_mipmap_level_clamp": 0.0,
            "max_mipmap_level_clamp": 0.0, "border_color": [0.0, 0.0, 0.0, 0.0]}  # fmt: skip


def linear_texture(handle: int, address: int, size: int, **desc) -> dict:
    """A texture object over ``size`` bytes of linear memory (floats) at ``address``."""
    return {"kind": "texture", "handle": handle, "texture": texture_desc(**desc), "view": None,
            "resource": {"type": "linear", "address": address, "format": FLOAT, "channels": 1, "size": size}}


def array_texture(handle: int, array: int, **desc) -> dict:
    """A texture object over the CUDA array ``array`` (a handle)."""
    return {"kind": "texture", "handle": handle, "texture": texture_desc(**desc), "view": None,
            "resource": {"type": "array", "array": array}}


def surface_object(handle: int, array: int) -> dict:
    """A surface object over the CUDA array ``array``."""
    return {"kind": "surface", "handle": handle, "resource": {"type": "array", "array": array}}


def array_shape(width: int, height: int = 0, *, flags: int = 0) -> dict:
    """A float CUDA array's shape as launch.json and snapshots give it."""
    return {"width": width, "height": height, "depth": 0, "format": FLOAT, "channels": 1, "flags": flags}
