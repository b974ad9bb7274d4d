// CPU kernel of the dropout op (schema: dropout.cpp): out[i] = keep(i) ? x[i] / (1 - p) : 0, with keep(i) drawn in parallel.
//
// Why fgplugin has its own: PyTorch draws dropout's mask on CPU with bernoulli_, which uses MKL's
// parallel generator only on Intel CPUs and otherwise (AMD) one serial mt19937 stream, and then
// applies it in two more passes. On the 2-core AMD EPYC machine F.dropout took 9.5 ms for an
// 11758 x 64 input on 2 threads (its bernoulli_ was 10.2 of a 17.8 ms GCN training step on
// tolokers: benchmarks/results/cpu/step_profile.json); this kernel takes 0.71 ms
// (benchmarks/results/cpu/dropout.json).
//
// The draw: element i of chunk c = i / CHUNK is kept iff the (i mod CHUNK)-th 32-bit output of the
// Philox4x32-10 stream (key = seed, subsequence = c) is below (1 - p) * 2^32; this is the stream
// of ATen's at::Philox4_32(seed, c, 0), computed here 8 blocks at a time so that the compiler
// vectorizes the rounds. keep(i) depends only on (seed, p, i), not on the thread count or on how
// at::parallel_for splits the chunks, so a run is reproducible under torch.manual_seed (the caller
// draws the seed from torch's generator), and the backward pass is the same op on the gradient
// with the same seed: no mask is stored.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../common.h"
#include "ops_cpu.h"
#include "x86_multiversion.h"

namespace fgplugin {
namespace {

constexpr int64_t CHUNK = 4096;         // elements per Philox subsequence (1024 blocks of 4 words)
constexpr int64_t CHUNKS_PER_TASK = 8;  // parallel_for grain: 32K elements
constexpr int LANES = 8;                // Philox blocks computed side by side

// Philox4x32-10 constants (Salmon et al., SC'11), as in ATen's PhiloxRNGEngine.h.
constexpr uint32_t MUL_A = 0xD2511F53, MUL_B = 0xCD9E8D57;
constexpr uint32_t KEY_A = 0x9E3779B9, KEY_B = 0xBB67AE85;

// words[4 * b + w] = word w of Philox block (counter = b, subsequence) for the first
// `blocks` blocks of the chunk's stream (a multiple of LANES, at most CHUNK / 4).
template <bool kWholeChunk>
FGPLUGIN_ALWAYS_INLINE void philox_blocks(uint64_t seed, uint64_t subsequence, uint32_t blocks, uint32_t* words) {
  // A whole chunk's loop has a constant trip count, which GCC vectorizes across blocks (2x faster
  // than with the runtime bound; measured on the 2-core EPYC, 11758 x 64: 1.24 vs 2.50 ms, 1 thread).
  if constexpr (kWholeChunk) blocks = CHUNK / 4;
  const uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t sub0 = static_cast<uint32_t>(subsequence), sub1 = static_cast<uint32_t>(subsequence >> 32);
  for (uint32_t block = 0; block < blocks; block += LANES) {
    uint32_t x0[LANES], x1[LANES], x2[LANES], x3[LANES];
    for (int l = 0; l < LANES; ++l) {
      x0[l] = block + l;
      x1[l] = 0;
      x2[l] = sub0;
      x3[l] = sub1;
    }
    uint32_t k0 = key0, k1 = key1;
    for (int round = 0; round < 10; ++round) {
      for (int l = 0; l < LANES; ++l) {
        const uint64_t p0 = static_cast<uint64_t>(MUL_A) * x0[l];
        const uint64_t p1 = static_cast<uint64_t>(MUL_B) * x2[l];
        const uint32_t y0 = static_cast<uint32_t>(p1 >> 32) ^ x1[l] ^ k0;
        const uint32_t y2 = static_cast<uint32_t>(p0 >> 32) ^ x3[l] ^ k1;
        x0[l] = y0;
        x1[l] = static_cast<uint32_t>(p1);
        x2[l] = y2;
        x3[l] = static_cast<uint32_t>(p0);
      }
      k0 += KEY_A;
      k1 += KEY_B;
    }
    for (int l = 0; l < LANES; ++l) {
      uint32_t* out = words + 4 * (block + l);
      out[0] = x0[l];
      out[1] = x1[l];
      out[2] = x2[l];
      out[3] = x3[l];
    }
  }
}

FGPLUGIN_ALWAYS_INLINE void philox_chunk_impl(uint64_t seed, uint64_t subsequence, uint32_t blocks, uint32_t* words) {
  if (blocks == CHUNK / 4) {
    philox_blocks<true>(seed, subsequence, blocks, words);
  } else {
    philox_blocks<false>(seed, subsequence, blocks, words);
  }
}

void philox_chunk_base(uint64_t seed, uint64_t subsequence, uint32_t blocks, uint32_t* words) {
  philox_chunk_impl(seed, subsequence, blocks, words);
}

#if FGPLUGIN_X86_MULTIVERSION
FGPLUGIN_TARGET_AVX2 void philox_chunk_avx2(uint64_t seed, uint64_t subsequence, uint32_t blocks, uint32_t* words) {
  philox_chunk_impl(seed, subsequence, blocks, words);
}
#endif

using PhiloxChunkFn = void (*)(uint64_t, uint64_t, uint32_t, uint32_t*);

PhiloxChunkFn philox_chunk() {
#if FGPLUGIN_X86_MULTIVERSION
  if (cpu_has_avx2()) return &philox_chunk_avx2;
#endif
  return &philox_chunk_base;
}

// dst[j] = src[j] * (words[j] <= keep_last ? scale : 0). A dropped element is multiplied by 0, not
// replaced by it, so NaN and inf propagate as in torch. Arguments by value and restrict-qualified:
// captured by reference, scale could alias dst and the loop would not vectorize.
template <typename scalar_t>
void apply_chunk(const scalar_t* __restrict__ src, scalar_t* __restrict__ dst, const uint32_t* __restrict__ words,
                 int64_t len, uint32_t keep_last, at::opmath_type<scalar_t> scale) {
  using opmath_t = at::opmath_type<scalar_t>;
  for (int64_t j = 0; j < len; ++j) {
    const opmath_t factor = words[j] <= keep_last ? scale : opmath_t(0);
    dst[j] = static_cast<scalar_t>(static_cast<opmath_t>(src[j]) * factor);
  }
}

}  // namespace

at::Tensor dropout_cpu(const at::Tensor& x, double p, int64_t seed) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "fgplugin.dropout: the dropout probability p must be in [0, 1]");
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "fgplugin.dropout: x must be a floating-point tensor, got ",
              x.scalar_type());
  const at::Tensor input = x.contiguous();
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  const int64_t n = input.numel();
  if (n == 0) return out;
  // keep iff word < keep_below, a probability of keep_below / 2^32 = 1 - p up to 2^-33 (0 at p = 1).
  // Compared as word <= keep_last in 32 bits, which vectorizes; keep_below = 0 zeroes the scale.
  const uint64_t keep_below = static_cast<uint64_t>(std::llround((1.0 - p) * 4294967296.0));
  const uint32_t keep_last = keep_below > 0 ? static_cast<uint32_t>(keep_below - 1) : 0;
  const PhiloxChunkFn fill = philox_chunk();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "fgplugin_dropout_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const opmath_t scale = keep_below > 0 ? static_cast<opmath_t>(1.0 / (1.0 - p)) : opmath_t(0);
    const scalar_t* src = input.const_data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
    at::parallel_for(0, chunks, CHUNKS_PER_TASK, [&](int64_t first, int64_t last) {
      alignas(64) uint32_t words[CHUNK];
      for (int64_t c = first; c < last; ++c) {
        const int64_t begin = c * CHUNK, len = std::min(n, begin + CHUNK) - begin;
        // Only the blocks this chunk uses: a small tensor does not pay for a whole chunk's stream.
        const int64_t blocks = (len + 4 * LANES - 1) / (4 * LANES) * LANES;
        fill(static_cast<uint64_t>(seed), static_cast<uint64_t>(c), static_cast<uint32_t>(blocks), words);
        apply_chunk<scalar_t>(src + begin, dst + begin, words, len, keep_last, scale);
      }
    });
  });
  return out;
}

}  // namespace fgplugin
