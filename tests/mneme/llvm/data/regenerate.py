"""Rebuild vecops.records (the .mneme_bitcode records of vecops.cu) with clang.

The CPU tests compile these records without clang, and the GPU tests embed
them into a plain nvcc build on machines without clang. Run after editing
vecops.cu:  PYTHONPATH=. python tests/mneme/llvm/data/regenerate.py
"""

from pathlib import Path

from mneme.llvm.section import BitcodeRecord, encode_records
from mneme.toolchain.device_ir import device_records

HERE = Path(__file__).resolve().parent

records = device_records(str(HERE / "vecops.cu"), "sm_90", [])
records = [BitcodeRecord(r.kernels, r.bitcode, "vecops.cu", r.arch, r.producer) for r in records]
(HERE / "vecops.records").write_bytes(encode_records(records))
print(f"{len(records)} records: {[r.kernels[0] for r in records]}")
