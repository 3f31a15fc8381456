// Device-side change detection for snapshots (gpu_digest.cpp loads the PTX of
// this file, embedded at build time). One 128-bit digest per piece of device
// memory: two 64-bit lanes, each the sum (mod 2^64) over the piece's 8-byte
// words of a murmur3-finalized mix of the word and its position. A bijective
// mix per word means a single changed word always changes both lanes; sums
// make the result independent of how threads split the piece. It tells
// *changed* from *unchanged* memory between snapshots of one run; chunk
// names stay SHA-256 (computed by the agent on the bytes it receives).
//
// Grid: x = sub-range of a piece (kSub bytes each), y = piece. Each block
// writes its two partial lanes; the host adds a piece's partials.
#include <cstdint>

namespace {

constexpr unsigned long long kSub = 1ull << 20;

__device__ __forceinline__ unsigned long long fmix64(unsigned long long k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

__device__ __forceinline__ void mix(unsigned long long word, unsigned long long position, unsigned long long& a,
                                    unsigned long long& b) {
  a += fmix64(word ^ (position * 0x9e3779b97f4a7c15ull + 0x243f6a8885a308d3ull));
  b += fmix64((word + 0x452821e638d01377ull) ^ (position * 0xc2b2ae3d27d4eb4full + 0x13198a2e03707344ull)) * 3 + position;
}

}  // namespace

// pieces: [base, size] pairs; out: 2 lanes per (piece, sub-range), gridDim.x sub-ranges per piece.
extern "C" __global__ void mneme_snapshot_digest(const unsigned long long* __restrict__ pieces,
                                                 unsigned long long* __restrict__ out) {
  const unsigned long long base = pieces[2 * blockIdx.y], size = pieces[2 * blockIdx.y + 1];
  const unsigned long long lo = blockIdx.x * kSub, hi = lo + kSub < size ? lo + kSub : size;
  unsigned long long a = 0, b = 0;
  if (lo < hi) {
    const unsigned long long first_word = lo / 8, end_word = hi / 8;  // kSub is a multiple of 8
    if (base % 8 == 0) {
      const unsigned long long* words = reinterpret_cast<const unsigned long long*>(base);
      for (unsigned long long w = first_word + threadIdx.x; w < end_word; w += blockDim.x) mix(__ldg(words + w), w, a, b);
    } else {  // an unaligned global: the same words, assembled byte by byte
      const unsigned char* bytes = reinterpret_cast<const unsigned char*>(base);
      for (unsigned long long w = first_word + threadIdx.x; w < end_word; w += blockDim.x) {
        unsigned long long word = 0;
        for (int i = 7; i >= 0; --i) word = (word << 8) | bytes[w * 8 + i];
        mix(word, w, a, b);
      }
    }
    if (hi == size && size % 8 && threadIdx.x == 0) {  // the tail of the piece: its last bytes, zero-padded
      const unsigned char* bytes = reinterpret_cast<const unsigned char*>(base);
      unsigned long long word = 0;
      for (unsigned long long i = size; i-- > end_word * 8;) word = (word << 8) | bytes[i];
      mix(word ^ (size % 8) << 56, end_word, a, b);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, offset);
    b += __shfl_down_sync(0xffffffffu, b, offset);
  }
  __shared__ unsigned long long sums[2][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sums[0][warp] = a;
    sums[1][warp] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x + 31) / 32; ++w) {
      a += sums[0][w];
      b += sums[1][w];
    }
    const unsigned long long slot = (unsigned long long)blockIdx.y * gridDim.x + blockIdx.x;
    out[2 * slot] = a;
    out[2 * slot + 1] = b;
  }
}
