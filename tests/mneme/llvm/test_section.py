"""The .mneme_bitcode record format and the ELF reader (no compiler needed)."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest

from mneme.errors import ArtifactError
from mneme.llvm import elf
from mneme.llvm.embedded import embedded_kernels, find_kernel_bitcode, read_records
from mneme.llvm.section import (
    SECTION_NAME,
    BitcodeRecord,
    SectionFormatError,
    decode_records,
    encode_records,
)
from mneme.toolchain.embed import embed_records


def _record(name: str, payload: bytes = b"BC\xc0\xde" + b"x" * 100) -> BitcodeRecord:
    return BitcodeRecord(kernels=(name,), bitcode=payload, source="a.cu", arch="sm_90", producer="clang")


def test_records_round_trip_and_are_aligned():
    records = [_record("_Z1av"), _record("_Z1bv", b"y" * 7)]
    data = encode_records(records)
    assert len(data) % 8 == 0
    back = decode_records(data)
    assert [r.kernels for r in back] == [("_Z1av",), ("_Z1bv",)]
    assert back[1].bitcode == b"y" * 7 and back[0].arch == "sm_90"


def test_linker_padding_between_records_is_skipped():
    one, two = _record("_Z1av").encode(), _record("_Z1bv").encode()
    assert [r.kernels[0] for r in decode_records(one + b"\0" * 24 + two)] == ["_Z1av", "_Z1bv"]


def test_duplicates_are_dropped():
    assert len(decode_records(encode_records([_record("_Z1av"), _record("_Z1av")]))) == 1


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d[:20], "truncated"),
        (lambda d: d[:-16], "past the end"),
        (lambda d: b"GARBAGE!" + d[8:], "no record magic"),
        (lambda d: d[:-9] + bytes([d[-9] ^ 0xFF]) + d[-8:], "corrupt|SHA-256"),
    ],
)
def test_damaged_sections_are_reported(damage, message):
    data = _record("_Z1av", b"z" * 64).encode()
    with pytest.raises(SectionFormatError, match=message):
        decode_records(damage(data))


def test_not_elf_is_an_artifact_error(tmp_path):
    path = tmp_path / "notelf"
    path.write_bytes(b"hello world, not an executable" * 4)
    with pytest.raises(ArtifactError, match="not an ELF"):
        read_records(path)
    with pytest.raises(ArtifactError, match="cannot read"):
        read_records(tmp_path / "missing")


@pytest.fixture
def host_object(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which("objcopy"):
        pytest.skip("needs a host C compiler and objcopy")
    src = tmp_path / "x.c"
    src.write_text("int f(int x) { return x + 1; }\n")
    obj = tmp_path / "x.o"
    subprocess.run([cc, "-c", str(src), "-o", str(obj)], check=True)
    return obj


def test_embed_then_find_in_an_object(host_object):
    assert find_kernel_bitcode(host_object, "_Z1av") is None  # no section: None, not an error
    assert embed_records(str(host_object), [_record("_Z1av", b"first")]) == 1
    assert embed_records(str(host_object), [_record("_Z1bv", b"second")]) == 2  # merged, not replaced
    assert embed_records(str(host_object), [_record("_Z1bv", b"second")]) == 2  # idempotent
    assert embedded_kernels(host_object) == ["_Z1av", "_Z1bv"]
    assert find_kernel_bitcode(host_object, "_Z1bv") == b"second"
    assert find_kernel_bitcode(host_object.read_bytes(), "_Z1av") == b"first"
    assert SECTION_NAME in elf.section_names(host_object)


def test_corrupt_embedded_section_names_the_file(host_object, tmp_path):
    blob = tmp_path / "bad.bin"
    blob.write_bytes(b"MNEMEIR1" + struct.pack("<IIQ", 5, 0, 1000))
    subprocess.run(["objcopy", "--add-section", f"{SECTION_NAME}={blob}", str(host_object)], check=True)
    with pytest.raises(ArtifactError, match=r"x\.o.*damaged.*rebuild"):
        find_kernel_bitcode(host_object, "_Z1av")


def test_lookup_across_nvcc_and_clang_anonymous_namespace_mangling(host_object):
    from mneme.llvm.names import canonical_name, file_hint

    nvcc = "_ZN33_GLOBAL__N__ba903b16_5_cg_cu_main8spmv_csrEiPKiS1_PKdS3_Pd"
    clang = "_ZN12_GLOBAL__N_18spmv_csrEiPKiS1_PKdS3_Pd"
    assert canonical_name(nvcc) == clang == canonical_name(clang)
    assert file_hint(nvcc) == "cg_cu"
    records = [
        BitcodeRecord((clang,), b"from other.cu", source="/src/other.cu"),
        BitcodeRecord((clang,), b"from cg.cu", source="/src/cg.cu"),
    ]
    embed_records(str(host_object), records)
    assert find_kernel_bitcode(host_object, nvcc) == b"from cg.cu"  # the file nvcc's name points at
    assert find_kernel_bitcode(host_object, "_ZN33_GLOBAL__N__ba903b16_5_cg_cu_main3dotEv") is None
