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


def write_module(spool: Path, module_id: int = 7, *, with_ptx_source: bool = True, kernels=(KERNEL,), globals_=()) -> None:
    mods = spool / "modules"
    mods.mkdir(parents=True, exist_ok=True)
    cubin = vecadd_code.CUBIN
    (mods / f"{module_id}.cubin").write_bytes(cubin)
    src = vecadd_code.PTX.encode() if with_ptx_source else b""
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
    contents = [(base, "heap", "", before, after) for base, before, after in zip(bases, (a, b, c0), (a, b, c1))]
    contents += [(base, kind, name, before, after) for kind, name, base, before, after in extra_regions]
    for i, (base, kind, name, before, after) in enumerate(contents):
        k = i % stripes
        r = {"kind": kind, "name": name, "base": base, "size": len(before), "pieces": [[k, len(pro[k]), len(before)]]}
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
        "format": "mneme-spool-entry/3", "stripes": stripes, "seq": seq, "pid": 1, "rank": "", "kernel": KERNEL,
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
