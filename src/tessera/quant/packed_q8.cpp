// The decoding matrix-vector product with int8 activations (packed_matvec_q8, see packed.hpp):
// the input, prepared as for packed_matvec (gathered, divided by in_scale, zero-padded), is
// quantized to int8 per block of 32 columns (d[b] = max |x| / 127, xq = round(x / d[b])), as
// llama.cpp quantizes activations for its integer dot products. Each block of a row is then one
// integer dot product of its codes with xq (32 products summed in int32), scaled by d[b] in fp32:
//
//   y[r] = sum_g s[g] * (sum_{b in g} d[b] * sum_{c in b} q[c] xq[c] - z[g] * xs[g]),
//   xs[g] = sum_{b in g} d[b] * sum_{c in b} xq[c]   (the quantized input's group sum).
//
// The SIMD kernels take a tile of 8 rows at a time (the layout in packed.hpp): each vector of
// codes (4 columns of the 8 rows) is multiplied by those 4 inputs broadcast, so the 8 rows' sums
// build up in the lanes of one register. 3- and 4-bit codes are unsigned bytes: AVX2's maddubs
// (u8 x s8 pairs summed in int16) cannot overflow (2 x 15 x 127), and the int16 pairs of a whole
// block add up before one widening to int32. 5-bit codes too, but their pairs (2 x 31 x 127)
// would overflow int16 summed over a block: each vector's pairs are widened to int32. 8-bit storage
// holds codes up to 255, whose pairs would overflow: the codes are shifted to signed (q - 128, the
// zero with them) and multiplied as |q - 128| x (xq with the sign of q - 128), at most 2 x 128 x
// 127 = 32512 per pair. With AVX-512 VNNI the pairs and the int16 step become one dpbusd (u8 x s8
// sums of four into int32).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/quant/packed.hpp"

namespace tessera::quant {
namespace {

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

// in = x quantized for w's products (nothing allocated once `in` has served one of this width).
void quantize_input(const PackedLinear& w, const float* x, ActScale scale, const BlockQuantizer& bq,
                    Q8Input& in) {
  const int cp = w.colsp, nb = cp / 32;
  in.xq.resize(cp);
  in.d.resize(nb);
  in.xs.assign(w.ngroups, 0.0f);
  // The prepared input: x itself where nothing is to be gathered, divided or padded (the
  // decoder's products, ~120 a step, each quantizing its input on every thread), else a copy.
  const float* xp = x;
  if (!w.perm.empty() || !w.in_scale.empty() || w.cols != cp) {
    in.xp.assign(cp, 0.0f);
    for (int j = 0; j < w.cols; ++j) {
      const float v = x[w.perm.empty() ? j : w.perm[j]];
      in.xp[j] = w.in_scale.empty() ? v : v / w.in_scale[j];
    }
    xp = in.xp.data();
  }
  // max |x| of each block of 32 columns, or of the whole row repeated per block (PerRow)
  for (int b = 0; b < nb; ++b) in.d[b] = bq.absmax(xp + b * 32);
  if (scale == ActScale::PerRow)
    std::fill(in.d.begin(), in.d.end(), *std::max_element(in.d.begin(), in.d.end()));
  for (int b = 0; b < nb; ++b) {
    // x^ = round(x / d) d with d = max / 127 (the simulated activation quantizer's formula)
    const float amax = in.d[b], d = amax / 127.0f, inv = amax > 0.0f ? 1.0f / d : 0.0f;
    const int sum = bq.codes(xp + b * 32, inv, in.xq.data() + b * 32);
    in.d[b] = d;
    if (w.group != 16) {
      in.xs[b * 32 / w.group] += d * static_cast<float>(sum);
      continue;
    }
    int lo = 0;  // groups of 16: each half's sum
    for (int j = 0; j < 16; ++j) lo += in.xq[b * 32 + j];
    in.xs[2 * b] = d * static_cast<float>(lo);
    in.xs[2 * b + 1] = d * static_cast<float>(sum - lo);
  }
}

// Where a product's rows go: y[r] = v + bias[r] (bias may be null), or y[r] += that.
struct Rows {
  float* y;
  const float* bias;
  bool accumulate;
  void put(int r, float v) const {
    const float o = bias ? v + bias[r] : v;
    y[r] = accumulate ? y[r] + o : o;
  }
};

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
#include "tessera/quant/packed_tile.inc"
struct D {  // maddubs: u8 x s8 pairs in int16 (no overflow for the operands above), then int32
  static constexpr bool k_u8_int32 = false;  // any u8 x s8 pair would not fit int16
  static __m256i dot(__m256i acc, __m256i u, __m256i s) {
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    return _mm256_add_epi32(acc, p);
  }
  static __m256i dot16(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
  }
  static __m256i add16(__m256i a, __m256i b) { return _mm256_add_epi16(a, b); }
  static __m256i widen(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
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
#include "tessera/quant/packed_tile.inc"
struct D {                                  // dpbusd: u8 x s8 sums of four straight into int32
  static constexpr bool k_u8_int32 = true;  // any u8 x s8 products: 255 x 128 x 4 per lane and dot
  static __m256i dot(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
  static __m256i dot16(__m256i acc, __m256i u, __m256i s) { return dot(acc, u, s); }
  static __m256i add16(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  static __m256i widen(__m256i acc) { return acc; }
};
#include "tessera/quant/packed_q8_simd.inc"
// GCC 12 warns that the 512-bit intrinsics' own "undefined" pass-through operand may be used
// uninitialized (it is not: the mask is all ones).
#if defined(__clang__)
#include "tessera/quant/packed_q8_zmm.inc"
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "tessera/quant/packed_q8_zmm.inc"
#pragma GCC diagnostic pop
#endif
}  // namespace vnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

void portable_rows(const PackedLinear& w, const Q8Input& in, int r0, int r1, const Rows& out) {
  const int shift = w.storage_bits == 8 ? 128 : 0;
  const int span = std::min(w.group, 32);  // columns of a block in one group
  std::vector<float> acc(w.ngroups);
  for (int r = r0; r < r1; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int c0 = 0; c0 < w.colsp; c0 += span) {
      std::int32_t dot = 0;
      for (int c = c0; c < c0 + span; ++c) dot += (w.code(r, c) - shift) * in.xq[c];
      acc[c0 / w.group] += in.d[c0 / 32] * static_cast<float>(dot);
    }
    float total = 0.0f, zterm = 0.0f;
    for (int g = 0; g < w.ngroups; ++g) {
      const float s = w.scale(r, g);
      zterm += s * (w.zero(r, g) - static_cast<float>(shift)) * in.xs[g];
      total += s * acc[g];
    }
    out.put(r, total - zterm);
  }
}

bool cpu_has_vnni() {
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}

// A prompt's rows k_tokens at a time (SIMD ISAs only; width resolved: W256 or W512).
constexpr int k_tokens = 4;
void tokens_tiles(const PackedLinear& w, const Q8Input* in, int t0, int t1, const Rows* rows,
                  Isa isa, PromptWidth width) {
  with_storage(w.storage_bits, [&]<int SB>() {
    if (isa == Isa::Avx512 && cpu_has_vnni() && width == PromptWidth::W512)
      vnni::tiles_tokens_zmm<SB, k_tokens>(w, in, t0, t1, rows);
    else if (isa == Isa::Avx512 && cpu_has_vnni())
      vnni::tiles_tokens<SB, k_tokens>(w, in, t0, t1, rows);
    else
      avx2::tiles_tokens<SB, k_tokens>(w, in, t0, t1, rows);
  });
}

// A 4-bit symmetric linear of 64 rows x 512 columns (16 KB of codes, scales 1) with pseudo-random
// codes, and k_tokens inputs for it: prompt_width's timing case.
PackedLinear timing_linear() {
  PackedLinear w;
  w.rows = 64, w.cols = w.colsp = 512, w.bits = w.storage_bits = 4, w.group = 128;
  w.ngroups = 4, w.sym = true, w.scale_type = ScaleType::F16;
  w.codes.resize(static_cast<std::size_t>(w.tiles()) * (w.colsp / 32) * w.block_bytes());
  std::uint32_t state = 12345;
  for (auto& c : w.codes)
    c = static_cast<std::uint8_t>((state = state * 1664525u + 1013904223u) >> 24);
  w.scales.assign(static_cast<std::size_t>(w.tiles()) * w.ngroups * k_tile_rows, 0x3C00);
  return w;
}

// The best of `rounds` rounds of `reps` products at each width, rounds taking turns: the 256-bit
// kernel's time over the 512-bit one's.
double time_prompt_widths(int rounds, int reps) {
  const PackedLinear w = timing_linear();
  std::vector<Q8Input> in(k_tokens);
  std::vector<float> x(w.cols), y(std::size_t(k_tokens) * w.rows);
  for (int n = 0; n < k_tokens; ++n) {
    for (int c = 0; c < w.cols; ++c) x[c] = static_cast<float>((c * (n + 3)) % 17) - 8.0f;
    quantize_q8(w, x.data(), ActScale::PerBlock, Isa::Avx512, in[n]);
  }
  Rows rows[k_tokens];
  for (int n = 0; n < k_tokens; ++n) rows[n] = Rows{y.data() + n * w.rows, nullptr, false};
  double best[2] = {1e30, 1e30};
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 2; ++k) {
      const auto width = k == 0 ? PromptWidth::W256 : PromptWidth::W512;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i)
        tokens_tiles(w, in.data(), 0, w.tiles(), rows, Isa::Avx512, width);
      best[k] = std::min(
          best[k], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  return best[0] / best[1];
}

}  // namespace

PromptWidthChoice prompt_width() {
  static const PromptWidthChoice choice = [] {
    PromptWidthChoice c;
    if (!cpu_has_vnni()) return c;
    c.speedup = time_prompt_widths(7, 20);
    if (c.speedup >= 1.05) c.width = PromptWidth::W512;
    return c;
  }();
  return choice;
}

const char* prompt_width_name(PromptWidth width) {
  if (width == PromptWidth::Auto) width = prompt_width().width;
  return width == PromptWidth::W512 ? "512-bit" : "256-bit";
}

std::string describe_prompt_width() {
  const PromptWidthChoice c = prompt_width();
  if (c.speedup == 0) return "256-bit (no VNNI)";
  return c.width == PromptWidth::W512
             ? fmt::format("512-bit ({:.2f}x the 256-bit kernel, timed in cache)", c.speedup)
             : fmt::format("256-bit (the 512-bit kernel {:.2f}x, timed in cache)", c.speedup);
}

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

void quantize_q8(const PackedLinear& w, const float* x, ActScale scale, Isa isa, Q8Input& in) {
  require_isa(isa);
  quantize_input(w, x, scale, quantizer(isa), in);
}

void packed_matvec_q8_tiles(const PackedLinear& w, const Q8Input& in, float* y, const float* bias,
                            bool accumulate, int t0, int t1, Isa isa) {
  const Rows out{y, bias, accumulate};
  if (isa == Isa::Portable)
    return portable_rows(w, in, t0 * k_tile_rows, std::min(w.rows, t1 * k_tile_rows), out);
  with_storage(w.storage_bits, [&]<int SB>() {
    if (isa == Isa::Avx512 && cpu_has_vnni())
      vnni::tiles<SB>(w, in, t0, t1, out);
    else
      avx2::tiles<SB>(w, in, t0, t1, out);
  });
}

void packed_matvec_q8(const PackedLinear& w, float* y, const float* x, const float* bias, Isa isa,
                      ActScale scale) {
  Q8Input in;
  quantize_q8(w, x, scale, isa, in);
  const int ntiles = w.tiles();
#pragma omp parallel
  {  // contiguous runs of tiles, one per thread (the prefetch runs ahead inside a run)
    const int n = omp_get_num_threads(), i = omp_get_thread_num();
    const int t0 = static_cast<int>(std::int64_t(ntiles) * i / n);
    const int t1 = static_cast<int>(std::int64_t(ntiles) * (i + 1) / n);
    packed_matvec_q8_tiles(w, in, y, bias, false, t0, t1, isa);
  }
}

void packed_matmul_q8(const PackedLinear& w, float* Y, const float* X, const float* bias,
                      std::int64_t N, Isa isa, ActScale scale, PromptWidth width) {
  require_isa(isa);
  if (N <= 0) return;
  if (width == PromptWidth::Auto)  // (timed only where the 512-bit kernel could run)
    width = isa == Isa::Avx512 ? prompt_width().width : PromptWidth::W256;
  std::vector<Q8Input> in(static_cast<std::size_t>(N));
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) quantize_q8(w, X + n * w.cols, scale, isa, in[n]);
  // Runs of tiles whose codes fill about half of L1 (at least one tile): every row of X passes
  // over a run while its codes stay in cache, k_tokens rows at a time (each block's codes
  // unpacked once for them); the last N % k_tokens rows one at a time. The runs are as many as
  // that needs, rounded up to a multiple of the threads, and split the tiles evenly, in pairs
  // (the VNNI prompt kernel's unit), so that each thread's consecutive runs hold as many tiles
  // as another's to a pair: with runs of a fixed size the thread with the short last run idled
  // (576 rows of 4-bit codes: 72 tiles in 11 runs of 7, 42 against 30 tiles).
  const std::int64_t tile_bytes = std::int64_t(k_tile_rows) * w.colsp * w.storage_bits / 8;
  const int run = static_cast<int>(std::max<std::int64_t>(1, 16384 / tile_bytes));
  const int ntiles = w.tiles(), npairs = (ntiles + 1) / 2, nt = omp_get_max_threads();
  const int nruns = std::min(npairs, ((ntiles + run - 1) / run + nt - 1) / nt * nt);
  const auto first_tile = [&](int r) {
    return std::min(ntiles, static_cast<int>(2 * (std::int64_t(npairs) * r / nruns)));
  };
  const std::int64_t nq = isa == Isa::Portable ? 0 : N / k_tokens * k_tokens;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < nruns; ++r) {
    const int t0 = first_tile(r), t1 = first_tile(r + 1);
    for (std::int64_t n = 0; n < nq; n += k_tokens) {
      Rows rows[k_tokens];
      for (int k = 0; k < k_tokens; ++k) rows[k] = Rows{Y + (n + k) * w.rows, bias, false};
      tokens_tiles(w, in.data() + n, t0, t1, rows, isa, width);
    }
    for (std::int64_t n = nq; n < N; ++n)
      packed_matvec_q8_tiles(w, in[n], Y + n * w.rows, bias, false, t0, t1, isa);
  }
}

void quantize_q8_input(const PackedLinear& w, const float* x, std::int8_t* xq, float* d,
                       ActScale scale, Isa isa) {
  Q8Input in;
  quantize_q8(w, x, scale, isa, in);
  std::copy(in.xq.begin(), in.xq.end(), xq);
  std::copy(in.d.begin(), in.d.end(), d);
}

}  // namespace tessera::quant
