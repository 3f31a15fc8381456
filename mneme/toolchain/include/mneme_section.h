/* The .mneme_bitcode ELF section of programs built through `mneme config cxx`
 * or add_mneme(): kernel LLVM bitcode records (see docs/llvm-tier.md).
 *
 * Each record starts on an 8-byte boundary (zero bytes between records are
 * padding) with this fixed header, followed by `header_len` bytes of UTF-8
 * JSON ({"kernels": [...], "encoding": "zlib"|"raw", "sha256": ..., ...}) and
 * `payload_len` bytes of (compressed) LLVM bitcode. All fields little-endian. */
#ifndef MNEME_SECTION_H
#define MNEME_SECTION_H

#include <stdint.h>

#define MNEME_SECTION_NAME ".mneme_bitcode"
#define MNEME_RECORD_MAGIC "MNEMEIR1"
#define MNEME_RECORD_ALIGNMENT 8

struct mneme_record_header {
  char magic[8];        /* MNEME_RECORD_MAGIC, not NUL-terminated */
  uint32_t header_len;  /* bytes of JSON that follow */
  uint32_t reserved;    /* 0 */
  uint64_t payload_len; /* bytes of bitcode after the JSON */
};

#endif /* MNEME_SECTION_H */
