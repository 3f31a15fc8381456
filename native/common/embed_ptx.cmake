# Writes OUT: a C++ header holding the text of the PTX file IN as `kDigestPtx`
# (gpu_digest.cpp loads it with cuModuleLoadData; the driver JIT-compiles it).
file(READ "${IN}" ptx)
file(WRITE "${OUT}" "// Generated from digest_kernel.cu at build time; do not edit.\n#pragma once\nstatic const char kDigestPtx[] = R\"MNEMEPTX(${ptx})MNEMEPTX\";\n")
