// The decoding matrix-vector product with int8 activations (packed_matvec_q8, see packed.hpp):
// the input, prepared as for packed_matvec (gathered, divided by in_scale, zero-padded), is
// quantized to int8 per block of 32 columns (d[b] = max |x| / 127, xq = round(x / d[b])), as
// llama.cpp quantizes activations for its integer dot products. Each block of a row is then one
// integer dot product of its codes with xq (32 products summed in int32), scaled by d[b] in fp32:
//
//   y[r] = sum_g s[g] * (sum_{b in g} d[b] * sum_{c in b} q[c] xq[c] - z[g] * xs[g]),
//   xs[g] = sum_{b in g} d[b] * sum_{c in b} xq[c]   (the quantized input's group sum).
//
// 4-bit codes (0..15) are unsigned bytes: AVX2's maddubs (u8 x s8 pairs summed in int16) cannot
// overflow (2 x 15 x 127). 8-bit storage holds codes up to 255, whose pairs would: the codes are
// shifted to signed (q - 128, the zero with them) and multiplied as |q - 128| x (xq with the sign
// of q - 128), at most 2 x 128 x 127 = 32512 per pair. With AVX-512 VNNI the pairs and the
// int16 step become one dpbusd (u8 x s8 sums of four into int32).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/quant/packed.hpp"

namespace tessera::quant {
namespace {

// The input of one product: xq (colsp) int8 codes in column order, d (colsp / 32) block scales,
// xs (ngroups, zero-padded to a multiple of 8) group sums of the quantized input; for the 4-bit
// SIMD path also xpair, xq in pair order (see pair_order), and dd, d as 8 lanes per pair of
// blocks (d[b] x 4, d[b + 1] x 4).
struct Q8Input {
  std::vector<std::int8_t> xq, xpair;
  std::vector<float> d, xs, dd;
};

// Whether the 4-bit SIMD path reads two blocks at a time: the blocks 2k, 2k + 1 of a row are 32
// contiguous bytes whose low nibbles are the first 16 columns of each block and the high nibbles
// the last 16. Pair order puts the input the same way: per pair, block 2k's columns 0..15, block
// 2k + 1's 0..15, block 2k's 16..31, block 2k + 1's 16..31 (a last unpaired block stays in column
// order). It needs every pair inside one group, or one group per block (groups of 32).
bool pair_order(const PackedLinear& w) {
  const int bpg = w.group / 32;
  return w.storage_bits == 4 && (bpg % 2 == 0 || bpg == 1 || w.ngroups == 1);
}

// Rounds to the nearest integer, ties to even (the default rounding mode), in one instruction.
inline int round_even(float v) {
  return _mm_cvtss_si32(_mm_set_ss(v));
}

// One block of 32 prepared inputs: its max |x|, and its codes xq = clamp(round(xp * inv), -127,
// 127) (returning their sum). Scalar here; the AVX2 pair below computes the same values bit for
// bit (the same fp32 products, rounded to nearest even, clamped).
struct BlockQuantizer {
  float (*absmax)(const float* xp);
  int (*codes)(const float* xp, float inv, std::int8_t* xq);
};

float absmax_scalar(const float* xp) {
  float m = 0.0f;
  for (int i = 0; i < 32; ++i) m = std::max(m, std::fabs(xp[i]));
  return m;
}

int codes_scalar(const float* xp, float inv, std::int8_t* xq) {
  int sum = 0;
  for (int i = 0; i < 32; ++i) {  // |xp * inv| <= 127 up to rounding: the clamp is a guard
    const int q = std::clamp(round_even(xp[i] * inv), -127, 127);
    xq[i] = static_cast<std::int8_t>(q);
    sum += q;
  }
  return sum;
}

constexpr BlockQuantizer k_scalar_quantizer{absmax_scalar, codes_scalar};

Q8Input quantize_input(const PackedLinear& w, const float* x, bool pairs, ActScale scale,
                       const BlockQuantizer& bq) {
  const int cp = w.colsp, nb = cp / 32;
  Q8Input in{std::vector<std::int8_t>(cp),
             {},
             std::vector<float>(nb),
             std::vector<float>((static_cast<std::size_t>(w.ngroups) + 7) / 8 * 8),
             {}};
  std::vector<float> xp(cp, 0.0f);
  for (int j = 0; j < w.cols; ++j) {
    const float v = x[w.perm.empty() ? j : w.perm[j]];
    xp[j] = w.in_scale.empty() ? v : v / w.in_scale[j];
  }
  // max |x| of each block of 32 columns, or of the whole row repeated per block (PerRow)
  for (int b = 0; b < nb; ++b) in.d[b] = bq.absmax(xp.data() + b * 32);
  if (scale == ActScale::PerRow)
    std::fill(in.d.begin(), in.d.end(), *std::max_element(in.d.begin(), in.d.end()));
  for (int b = 0; b < nb; ++b) {
    // x^ = round(x / d) d with d = max / 127 (the simulated activation quantizer's formula)
    const float amax = in.d[b], d = amax / 127.0f, inv = amax > 0.0f ? 1.0f / d : 0.0f;
    const int sum = bq.codes(xp.data() + b * 32, inv, in.xq.data() + b * 32);
    in.d[b] = d;
    in.xs[b * 32 / w.group] += d * static_cast<float>(sum);
  }
  if (!pairs) return in;
  in.xpair = in.xq;
  in.dd.assign(static_cast<std::size_t>(nb / 2) * 8, 0.0f);
  for (int b = 0; b + 1 < nb; b += 2) {
    const std::int8_t* src = in.xq.data() + b * 32;
    std::int8_t* dst = in.xpair.data() + b * 32;
    std::memcpy(dst, src, 16);            // block b, columns 0..15
    std::memcpy(dst + 16, src + 32, 16);  // block b + 1, columns 0..15
    std::memcpy(dst + 32, src + 16, 16);  // block b, columns 16..31
    std::memcpy(dst + 48, src + 48, 16);  // block b + 1, columns 16..31
    for (int i = 0; i < 8; ++i) in.dd[b * 4 + i] = in.d[b + i / 4];
  }
  return in;
}

inline float bf16_bits_to_float(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
#include "tessera/quant/packed_unpack3.inc"
struct D {  // maddubs: u8 x s8 pairs in int16 (no overflow for the operands above), then int32
  static __m256i dot(__m256i acc, __m256i u, __m256i s) {
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    return _mm256_add_epi32(acc, p);
  }
  static __m256i dot2(__m256i u1, __m256i s1, __m256i u2, __m256i s2) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u1, s1), _mm256_maddubs_epi16(u2, s2));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
};
#include "tessera/quant/packed_q8_simd.inc"

float absmax(const float* xp) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < 32; i += 8)  // |x| first: max returns its second operand m for a NaN
    m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xp + i)), m);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

int codes(const float* xp, float inv, std::int8_t* xq) {
  const __m256 s = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i q[4], sum = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xp + 8 * k), s));
    q[k] = _mm256_min_epi32(_mm256_max_epi32(q[k], lo), hi);
    sum = _mm256_add_epi32(sum, q[k]);
  }
  // packs interleave the 128-bit lanes: 4-byte groups come out as 0 4 1 5 2 6 3 7 of 0..7
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
  return _mm_cvtsi128_si32(h);
}
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const BlockQuantizer& quantizer(Isa isa) {
  static constexpr BlockQuantizer simd{avx2::absmax, avx2::codes};
  return isa == Isa::Portable ? k_scalar_quantizer : simd;
}

#if defined(__clang__)
#pragma clang attribute push(                                                      \
    __attribute__((target("avx512vnni,avx512vl,avx512f,avx512bw,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512vnni,avx512vl,avx512f,avx512bw,avx2,fma,f16c")
#endif
namespace vnni {
#include "tessera/quant/packed_unpack3.inc"
struct D {  // dpbusd: u8 x s8 sums of four straight into int32
  static __m256i dot(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
  static __m256i dot2(__m256i u1, __m256i s1, __m256i u2, __m256i s2) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u1, s1), u2, s2);
  }
};
#include "tessera/quant/packed_q8_simd.inc"
}  // namespace vnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

void portable_rows(const PackedLinear& w, const Q8Input& in, int r0, int r1, float* y,
                   const float* bias, float* s) {
  const int sb = w.storage_bits, shift = sb == 8 ? 128 : 0;
  for (int r = r0; r < r1; ++r) {
    const std::uint8_t* row = w.codes.data() + static_cast<std::size_t>(r) * w.row_bytes();
    float total = 0.0f, zterm = 0.0f;
    for (int g = 0; g < w.ngroups; ++g) {
      const std::size_t i = static_cast<std::size_t>(r) * w.ngroups + g;
      s[g] = decode_scale(w.scales[i], w.scale_type);
      const int z = (w.sym ? w.zero_code() : w.zeros[i]) - shift;
      zterm += s[g] * static_cast<float>(z) * in.xs[g];
      float acc = 0.0f;
      for (int b = g * w.group / 32; b < std::min((g + 1) * w.group, w.colsp) / 32; ++b) {
        std::int32_t dot = 0;
        for (int c = b * 32; c < b * 32 + 32; ++c) {
          const int q = packed_code(row, sb, c) - shift;
          dot += q * in.xq[c];
        }
        acc += in.d[b] * static_cast<float>(dot);
      }
      total += s[g] * acc;
    }
    const float v = total - zterm;
    y[r] = bias ? v + bias[r] : v;
  }
}

bool cpu_has_vnni() {
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}

}  // namespace

const char* q8_dot_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return cpu_has_vnni() ? "avx512-vnni dpbusd" : "avx2 maddubs";
    case Isa::Avx2:
      return "avx2 maddubs";
    case Isa::Portable:
      break;
  }
  return "portable";
}

void packed_matvec_q8(const PackedLinear& w, float* y, const float* x, const float* bias, Isa isa,
                      ActScale scale) {
  if (!isa_supported(isa))
    throw Error(fmt::format("this CPU cannot run the {} kernels", isa_name(isa)),
                "use quant::best_isa() (or set ONEDNN_MAX_CPU_ISA=AVX2)");
  const Q8Input in =
      quantize_input(w, x, isa != Isa::Portable && pair_order(w), scale, quantizer(isa));
  const bool vnni = isa == Isa::Avx512 && cpu_has_vnni();
  constexpr int kChunk = 16;  // rows per scheduling unit
  const int nchunks = (w.rows + kChunk - 1) / kChunk;
#pragma omp parallel
  {
    std::vector<float> s(4 * static_cast<std::size_t>(w.ngroups) + 8);  // four rows' scales
#pragma omp for schedule(static)
    for (int t = 0; t < nchunks; ++t) {
      const int r0 = t * kChunk, r1 = std::min(w.rows, r0 + kChunk);
      if (vnni)
        vnni::rows(w, in, r0, r1, y, bias, s.data());
      else if (isa != Isa::Portable)
        avx2::rows(w, in, r0, r1, y, bias, s.data());
      else
        portable_rows(w, in, r0, r1, y, bias, s.data());
    }
  }
}

void quantize_q8_input(const PackedLinear& w, const float* x, std::int8_t* xq, float* d,
                       ActScale scale, Isa isa) {
  const Q8Input in = quantize_input(w, x, false, scale, quantizer(isa));
  std::copy(in.xq.begin(), in.xq.end(), xq);
  std::copy(in.d.begin(), in.d.end(), d);
}

}  // namespace tessera::quant
