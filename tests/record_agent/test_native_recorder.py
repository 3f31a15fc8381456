"""The native recorder builds without a driver, exports what the injection needs,
and is harmless inside a process that does not use CUDA (its dlsym forwards);
mneme/annotate.h compiles and is a no-op without the recorder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADERS = Path("/usr/local/cuda/include")


@pytest.fixture(scope="session")  # also built for test_fake_driver.py
def recorder(tmp_path_factory) -> Path:
    if not shutil.which("cmake") or not (HEADERS / "cupti.h").exists():
        pytest.skip("needs cmake and the CUDA toolkit headers (cuda.h, cupti.h)")
    build = tmp_path_factory.mktemp("rec")
    (build / "src").mkdir()
    (build / "src" / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.18)\nproject(r CXX)\nadd_subdirectory({ROOT / 'native' / 'common'} common)\n"
        f"add_subdirectory({ROOT / 'native' / 'recorder'} recorder)\n"
    )
    subprocess.run(["cmake", "-S", build / "src", "-B", build / "b", "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", build / "b", "-j4"], check=True, capture_output=True)
    return build / "b" / "recorder" / "libmneme_recorder.so"


def test_exports_and_no_link_time_cuda(recorder):
    symbols = subprocess.run(["nm", "-D", "--defined-only", recorder], capture_output=True, text=True, check=True).stdout
    for name in ("InitializeInjection", "dlsym", "cuGetProcAddress_v2", "cuMemAlloc_v2", "cuMemFree_v2",
                 "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocPitch_v2", "cuGraphLaunch", "cuGraphLaunch_ptsz",
                 "mneme_annotate_v1"):
        assert f" T {name}\n" in symbols, name
    needed = subprocess.run(["readelf", "-d", recorder], capture_output=True, text=True, check=True).stdout
    assert "libcuda" not in needed and "libcupti" not in needed and "libstdc++" not in needed


def test_preloaded_into_a_non_cuda_program_changes_nothing(recorder, tmp_path):
    # Python resolves its extension modules' symbols through dlsym: all of it goes through ours.
    code = "import ctypes, ctypes.util, json, hashlib; m = ctypes.CDLL(ctypes.util.find_library('m')); m.cos.restype = ctypes.c_double; m.cos.argtypes = [ctypes.c_double]; print(m.cos(0.0), hashlib.sha256(b'x').hexdigest()[:8])"
    env = dict(os.environ, LD_PRELOAD=str(recorder), MNEME_SPOOL_DIR=str(tmp_path / "spool"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1.0 2d711642"


def test_annotate_header_is_a_noop_without_the_recorder(recorder, tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    src = tmp_path / "annotate.cpp"
    src.write_text(
        "#include <mneme/annotate.h>\n#include <cstdio>\n"
        "int main() { float x[4];\n"
        "  int r = mneme::annotate(x, mneme::Metadata{\"f32\", \"relative\", 1e-6, \"none\"});\n"
        "  std::printf(\"%d\\n\", r); return 0; }\n"
    )
    exe = tmp_path / "annotate"
    subprocess.run([cxx, "-std=c++17", f"-I{ROOT / 'native' / 'include'}", src, "-o", exe, "-ldl"], check=True)
    assert subprocess.run([exe], capture_output=True, text=True).stdout.strip() == "0"  # no recorder: no-op
    env = dict(os.environ, LD_PRELOAD=str(recorder), MNEME_SPOOL_DIR=str(tmp_path / "spool"))
    # Under the recorder: a host pointer is in no tracked allocation, and says so.
    assert subprocess.run([exe], capture_output=True, text=True, env=env).stdout.strip() == "1"


NAME_FILTER_CHECK = r"""
#include <cstdio>
#include <regex>
#include <string>
#include "mneme/common/text.hpp"
#include "name_filter.hpp"
using namespace mneme::common;
using namespace mneme::rec;
int main() {
  const char* names[] = {
    "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE8_clEvEUlN3c107complexINS8_4HalfEEEE_St5arrayIPcLm2EEEEviT0_T1_",
    "_ZN2at6native43_GLOBAL__N__softmax_cuda_cu_1234cunn_SoftMaxForwardILi4EfffNS1_22SoftMaxForwardEpilogueEEEvPT2_PKT0_i",
    "_Z6vecaddPKfS0_Pfi", "add_kernel", "no_such_kernel", "_Z14no_such_kernelv", "_Z4relaxjPf", "_Z3fooIjEvT_",
  };
  const char* regexes[] = {"^no_such_kernel$", "softmax", "SoftMax", "add_kernel", "^add", "kernel$", "vecadd",
                           "int", "unsigned", "void", "direct_copy", "^_Z4relax", "relax", "Half", "at::native", "foo<"};
  int bad = 0;
  for (const char* r : regexes) {
    NameFilter f({r});
    std::regex re(r, std::regex::ECMAScript);
    for (const char* n : names) {
      bool full = std::regex_search(std::string(n), re) || std::regex_search(demangle(n), re);
      if (f.matches(n) != full) { std::printf("MISMATCH %s %s full=%d\n", r, n, full); ++bad; }
    }
  }
  std::printf("checked, %d mismatches\n", bad);
  return bad != 0;
}
"""


def test_the_name_filter_agrees_with_regexes_on_mangled_and_demangled_names(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    src, common = ROOT / "native" / "recorder" / "src", ROOT / "native" / "common"
    (tmp_path / "check.cpp").write_text(NAME_FILTER_CHECK)
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{src}", f"-I{common / 'include'}", tmp_path / "check.cpp",
                    src / "name_filter.cpp", common / "src" / "text.cpp", "-o", tmp_path / "check"], check=True)
    out = subprocess.run([tmp_path / "check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "0 mismatches" in out.stdout, out.stdout
