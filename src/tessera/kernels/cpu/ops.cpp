#include "tessera/kernels/cpu/ops.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessera/kernels/cpu/vec_math.hpp"

namespace tessera::kernels::cpu {

// ---------------------------------------------------------------- embedding
void embedding_forward(float* out, const std::int32_t* inp, const float* wte, const float* wpe,
                       int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<std::int64_t>(b) * T + t) * C;
      const float* e = wte + static_cast<std::int64_t>(inp[b * T + t]) * C;
      if (!wpe) {
        std::copy(e, e + C, o);
        continue;
      }
      const float* p = wpe + static_cast<std::int64_t>(t) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                        int T, int C) {
  // Rows of dwte can repeat (same token twice), so split the channels across threads instead of
  // the positions: every thread walks all positions in order over its own slice of C.
#pragma omp parallel
  {
    int nth = omp_get_num_threads(), tid = omp_get_thread_num();
    int c0 = static_cast<int>(static_cast<std::int64_t>(C) * tid / nth);
    int c1 = static_cast<int>(static_cast<std::int64_t>(C) * (tid + 1) / nth);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const float* d = dout + (static_cast<std::int64_t>(b) * T + t) * C;
        float* e = dwte + static_cast<std::int64_t>(inp[b * T + t]) * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) e[c] += d[c];
        if (!dwpe) continue;
        float* p = dwpe + static_cast<std::int64_t>(t) * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  }
}

// ---------------------------------------------------------------- layernorm
void layernorm_row(float* o, float* mean, float* rstd, const float* x, const float* weight,
                   const float* bias, int C) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int c = 0; c < C; ++c) s += x[c];
  float m = s / C;
  float v = 0.0f;
#pragma omp simd reduction(+ : v)
  for (int c = 0; c < C; ++c) {
    float d = x[c] - m;
    v += d * d;
  }
  float r = 1.0f / std::sqrt(v / C + k_layernorm_eps);
#pragma omp simd
  for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * r * weight[c] + bias[c];
  *mean = m;
  *rstd = r;
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t N, int C) {
#pragma omp parallel for schedule(static) if (N > 1)  // one row (decoding): no thread team
  for (std::int64_t i = 0; i < N; ++i)
    layernorm_row(out + i * C, mean + i, rstd + i, inp + i * C, weight, bias, C);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        std::int64_t N, int C) {
  int nth = omp_get_max_threads();
  // Per-thread partial sums of dweight/dbias, combined in thread order: deterministic.
  std::vector<float> partial(static_cast<std::size_t>(nth) * 2 * C, 0.0f);
#pragma omp parallel num_threads(nth)
  {
    int tid = omp_get_thread_num();
    float* dw = partial.data() + static_cast<std::size_t>(tid) * 2 * C;
    float* db = dw + C;
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* g = dout + i * C;
      float m = mean[i], r = rstd[i];
      float sum_dn = 0.0f, sum_dn_n = 0.0f;
#pragma omp simd reduction(+ : sum_dn, sum_dn_n)
      for (int c = 0; c < C; ++c) {
        float n = (x[c] - m) * r;
        float dn = weight[c] * g[c];
        sum_dn += dn;
        sum_dn_n += dn * n;
      }
      float mean_dn = sum_dn / C, mean_dn_n = sum_dn_n / C;
      float* dx = dinp + i * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        float n = (x[c] - m) * r;
        float dn = weight[c] * g[c];
        db[c] += g[c];
        dw[c] += n * g[c];
        dx[c] += (dn - mean_dn - n * mean_dn_n) * r;
      }
    }
  }
  for (int t = 0; t < nth; ++t) {
    const float* dw = partial.data() + static_cast<std::size_t>(t) * 2 * C;
    for (int c = 0; c < C; ++c) {
      dweight[c] += dw[c];
      dbias[c] += dw[C + c];
    }
  }
}

// ---------------------------------------------------------------- linear
void linear_forward(GemmLibrary lib, float* out, const float* inp, const float* weight,
                    const float* bias, std::int64_t N, int IC, int OC, bool accumulate_out) {
  gemm(lib, false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, accumulate_out ? 1.0f : 0.0f, out,
       OC);
  if (bias) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < N; ++i) {
      float* o = out + i * OC;
#pragma omp simd
      for (int j = 0; j < OC; ++j) o[j] += bias[j];
    }
  }
}

void linear_backward_input(GemmLibrary lib, float* dinp, const float* dout, const float* weight,
                           std::int64_t N, int IC, int OC) {
  gemm(lib, false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
}

void linear_backward(GemmLibrary lib, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, std::int64_t N, int IC, int OC) {
  if (dinp) linear_backward_input(lib, dinp, dout, weight, N, IC, OC);
  // dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC)
  gemm(lib, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias) {
    // Column sums; each thread owns a contiguous block of columns and walks rows in order.
#pragma omp parallel
    {
      int nth = omp_get_num_threads(), tid = omp_get_thread_num();
      int j0 = static_cast<int>(static_cast<std::int64_t>(OC) * tid / nth);
      int j1 = static_cast<int>(static_cast<std::int64_t>(OC) * (tid + 1) / nth);
      for (std::int64_t i = 0; i < N; ++i) {
        const float* g = dout + i * OC;
#pragma omp simd
        for (int j = j0; j < j1; ++j) dbias[j] += g[j];
      }
    }
  }
}

// ---------------------------------------------------------------- gelu
namespace {
constexpr float k_gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)
}

namespace {
inline float gelu(float x) {
  float u = k_gelu_scale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanh_approx(u));
}
}  // namespace

void gelu_forward(float* out, const float* inp, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = gelu(inp[i]);
}

void gelu_slice(float* out, const float* inp, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) out[i] = gelu(inp[i]);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = k_gelu_scale * (x + 0.044715f * x * x * x);
    float th = tanh_approx(u);
    float sech2 = 1.0f - th * th;
    float du = k_gelu_scale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
  }
}

// ---------------------------------------------------------------- attention
namespace {
// The per-(batch, head) GEMMs run inside an OpenMP parallel region, one per thread. oneDNN runs
// them sequentially there; OpenBLAS would start its own thread pool from every thread and
// oversubscribe the cores (measured: attention 3x slower), so these always go through oneDNN.
GemmLibrary per_thread_gemm(GemmLibrary) {
  return GemmLibrary::OneDnn;
}
}  // namespace

namespace {
// Where head h's q, and key-value head g's k and v, start in a qkv row of (NH + 2 KV) hs floats.
struct QkvRow {
  int NH, KV, hs;
  std::int64_t width() const { return static_cast<std::int64_t>(NH + 2 * KV) * hs; }
  std::int64_t q(int h) const { return static_cast<std::int64_t>(h) * hs; }
  std::int64_t k(int g) const { return static_cast<std::int64_t>(NH + g) * hs; }
  std::int64_t v(int g) const { return static_cast<std::int64_t>(NH + KV + g) * hs; }
};

// One head's attention for Tq query rows at positions p .. p + Tq - 1 over the keys and values of
// positions 0 .. p + Tq - 1, row i seeing those up to p + i: S (Tq, p + Tq) = scale * Q K^T by
// GEMM, the softmax row by row (l: its log-sum-exp), o = P V. q, k, v: the head's first row, rows
// ld apart; o rows ldo apart.
void attend_head(GemmLibrary lib, std::vector<float>& S, float* o, std::int64_t ldo, float* l,
                 const float* q, std::int64_t ldq, const float* k, const float* v,
                 std::int64_t ldkv, int Tq, int p, int hs, float scale) {
  const std::int64_t Tk = static_cast<std::int64_t>(p) + Tq;
  S.resize(static_cast<std::size_t>(Tq) * Tk);
  gemm(lib, false, true, Tq, Tk, hs, scale, q, ldq, k, ldkv, 0.0f, S.data(), Tk);
  for (int i = 0; i < Tq; ++i) {
    float* s = S.data() + static_cast<std::int64_t>(i) * Tk;
    const int last = p + i;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j <= last; ++j) mx = std::max(mx, s[j]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= last; ++j) {
      float e = exp_approx(s[j] - mx);
      s[j] = e;
      sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j <= last; ++j) s[j] *= inv;
    for (std::int64_t j = last + 1; j < Tk; ++j) s[j] = 0.0f;
    l[i] = mx + std::log(sum);
  }
  gemm(lib, false, false, Tq, hs, Tk, 1.0f, S.data(), Tk, v, ldkv, 0.0f, o, ldo);
}
}  // namespace

// Per (batch, head): attend_head over the batch row's T positions (p = 0). Work is split over the
// B*NH (batch, head) pairs; the GEMMs inside run single-threaded (oneDNN detects the enclosing
// parallel region).
void attention_forward(GemmLibrary lib, float* out, float* lse, const float* qkv, int B, int T,
                       int NH, int KV, int hs) {
  const QkvRow row{NH, KV, hs};
  const std::int64_t W = row.width(), OC = static_cast<std::int64_t>(NH) * hs;
  const int group = NH / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  lib = per_thread_gemm(lib);
#pragma omp parallel
  {
    std::vector<float> S;
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const float* base = qkv + static_cast<std::int64_t>(b) * T * W;
        attend_head(lib, S, out + static_cast<std::int64_t>(b) * T * OC + row.q(h), OC,
                    lse + (static_cast<std::int64_t>(b) * NH + h) * T, base + row.q(h), W,
                    base + row.k(h / group), base + row.v(h / group), W, T, 0, hs, scale);
      }
    }
  }
}

void attention_rows(GemmLibrary lib, float* out, float* lse, const float* q, std::int64_t ldq,
                    const float* k, const float* v, std::int64_t ldkv, int Tq, int p, int NH,
                    int KV, int hs) {
  const std::int64_t OC = static_cast<std::int64_t>(NH) * hs;
  const int group = NH / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  lib = per_thread_gemm(lib);
#pragma omp parallel
  {
    std::vector<float> S;
#pragma omp for schedule(static)
    for (int h = 0; h < NH; ++h) {
      const std::int64_t g = static_cast<std::int64_t>(h / group) * hs;
      attend_head(lib, S, out + static_cast<std::int64_t>(h) * hs, OC,
                  lse + static_cast<std::int64_t>(h) * Tq, q + static_cast<std::int64_t>(h) * hs,
                  ldq, k + g, v + g, ldkv, Tq, p, hs, scale);
    }
  }
}

namespace {

// One query head's part of the attention's backward: its rows of q, k, v and their gradients
// (ld apart), of the output and its gradient (ldo apart), its log-sum-exp per row.
struct HeadGrads {
  const float *q, *k, *v, *o, *dO, *lse;
  float *dq, *dk, *dv;
  std::int64_t ld, ldo;
};

// The head's causal probabilities P (T, T) recomputed from its saved log-sum-exp, and
// D_i = sum_j P_ij dP_ij = dO_i . O_i.
void recompute_probs(GemmLibrary lib, float* P, float* D, const HeadGrads& h, int T, int hs,
                     float scale) {
  gemm(lib, false, true, T, T, hs, scale, h.q, h.ld, h.k, h.ld, 0.0f, P, T);
  for (int i = 0; i < T; ++i) {
    float* p = P + static_cast<std::int64_t>(i) * T;
    const float li = h.lse[i];
#pragma omp simd
    for (int j = 0; j <= i; ++j) p[j] = exp_approx(p[j] - li);
    for (int j = i + 1; j < T; ++j) p[j] = 0.0f;
    const float* oi = h.o + static_cast<std::int64_t>(i) * h.ldo;
    const float* gi = h.dO + static_cast<std::int64_t>(i) * h.ldo;
    float d = 0.0f;
#pragma omp simd reduction(+ : d)
    for (int c = 0; c < hs; ++c) d += oi[c] * gi[c];
    D[i] = d;
  }
}

// dq = the head's query gradient; dk and dv get its key and value gradients (beta 0: overwrite,
// 1: add). P, dP: T x T scratch; D: T.
void head_backward(GemmLibrary lib, float* P, float* dP, float* D, const HeadGrads& h, int T,
                   int hs, float scale, float beta) {
  recompute_probs(lib, P, D, h, T, hs, scale);
  // dV (T,hs) (+)= P^T (T,T) @ dO (T,hs)
  gemm(lib, true, false, T, hs, T, 1.0f, P, T, h.dO, h.ldo, beta, h.dv, h.ld);
  // dP (T,T) = dO (T,hs) @ V^T
  gemm(lib, false, true, T, T, hs, 1.0f, h.dO, h.ldo, h.v, h.ld, 0.0f, dP, T);
  // dS = P * (dP - D) * scale, stored in dP
  for (int i = 0; i < T; ++i) {
    float* dp = dP + static_cast<std::int64_t>(i) * T;
    const float* p = P + static_cast<std::int64_t>(i) * T;
    const float di = D[i];
#pragma omp simd
    for (int j = 0; j < T; ++j) dp[j] = p[j] * (dp[j] - di) * scale;
  }
  // dQ (T,hs) = dS @ K ; dK (T,hs) (+)= dS^T @ Q
  gemm(lib, false, false, T, hs, T, 1.0f, dP, T, h.k, h.ld, 0.0f, h.dq, h.ld);
  gemm(lib, true, false, T, hs, T, 1.0f, dP, T, h.q, h.ld, beta, h.dk, h.ld);
}

}  // namespace

// A task per (batch row, key-value head): the query heads of the group run one after another,
// the first overwriting dk and dv and the others adding to them (no two threads write them).
void attention_backward(GemmLibrary lib, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int NH, int KV, int hs) {
  const QkvRow row{NH, KV, hs};
  const std::int64_t W = row.width(), OC = static_cast<std::int64_t>(NH) * hs;
  const int group = NH / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  lib = per_thread_gemm(lib);
#pragma omp parallel
  {
    std::vector<float> P(static_cast<std::size_t>(T) * T), dP(static_cast<std::size_t>(T) * T);
    std::vector<float> D(T);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int g = 0; g < KV; ++g) {
        const std::int64_t base3 = static_cast<std::int64_t>(b) * T * W;
        const std::int64_t base1 = static_cast<std::int64_t>(b) * T * OC;
        for (int h = g * group; h < (g + 1) * group; ++h) {
          const HeadGrads hg{qkv + base3 + row.q(h),
                             qkv + base3 + row.k(g),
                             qkv + base3 + row.v(g),
                             out + base1 + row.q(h),
                             dout + base1 + row.q(h),
                             lse + (static_cast<std::int64_t>(b) * NH + h) * T,
                             dqkv + base3 + row.q(h),
                             dqkv + base3 + row.k(g),
                             dqkv + base3 + row.v(g),
                             W,
                             OC};
          head_backward(lib, P.data(), dP.data(), D.data(), hg, T, hs, scale,
                        h == g * group ? 0.0f : 1.0f);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- RMSNorm, RoPE, SwiGLU
float rmsnorm_row(float* o, const float* x, const float* weight, int C, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int c = 0; c < C; ++c) ss += x[c] * x[c];
  const float r = 1.0f / std::sqrt(ss / C + eps);
#pragma omp simd
  for (int c = 0; c < C; ++c) o[c] = x[c] * r * weight[c];
  return r;
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, std::int64_t N,
                     int C, float eps) {
#pragma omp parallel for schedule(static) if (N > 1)  // one row (decoding): no thread team
  for (std::int64_t i = 0; i < N; ++i)
    rstd[i] = rmsnorm_row(out + i * C, inp + i * C, weight, C, eps);
}

// With n = x r: dx = r (w g - n mean(w g n)); dw += g n.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, std::int64_t N, int C) {
  int nth = omp_get_max_threads();
  // Per-thread partial sums of dweight, combined in thread order: deterministic.
  std::vector<float> partial(static_cast<std::size_t>(nth) * C, 0.0f);
#pragma omp parallel num_threads(nth)
  {
    float* dw = partial.data() + static_cast<std::size_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* g = dout + i * C;
      const float r = rstd[i];
      float sum_dn_n = 0.0f;
#pragma omp simd reduction(+ : sum_dn_n)
      for (int c = 0; c < C; ++c) sum_dn_n += weight[c] * g[c] * x[c] * r;
      const float mean_dn_n = sum_dn_n / C;
      float* dx = dinp + i * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float n = x[c] * r;
        dw[c] += g[c] * n;
        dx[c] += (weight[c] * g[c] - n * mean_dn_n) * r;
      }
    }
  }
  for (int t = 0; t < nth; ++t) {
    const float* dw = partial.data() + static_cast<std::size_t>(t) * C;
    for (int c = 0; c < C; ++c) dweight[c] += dw[c];
  }
}

void rope_table(float* cs, float* sn, int T, int hs, const double* inv_freq, int pos0, float sign) {
  const int half = hs / 2;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const double a = (pos0 + t) * inv_freq[i];
      cs[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::cos(a));
      sn[static_cast<std::size_t>(t) * half + i] = sign * static_cast<float>(std::sin(a));
    }
}

void rope_rotate_heads(float* heads, int h0, int h1, int hs, const float* c, const float* s) {
  const int half = hs / 2;
  for (int h = h0; h < h1; ++h) {
    float* x = heads + static_cast<std::int64_t>(h) * hs;
#pragma omp simd
    for (int i = 0; i < half; ++i) {
      const float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * c[i] - x2 * s[i];
      x[i + half] = x2 * c[i] + x1 * s[i];
    }
  }
}

namespace {
// Rotates q and k of every row in place by +angle (forward) or -angle (backward).
void rope_rotate(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                 float sign, int pos0) {
  const int half = hs / 2;
  std::vector<float> cs(static_cast<std::size_t>(T) * half), sn(cs.size());
  rope_table(cs.data(), sn.data(), T, hs, inv_freq, pos0, sign);
  const QkvRow row{NH, KV, hs};
  const std::int64_t W = row.width();
#pragma omp parallel for collapse(2) schedule(static) if (B * T > 1)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)  // the q heads, then the k heads, back to back
      rope_rotate_heads(qkv + (static_cast<std::int64_t>(b) * T + t) * W, 0, NH + KV, hs,
                        cs.data() + static_cast<std::size_t>(t) * half,
                        sn.data() + static_cast<std::size_t>(t) * half);
}
}  // namespace

void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq,
                  int pos0) {
  rope_rotate(qkv, B, T, NH, KV, hs, inv_freq, 1.0f, pos0);
}
void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, const double* inv_freq) {
  rope_rotate(dqkv, B, T, NH, KV, hs, inv_freq, -1.0f, 0);
}

#if defined(__AVX2__) && defined(__FMA__)
// silu(gate) up for 8 values, on vectors (see exp_approx8): the loop the compiler vectorized
// itself took 3.2 ns per value on a Zen 5 (its subnormal lanes), this one 0.5.
inline __m256 swiglu8(__m256 g, __m256 up) {
  const __m256 e = exp_approx8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), up);
}

void swiglu_slice(float* out, const float* gate, const float* up, int n) {
  int c = 0;
  for (; c + 8 <= n; c += 8)
    _mm256_storeu_ps(out + c, swiglu8(_mm256_loadu_ps(gate + c), _mm256_loadu_ps(up + c)));
  if (c == n) return;
  // The tail through the same vectors, so that a value's result does not depend on where a
  // slice of it starts (the decoder's threads take slices of the rows a forward takes whole).
  alignas(32) float g[8] = {}, u[8] = {}, o[8];
  std::copy(gate + c, gate + n, g);
  std::copy(up + c, up + n, u);
  _mm256_store_ps(o, swiglu8(_mm256_load_ps(g), _mm256_load_ps(u)));
  std::copy(o, o + (n - c), out + c);
}
#else
void swiglu_slice(float* out, const float* gate, const float* up, int n) {
#pragma omp simd
  for (int c = 0; c < n; ++c) {
    const float g = gate[c];
    out[c] = g / (1.0f + exp_approx(-g)) * up[c];
  }
}
#endif

void swiglu_forward(float* out, const float* inp, std::int64_t N, int F) {
#pragma omp parallel for schedule(static) if (N > 1)  // one row (decoding): no thread team
  for (std::int64_t i = 0; i < N; ++i)
    swiglu_slice(out + i * F, inp + i * 2 * F, inp + i * 2 * F + F, F);
}

// d gate = dout up silu'(g), silu'(g) = sig(g) (1 + g (1 - sig(g))); d up = dout silu(g).
void swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N, int F) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < N; ++i) {
    const float* gate = inp + i * 2 * F;
    const float* up = gate + F;
    const float* d = dout + i * F;
    float* dg = dinp + i * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int c = 0; c < F; ++c) {
      const float g = gate[c];
      const float sig = 1.0f / (1.0f + exp_approx(-g));
      dg[c] = d[c] * up[c] * sig * (1.0f + g * (1.0f - sig));
      du[c] = d[c] * g * sig;
    }
  }
}

// ---------------------------------------------------------------- cross-entropy
namespace {
// Returns the loss of one row; if dlogits is non-null writes dloss*(softmax - onehot) to it
// (it may alias logits).
inline float cross_entropy_row(const float* logits, float* dlogits, std::int32_t target, int V,
                               int Vp, float dloss) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < V; ++j) mx = std::max(mx, logits[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; ++j) sum += exp_approx(logits[j] - mx);
  float lse = mx + std::log(sum);
  float loss = lse - logits[target];
  if (dlogits) {
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < V; ++j) dlogits[j] = dloss * exp_approx(logits[j] - mx) * inv;
    dlogits[target] -= dloss;
    for (int j = V; j < Vp; ++j) dlogits[j] = 0.0f;
  }
  return loss;
}
}  // namespace

void cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets,
                           std::int64_t N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < N; ++i) {
    std::int32_t t = targets[i];
    losses[i] = t < 0 ? 0.0f : cross_entropy_row(logits + i * Vp, nullptr, t, V, Vp, 0.0f);
  }
}

void cross_entropy_forward_backward(float* losses, float* logits, const std::int32_t* targets,
                                    std::int64_t N, int V, int Vp, float dloss) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < N; ++i) {
    float* row = logits + i * Vp;
    std::int32_t t = targets[i];
    if (t < 0) {
      losses[i] = 0.0f;
      std::fill(row, row + Vp, 0.0f);
    } else {
      losses[i] = cross_entropy_row(row, row, t, V, Vp, dloss);
    }
  }
}

// ---------------------------------------------------------------- elementwise
void add(float* out, const float* a, const float* b, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* out, const float* a, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] += a[i];
}

void copy(float* out, const float* a, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i];
}

}  // namespace tessera::kernels::cpu
