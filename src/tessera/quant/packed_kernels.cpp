// The packed kernels (see packed.hpp): the input is prepared once per call (gathered through
// perm, divided by in_scale, zero-padded to colsp, plus its sum per group), then every output row
// is sum_g scale[g] * (sum_{c in g} q[c] * x[c] - zero[g] * sum_{c in g} x[c]).
// The codes are read a tile of 8 rows at a time, unpacked to one byte per column (the
// interleaved tile layout is made for the int8 kernels' broadcasts, not for row-wise fp32 dots).
// The SIMD bodies (packed_simd.inc) are compiled once per ISA in a target region (GCC's
// target pragma, clang's target attribute on every function of the region); the portable
// path is plain C++. The ISA is an argument, so tests run every path on one machine.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/quant/packed.hpp"

namespace tessera::quant {
namespace {

#if defined(__clang__)
#pragma clang attribute push(                                                    \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12's AVX-512 intrinsics start from a self-initialized "undefined" vector, which it then
// reports as used uninitialized once they are inlined here (fixed in GCC 13); nothing is.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace avx512 {
#include "tessera/quant/packed_tile.inc"
struct V {
  using T = __m512;
  static constexpr int W = 16, K = 2;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T a) { _mm512_storeu_ps(p, a); }
  static T set1(float f) { return _mm512_set1_ps(f); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static float hsum(T a) {  // halves by lane shuffles (no undefined upper lanes)
    a = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, 0x4E));
    a = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, 0xB1));
    __m128 s = _mm512_castps512_ps128(a);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static T cvt(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
  static void decode(const std::uint8_t* p, T* q) {
    q[0] = cvt(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    q[1] = cvt(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  }
};
#include "tessera/quant/packed_simd.inc"
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
#include "tessera/quant/packed_tile.inc"
struct V {
  using T = __m256;
  static constexpr int W = 8, K = 4;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T a) { _mm256_storeu_ps(p, a); }
  static T set1(float f) { return _mm256_set1_ps(f); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static float hsum(T a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static T cvt(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
  static void split(__m128i b, T* q) {  // 16 bytes -> 2 vectors of 8
    q[0] = cvt(b);
    q[1] = cvt(_mm_srli_si128(b, 8));
  }
  static void decode(const std::uint8_t* p, T* q) {
    split(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), q);
    split(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)), q + 2);
  }
};
#include "tessera/quant/packed_simd.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace portable {
void unpack_tile(const PackedLinear& w, int t, std::uint8_t* out) {
  for (int i = 0; i < k_tile_rows; ++i)
    for (int j = 0; j < w.colsp; ++j)
      out[static_cast<std::size_t>(i) * w.colsp + j] =
          static_cast<std::uint8_t>(w.code(t * k_tile_rows + i, j));
}
float row_dot(const std::uint8_t* row, const float* xp, const float* s, int colsp, int group) {
  float total = 0.0f;
  for (int c0 = 0, g = 0; c0 < colsp; c0 += group, ++g) {
    float acc = 0.0f;
    for (int c = c0; c < std::min(c0 + group, colsp); ++c)
      acc += static_cast<float>(row[c]) * xp[c];
    total += s[g] * acc;
  }
  return total;
}
float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}
}  // namespace portable

// o (colsp) = x (IC) gathered through perm, divided by in_scale, zero-padded; xsum (ngroups) =
// the sum of o over each group.
void prepare_row(const PackedLinear& w, const float* x, float* o, float* xsum) {
  const int cp = w.colsp;
  for (int j = 0; j < cp; ++j) {
    float v = j < w.cols ? x[w.perm.empty() ? j : w.perm[j]] : 0.0f;
    o[j] = w.in_scale.empty() ? v : v / w.in_scale[j];
  }
  for (int g = 0; g < w.ngroups; ++g) {
    float s = 0.0f;
    for (int j = g * w.group; j < std::min((g + 1) * w.group, cp); ++j) s += o[j];
    xsum[g] = s;
  }
}

// prepare_row for each of the N rows of X (N, IC) into xp (N, colsp), xsum (N, ngroups).
void prepare(const PackedLinear& w, const float* X, std::int64_t N, float* xp, float* xsum) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n)
    prepare_row(w, X + n * w.cols, xp + n * w.colsp, xsum + n * w.ngroups);
}

// out (8 rows x colsp) = the code bytes of tile t.
void unpack_tile(const PackedLinear& w, int t, std::uint8_t* out, Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return avx512::unpack_tile(w, t, out);
    case Isa::Avx2:
      return avx2::unpack_tile(w, t, out);
    case Isa::Portable:
      break;
  }
  portable::unpack_tile(w, t, out);
}

// s (ngroups) = row r's decoded scales; returns sum_g s[g] * zero[g] * xsum[g].
float row_scales(const PackedLinear& w, int r, const float* xsum, float* s) {
  float zterm = 0.0f;
  for (int g = 0; g < w.ngroups; ++g) {
    s[g] = w.scale(r, g);
    zterm += s[g] * w.zero(r, g) * xsum[g];
  }
  return zterm;
}

// The dot of one row of code bytes with xp, scaled per group by s.
float row_dot(const PackedLinear& w, const std::uint8_t* row, const float* xp, const float* s,
              Isa isa) {
  const int nb = w.colsp / 32, bpg = w.group / 32;
  if (w.group % 32 != 0) isa = Isa::Portable;  // groups of 16: the plain loop's
  switch (isa) {
    case Isa::Avx512:
      return avx512::row_dot(row, xp, s, nb, bpg);
    case Isa::Avx2:
      return avx2::row_dot(row, xp, s, nb, bpg);
    case Isa::Portable:
      break;
  }
  return portable::row_dot(row, xp, s, w.colsp, w.group);
}

// wt (colsp) = row r (its code bytes: row) decoded in packed order: scale * q - scale * zero
// (in_scale is in the input); s, sz (ngroups) scratch.
void decode_row(const PackedLinear& w, int r, const std::uint8_t* row, float* wt, float* s,
                float* sz, Isa isa) {
  for (int g = 0; g < w.ngroups; ++g) {
    s[g] = w.scale(r, g);
    sz[g] = s[g] * w.zero(r, g);
  }
  const int nb = w.colsp / 32, bpg = w.group / 32;
  if (w.group % 32 != 0) isa = Isa::Portable;  // groups of 16: the plain loop's
  switch (isa) {
    case Isa::Avx512:
      return avx512::decode_row(row, s, sz, nb, bpg, wt);
    case Isa::Avx2:
      return avx2::decode_row(row, s, sz, nb, bpg, wt);
    case Isa::Portable:
      break;
  }
  for (int j = 0; j < w.colsp; ++j)
    wt[j] = s[j / w.group] * static_cast<float>(row[j]) - sz[j / w.group];
}

// Y[n, i] (ldy apart) = dot(xp[n], wt[i]) for n < N, i < R; xp (N, n32), wt (R, n32). The SIMD
// paths hand the decoded tile to oneDNN's sgemm (one thread inside the caller's parallel region;
// its own ISA choice, which ONEDNN_MAX_CPU_ISA caps as it caps best_isa()).
void tile_product(float* Y, std::int64_t ldy, const float* xp, std::int64_t N, const float* wt,
                  int R, int n32, Isa isa) {
  if (isa != Isa::Portable) {
    kernels::gemm(kernels::GemmLibrary::OneDnn, false, true, N, R, n32, 1.0f, xp, n32, wt, n32,
                  0.0f, Y, ldy);
    return;
  }
  for (std::int64_t n = 0; n < N; ++n)
    for (int i = 0; i < R; ++i)
      Y[n * ldy + i] = portable::dot(xp + n * n32, wt + std::int64_t(i) * n32, n32);
}

// The rows of tiles t0 <= t < t1 of y = (or += when accumulate) W x + bias, on the calling
// thread, from the prepared input (xp, xsum).
void matvec_tiles(const PackedLinear& w, const float* xp, const float* xsum, float* y,
                  const float* bias, bool accumulate, int t0, int t1, Isa isa) {
  const int cp = w.colsp;
  std::vector<std::uint8_t> q(static_cast<std::size_t>(k_tile_rows) * cp);
  std::vector<float> s(w.ngroups);
  for (int t = t0; t < t1; ++t) {
    unpack_tile(w, t, q.data(), isa);
    for (int i = 0; i < k_tile_rows && t * k_tile_rows + i < w.rows; ++i) {
      const int r = t * k_tile_rows + i;
      const float zterm = row_scales(w, r, xsum, s.data());
      float v = row_dot(w, q.data() + std::size_t(i) * cp, xp, s.data(), isa) - zterm;
      if (bias) v += bias[r];
      y[r] = accumulate ? y[r] + v : v;
    }
  }
}

}  // namespace

void packed_matvec(const PackedLinear& w, float* y, const float* x, const float* bias, Isa isa) {
  require_isa(isa);
  std::vector<float> xp(w.colsp), xsum(w.ngroups);
  prepare_row(w, x, xp.data(), xsum.data());
  const int ntiles = w.tiles();
#pragma omp parallel
  {
    const int n = omp_get_num_threads(), i = omp_get_thread_num();
    matvec_tiles(w, xp.data(), xsum.data(), y, bias, false,
                 static_cast<int>(std::int64_t(ntiles) * i / n),
                 static_cast<int>(std::int64_t(ntiles) * (i + 1) / n), isa);
  }
}

void packed_matvec_tiles(const PackedLinear& w, float* y, const float* x, const float* bias,
                         bool accumulate, int t0, int t1, Isa isa) {
  std::vector<float> xp(w.colsp), xsum(w.ngroups);
  prepare_row(w, x, xp.data(), xsum.data());
  matvec_tiles(w, xp.data(), xsum.data(), y, bias, accumulate, t0, t1, isa);
}

void packed_matmul(const PackedLinear& w, float* Y, const float* X, const float* bias,
                   std::int64_t N, Isa isa) {
  require_isa(isa);
  if (N <= 0) return;
  constexpr int kTile = 64;  // rows decoded at once: 8 tiles of the layout
  const int cp = w.colsp;
  std::vector<float> xp(static_cast<std::size_t>(N) * cp),
      xsum(static_cast<std::size_t>(N) * w.ngroups);
  prepare(w, X, N, xp.data(), xsum.data());
  const int ntiles = (w.rows + kTile - 1) / kTile;
#pragma omp parallel
  {
    std::vector<float> wt(static_cast<std::size_t>(kTile) * cp), s(w.ngroups), sz(w.ngroups);
    std::vector<std::uint8_t> q(static_cast<std::size_t>(k_tile_rows) * cp);
#pragma omp for schedule(static)
    for (int t = 0; t < ntiles; ++t) {
      const int r0 = t * kTile, R = std::min(kTile, w.rows - r0);
      for (int i = 0; i < R; ++i) {
        const int r = r0 + i;
        if (r % k_tile_rows == 0) unpack_tile(w, r / k_tile_rows, q.data(), isa);
        decode_row(w, r, q.data() + std::size_t(r % k_tile_rows) * cp,
                   wt.data() + std::size_t(i) * cp, s.data(), sz.data(), isa);
      }
      tile_product(Y + r0, w.rows, xp.data(), N, wt.data(), R, cp, isa);
      if (bias)
        for (std::int64_t n = 0; n < N; ++n)
          for (int i = 0; i < R; ++i) Y[n * w.rows + r0 + i] += bias[r0 + i];
    }
  }
}

}  // namespace tessera::quant
