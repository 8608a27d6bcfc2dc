#include "tessera/model/gpt.hpp"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/cpu/vec_math.hpp"
#include "tessera/model/cpu_ops.hpp"
#include "tessera/model/gpt_block.hpp"

namespace tessera::model {

namespace k = kernels::cpu;

namespace {

BlockActs<float> block_acts(Activations& a, int l) {
  const auto& s = a.layers[l];
  return {a.at(s.ln1),     a.at(s.ln1_mean), a.at(s.ln1_rstd), a.at(s.qkv),      a.at(s.atty),
          a.at(s.att_lse), a.at(s.res2),     a.at(s.ln2),      a.at(s.ln2_mean), a.at(s.ln2_rstd),
          a.at(s.fch),     a.at(s.fch_gelu), a.at(s.res3)};
}

}  // namespace

void init_params(const ParamLayout& layout, float* params, std::uint64_t seed) {
  const auto& cfg = layout.config();
  const float std_base = 0.02f;
  const float std_resid = 0.02f / std::sqrt(2.0f * cfg.n_layer);
  constexpr std::size_t k_chunk = 1 << 16;
  std::fill(params, params + layout.total(), 0.0f);
  const auto& ts = layout.tensors();
  for (std::size_t ti = 0; ti < ts.size(); ++ti) {
    const auto& t = ts[ti];
    float* p = params + t.offset;
    const std::string& n = t.name;
    auto ends_with = [&](const char* s) {
      std::string_view sv(s);
      return n.size() >= sv.size() && n.compare(n.size() - sv.size(), sv.size(), sv) == 0;
    };
    if (ends_with("ln_1.weight") || ends_with("ln_2.weight") || ends_with("ln_f.weight") ||
        ends_with("norm.weight") || ends_with("layernorm.weight")) {
      std::fill(p, p + t.numel, 1.0f);
      continue;
    }
    if (ends_with(".bias")) continue;  // zeros
    const bool residual = ends_with("attn.c_proj.weight") || ends_with("mlp.c_proj.weight") ||
                          ends_with("o_proj.weight") || ends_with("down_proj.weight");
    float stdev = residual ? std_resid : std_base;
    std::size_t n_init = t.numel;
    if (t.vocab_rows)
      n_init = static_cast<std::size_t>(cfg.vocab_size) * cfg.n_embd;  // pad rows stay 0
    std::size_t chunks = (n_init + k_chunk - 1) / k_chunk;
#pragma omp parallel for schedule(static)
    for (std::size_t c = 0; c < chunks; ++c) {
      Rng rng(seed ^ (0x9E3779B97F4A7C15ull * (ti + 1)) ^ (0xC2B2AE3D27D4EB4Full * (c + 1)));
      std::size_t e = std::min(n_init, (c + 1) * k_chunk);
      for (std::size_t i = c * k_chunk; i < e; ++i) p[i] = stdev * rng.normal();
    }
  }
}

void Activations::allocate(const ModelConfig& cfg, int B_, int T_) {
  if (B_ == B && T_ == T && buf.size() > 0) return;
  B = B_;
  T = T_;
  const std::size_t N = static_cast<std::size_t>(B) * T, C = cfg.n_embd, NH = cfg.n_head;
  const std::size_t Vp = cfg.padded_vocab(), QKV = cfg.qkv_rows(), FC = cfg.fc_rows();
  const std::size_t F = cfg.ffn();
  std::size_t off = 0;
  auto take = [&](std::size_t n) {
    std::size_t o = off;
    off += (n + 15) / 16 * 16;
    return o;
  };
  encoded = take(N * C);
  layers.assign(cfg.n_layer, {});
  for (auto& l : layers) {
    l.ln1 = take(N * C);
    l.ln1_mean = take(N);
    l.ln1_rstd = take(N);
    l.qkv = take(N * QKV);
    l.atty = take(N * C);
    l.att_lse = take(N * NH);
    l.res2 = take(N * C);
    l.ln2 = take(N * C);
    l.ln2_mean = take(N);
    l.ln2_rstd = take(N);
    l.fch = take(N * FC);
    l.fch_gelu = take(N * F);
    l.res3 = take(N * C);
  }
  lnf = take(N * C);
  lnf_mean = take(N);
  lnf_rstd = take(N);
  logits = take(N * Vp);
  losses = take(N);
  d_res = take(N * C);
  d_ln = take(N * C);
  d_atty = take(N * C);
  d_qkv = take(N * QKV);
  d_fch = take(N * FC);
  d_act = cfg.llama() ? take(N * F) : k_absent;
  buf.resize(off);
}

namespace {
// Every id of ids (n) a token of the vocabulary (V), or an ignored target (-1) where `lowest` is
// -1: else the error names the first one outside it.
void check_token_ids(const std::int32_t* ids, std::int64_t n, int V, const char* what, int lowest) {
  for (std::int64_t i = 0; i < n; ++i)
    if (ids[i] < lowest || ids[i] >= V)
      throw Error(
          fmt::format("{} token id {} is outside the model's vocabulary of {}", what, ids[i], V),
          "the data was tokenized with a larger vocabulary than model.vocab_size");
}

// The final norm of the residual stream and the LM head: logits (N, Vp) = lnf (N, C) @ head^T
// (C, Vp), the head being the token embedding when tied. E, F: the store's first block (the
// embeddings) and last (the final norm, and the head when untied).
void head_forward(const ParamLayout& layout, const float* E, const float* F, Activations& a,
                  const float* residual, std::int64_t N, const ForwardOptions& opt) {
  const auto& cfg = layout.config();
  const int C = cfg.n_embd, Vp = cfg.padded_vocab();
  kernels::Profile* const PROF = opt.profile;
  auto PF = [&](std::size_t off) { return F + (off - layout.lnf_w); };
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::LayerNorm);
    if (cfg.llama())
      k::rmsnorm_forward(a.at(a.lnf), a.at(a.lnf_rstd), residual, PF(layout.lnf_w), N, C,
                         static_cast<float>(cfg.norm_eps));
    else
      k::layernorm_forward(a.at(a.lnf), a.at(a.lnf_mean), a.at(a.lnf_rstd), residual,
                           PF(layout.lnf_w), PF(layout.lnf_b), N, C);
  }
  kernels::ProfileScope ps_(PROF, kernels::OpFamily::Gemm);
  const float* head = layout.head == layout.wte ? E + layout.wte : PF(layout.head);
  if (opt.bf16_params)  // the head's bf16 copy (layout.head is wte when tied)
    k::linear_forward_bf16(a.bf16, a.at(a.logits), a.at(a.lnf), opt.bf16_params + layout.head,
                           nullptr, nullptr, N, C, Vp);
  else
    k::linear_forward(opt.gemm, a.at(a.logits), a.at(a.lnf), head, nullptr, N, C, Vp);
}

// The cross-entropy of the logits against targets (N; -1: ignored), with its gradient when
// training; returns the mean over the targets not ignored (0 if none).
float loss_forward(const ModelConfig& cfg, Activations& a, const std::int32_t* targets,
                   std::int64_t N, const ForwardOptions& opt) {
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab();
  check_token_ids(targets, N, V, "target", -1);
  {
    kernels::ProfileScope ps_(opt.profile, kernels::OpFamily::CrossEntropy);
    if (opt.training)
      k::cross_entropy_forward_backward(a.at(a.losses), a.at(a.logits), targets, N, V, Vp,
                                        opt.dloss);
    else
      k::cross_entropy_forward(a.at(a.losses), a.at(a.logits), targets, N, V, Vp);
  }
  double sum = 0.0;
  std::int64_t count = 0;
  const float* losses = a.at(a.losses);
  for (std::int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    sum += losses[i];
    ++count;
  }
  return count ? static_cast<float>(sum / count) : 0.0f;
}
// The LM head's and the final norm's backward: from dlogits (held in a.logits) to the head's and
// the norm's gradients (E, GE: the embedding block's parameters and gradients, the tied head's;
// F, GF: the final norm's block's, an untied head's) and the gradient of the last block's output
// (a.d_res).
void head_backward(const ParamLayout& layout, const float* E, float* GE, const float* F, float* GF,
                   Activations& a, std::int64_t N, kernels::GemmLibrary lib, kernels::Profile* PROF,
                   const std::uint16_t* P16) {
  const auto& cfg = layout.config();
  const int C = cfg.n_embd, Vp = cfg.padded_vocab();
  auto PF = [&](std::size_t off) { return F + (off - layout.lnf_w); };
  auto GFo = [&](std::size_t off) { return GF + (off - layout.lnf_w); };
  float* d_res = a.at(a.d_res);
  float* d_ln = a.at(a.d_ln);
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::Gemm);
    const bool tied = layout.head == layout.wte;
    float* dhead = tied ? GE + layout.wte : GFo(layout.head);
    if (P16)
      k::linear_backward_bf16(a.bf16, d_ln, dhead, nullptr, a.at(a.logits), a.at(a.lnf),
                              P16 + layout.head, N, C, Vp);
    else
      k::linear_backward(lib, d_ln, dhead, nullptr, a.at(a.logits), a.at(a.lnf),
                         tied ? E + layout.wte : PF(layout.head), N, C, Vp);
  }
  std::fill(d_res, d_res + N * C, 0.0f);
  const float* last = cfg.n_layer > 0 ? a.at(a.layers.back().res3) : a.at(a.encoded);
  kernels::ProfileScope ps_(PROF, kernels::OpFamily::LayerNorm);
  if (cfg.llama())
    k::rmsnorm_backward(d_res, GFo(layout.lnf_w), d_ln, last, PF(layout.lnf_w), a.at(a.lnf_rstd), N,
                        C);
  else
    k::layernorm_backward(d_res, GFo(layout.lnf_w), GFo(layout.lnf_b), d_ln, last, PF(layout.lnf_w),
                          a.at(a.lnf_mean), a.at(a.lnf_rstd), N, C);
}

}  // namespace

float forward(const ParamLayout& layout, ParamStore& store, Activations& a,
              const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
              const ForwardOptions& opt) {
  const auto& cfg = layout.config();
  if (T > cfg.block_size)
    throw Error(
        fmt::format("sequence length {} exceeds the model's block_size {}", T, cfg.block_size));
  a.allocate(cfg, B, T);
  const int C = cfg.n_embd;
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  const auto lib = opt.gemm;
  kernels::Profile* const PROF = opt.profile;
  store.begin_forward();
  // Block pointers: the store decides where each block's parameters are (flat buffer, gathered
  // shard, ...); offsets in the layout are made relative to the block's start.
  const float* E = store.params(0);
  check_token_ids(inputs, N, cfg.vocab_size, "input", 0);
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::Embedding);
    k::embedding_forward(a.at(a.encoded), inputs, E + layout.wte,
                         layout.wpe == k_absent ? nullptr : E + layout.wpe, B, T, C);
  }
  const float* residual = a.at(a.encoded);
  const BlockShape shape = block_shape(cfg, B, T);
  const std::uint16_t* P16 = opt.bf16_params;  // bf16 mixed precision, or null
  for (int l = 0; l < cfg.n_layer; ++l) {
    const float* p = store.params(l + 1);
    if (P16) {
      CpuBf16Ops ops(lib, PROF, a.bf16);
      block_forward(ops, block_weights_bf16(layout.layers[l], p, P16 + block_begin(layout, l + 1)),
                    block_acts(a, l), residual, shape);
    } else {
      CpuOps ops(lib, PROF);
      block_forward(ops, block_weights(layout.layers[l], p), block_acts(a, l), residual, shape);
    }
    residual = a.at(a.layers[l].res3);
    store.release(l + 1);
  }
  head_forward(layout, E, store.params(cfg.n_layer + 1), a, residual, N, opt);
  store.release(cfg.n_layer + 1);
  return targets ? loss_forward(cfg, a, targets, N, opt) : 0.0f;
}

void backward(const ParamLayout& layout, ParamStore& store, Activations& a,
              const std::int32_t* inputs, int B, int T, kernels::GemmLibrary lib,
              kernels::Profile* PROF, const std::uint16_t* P16) {
  const auto& cfg = layout.config();
  TESSERA_CHECK(a.B == B && a.T == T,
                "backward() needs the forward() activations of the same batch");
  const int C = cfg.n_embd;
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  store.begin_backward();
  const float* E = store.params(0);
  float* GEb = store.grads(0);
  const int LB = cfg.n_layer + 1;  // the final norm's block
  const float* F = store.params(LB);
  float* GF = store.grads(LB);
  head_backward(layout, E, GEb, F, GF, a, N, lib, PROF, P16);
  store.grads_done(LB);  // the final norm (and an untied head)
  store.release(LB);
  float* d_res = a.at(a.d_res);
  const BlockShape shape = block_shape(cfg, B, T);
  const BlockScratch<float> scratch{d_res,
                                    d_res,
                                    a.at(a.d_ln),
                                    a.at(a.d_atty),
                                    a.at(a.d_qkv),
                                    a.at(a.d_fch),
                                    cfg.llama() ? a.at(a.d_act) : nullptr};
  for (int l = cfg.n_layer - 1; l >= 0; --l) {
    const float* x = l == 0 ? a.at(a.encoded) : a.at(a.layers[l - 1].res3);
    const float* p = store.params(l + 1);
    const BlockGrads g = block_grads(layout.layers[l], store.grads(l + 1));
    if (P16) {
      CpuBf16Ops ops(lib, PROF, a.bf16, &store);
      block_backward(ops, block_weights_bf16(layout.layers[l], p, P16 + block_begin(layout, l + 1)),
                     g, block_acts(a, l), scratch, x, shape);
    } else {
      CpuOps ops(lib, PROF, &store);
      block_backward(ops, block_weights(layout.layers[l], p), g, block_acts(a, l), scratch, x,
                     shape);
    }
    store.grads_done(l + 1);  // this layer's gradients are final
    store.release(l + 1);
  }
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::Embedding);
    k::embedding_backward(GEb + layout.wte, layout.wpe == k_absent ? nullptr : GEb + layout.wpe,
                          d_res, inputs, B, T, C);
  }
  store.grads_done(0);  // wte (with the tied LM head's part) and wpe
  store.release(0);
}

// ---------------------------------------------------------------- blocks and stores
int num_blocks(const ParamLayout& layout) {
  return layout.config().n_layer + 2;
}

std::size_t block_begin(const ParamLayout& layout, int b) {
  const int L = layout.config().n_layer;
  if (b == 0) return 0;
  if (b <= L) return layout.layers[b - 1].begin;
  return layout.lnf_w;
}

std::size_t block_end(const ParamLayout& layout, int b) {
  const int L = layout.config().n_layer;
  if (b == L + 1) return layout.total();
  return block_begin(layout, b + 1);
}

const float* FlatStore::params(int b) {
  return params_ + block_begin(layout_, b);
}
float* FlatStore::grads(int b) {
  TESSERA_CHECK(grads_, "backward needs a gradient buffer");
  return grads_ + block_begin(layout_, b);
}
void FlatStore::grads_done(int b) {
  if (hooks_ && hooks_->grads_ready)
    hooks_->grads_ready(block_begin(layout_, b), block_end(layout_, b));
}
void FlatStore::progress() {
  if (hooks_ && hooks_->progress) hooks_->progress();
}

float forward(const ParamLayout& layout, const float* params, Activations& acts,
              const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
              const ForwardOptions& opt) {
  FlatStore store(layout, params, nullptr);
  return forward(layout, store, acts, inputs, targets, B, T, opt);
}

void backward(const ParamLayout& layout, const float* params, float* grads, Activations& acts,
              const std::int32_t* inputs, int B, int T, kernels::GemmLibrary gemm,
              kernels::Profile* profile, const BackwardHooks* hooks,
              const std::uint16_t* bf16_params) {
  FlatStore store(layout, params, grads, hooks);
  backward(layout, store, acts, inputs, B, T, gemm, profile, bf16_params);
}

// ---------------------------------------------------------------- decoding
TeamShare team_share(int n) {
  const std::int64_t nt = omp_get_num_threads(), i = omp_get_thread_num();
  return {static_cast<int>(n * i / nt), static_cast<int>(n * (i + 1) / nt)};
}

TeamRows team_rows(int rows) {
  const auto [g0, g1] = team_share((rows + k_team_rows - 1) / k_team_rows);
  return {{g0 * k_team_rows, std::min(rows, g1 * k_team_rows)}, {0, 0}, true};
}

TeamRows linear_rows(const ModelConfig& cfg, int which, int rows) {
  const int F = cfg.ffn();
  if (which != 2 || !cfg.llama() || F % k_team_rows != 0 || rows != 2 * F) return team_rows(rows);
  const TeamRows gate = team_rows(F);
  return {gate.first, {F + gate.first.begin, F + gate.first.end}, false};
}

void team_linear(kernels::GemmLibrary lib, float* out, const float* in, const float* weight,
                 const float* bias, int IC, bool accumulate, const TeamRows& rows) {
  for (const TeamShare& run : {rows.first, rows.second}) {
    const auto [r0, r1] = run;
    if (r1 > r0)  // (the bias added here: linear_forward's loop for it is a parallel region)
      k::linear_forward(lib, out + r0, in, weight + static_cast<std::size_t>(r0) * IC, nullptr, 1,
                        IC, r1 - r0, accumulate);
    if (bias)
      for (int r = r0; r < r1; ++r) out[r] += bias[r];
  }
}

int fp32_share(const ParamLayout& layout, const float* params, int layer, int which,
               ByteSpan* out) {
  const auto& cfg = layout.config();
  std::size_t weight = layout.head;
  int cols = cfg.n_embd;
  TeamRows rows = team_rows(cfg.padded_vocab());
  if (which != k_head_product) {
    const LinearShape shape = block_linear_shape(cfg, which);
    weight = block_linear_weight(layout, layer, which);
    cols = shape.cols;
    rows = linear_rows(cfg, which, shape.rows);
  }
  int n = 0;
  for (const TeamShare& run : {rows.first, rows.second})
    if (run.end > run.begin)
      out[n++] = {params + weight + static_cast<std::size_t>(run.begin) * cols,
                  static_cast<std::size_t>(run.end - run.begin) * cols * sizeof(float)};
  return n;
}

// The fp16 cache's conversions and products use F16C (and FMA): part of x86-64-v3, the default
// -march; a build for an older target has only the fp32 cache.
#if defined(__F16C__) && defined(__FMA__) && defined(__AVX2__)
#define TESSERA_KV_F16 1
#else
#define TESSERA_KV_F16 0
#endif

const char* kv_cache_name(KvCache kv) {
  return kv == KvCache::F16 ? "f16" : "f32";
}

KvCache parse_kv_cache(const std::string& s) {
  if (s == "f32") return KvCache::F32;
  if (s == "f16") return KvCache::F16;
  throw Error(fmt::format("unknown KV cache type '{}'", s), "use f32 or f16");
}

Decoder::Decoder(const ParamLayout& layout, const float* params, int max_T,
                 kernels::GemmLibrary gemm, DecoderKernels kernels, KvCache kv)
    : layout_(layout),
      params_(params),
      max_T_(max_T),
      gemm_(gemm),
      kernels_(std::move(kernels)),
      kv_(kv) {
  const auto& cfg = layout.config();
  if (max_T > cfg.block_size)
    throw Error(
        fmt::format("decoding length {} exceeds the model's block_size {}", max_T, cfg.block_size));
  if (kv == KvCache::F16 && !TESSERA_KV_F16)
    throw Error("this build has no fp16 KV cache (it needs F16C: -march=x86-64-v3 or later)",
                "use the fp32 cache");
  const std::size_t C = cfg.n_embd, KVC = static_cast<std::size_t>(cfg.kv_heads()) * cfg.head_dim();
  const std::size_t cache = static_cast<std::size_t>(cfg.n_layer) * max_T * KVC;
  // The cache's pages are backed at once. It grows by a row per layer and step, and a lazily
  // backed map stopped a step for a page fault at each row that began a page: ~11 per step on
  // SmolLM2 (30 layers, 768-byte rows of keys and of values), 0.04 ms of a 2-2.5 ms W4 step on
  // a 2-vCPU VM, all on the thread that writes the rows while the other waited at the next
  // barrier. generate() sizes the cache to the positions it can reach.
  if (kv == KvCache::F16) {
    k_half_.resize(cache, Buffer<std::uint16_t>::Pages::Resident);
    v_half_.resize(cache, Buffer<std::uint16_t>::Pages::Resident);
  } else {
    k_cache_.resize(cache, Buffer<float>::Pages::Resident);
    v_cache_.resize(cache, Buffer<float>::Pages::Resident);
  }
  x_.resize(C);
  qkv_.resize(cfg.qkv_rows());
  fch_.resize(cfg.fc_rows());
  act_.resize(cfg.ffn());
  if (cfg.llama()) {
    inv_freq_ = rope_inv_freq(cfg);
    cos_.resize(cfg.head_dim() / 2);
    sin_.resize(cfg.head_dim() / 2);
  }
  logits_.resize(cfg.padded_vocab());
}

namespace {
// One row's norm, each family's kind, on the calling thread.
void norm_row(const ModelConfig& cfg, float* out, const float* x, const float* w, const float* b) {
  float mean, rstd;
  if (cfg.llama())
    k::rmsnorm_row(out, x, w, cfg.n_embd, static_cast<float>(cfg.norm_eps));
  else
    k::layernorm_row(out, &mean, &rstd, x, w, b, cfg.n_embd);
}

// sum_c a[c] b[c] in 8 interleaved partial sums (which the compiler keeps in one vector register).
float dot8(const float* a, const float* b, int n) {
  float acc[8] = {};
  int c = 0;
  for (; c + 8 <= n; c += 8)
    for (int i = 0; i < 8; ++i) acc[i] += a[c + i] * b[c + i];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; c < n; ++c) s += a[c] * b[c];
  return s;
}

#if TESSERA_KV_F16
inline __m256 load_half8(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline float half_to_float(std::uint16_t h) {
  return _cvtsh_ss(h);
}

// sum_c a[c] b[c] with b in fp16.
float dot8(const float* a, const std::uint16_t* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int c = 0;
  for (; c + 8 <= n; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), load_half8(b + c), acc);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  float s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  for (; c < n; ++c) s += a[c] * half_to_float(b[c]);
  return s;
}

// out (n) = in rounded to the nearest fp16 (ties to even).
void to_half(std::uint16_t* out, const float* in, int n) {
  int c = 0;
  for (; c + 8 <= n; c += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + c), _MM_FROUND_TO_NEAREST_INT));
  for (; c < n; ++c) out[c] = _cvtss_sh(in[c], _MM_FROUND_TO_NEAREST_INT);
}
#else
inline float half_to_float(std::uint16_t) {
  return 0.0f;  // (not reached: the constructor refuses the fp16 cache in this build)
}
float dot8(const float*, const std::uint16_t*, int) {
  return 0.0f;  // (not reached: the constructor refuses the fp16 cache in this build)
}
void to_half(std::uint16_t*, const float*, int) {}
#endif
}  // namespace

std::size_t Decoder::kv_cache_bytes() const {
  return (k_cache_.size() + v_cache_.size()) * sizeof(float) +
         (k_half_.size() + v_half_.size()) * sizeof(std::uint16_t);
}

void Decoder::linear(int layer, int which, float* out, const float* in, const float* weight,
                     const float* bias, int IC, int OC, bool accumulate) {
  if (kernels_.linear)
    kernels_.linear(layer, which, out, in, bias, accumulate);
  else
    team_linear(gemm_, out, in, weight, bias, IC, accumulate,
                linear_rows(layout_.config(), which, OC));
}

// This thread's copy of the newest position's q heads, rotated (llama; GPT-2's are read in
// place), and, by the thread whose attention share holds that position (the team's last), its k
// heads rotated and v heads written to layer l's cache: no thread reads what another writes
// here, so the attention needs no barrier before it.
const float* Decoder::query_and_cache(int l, int t) {
  const auto& cfg = layout_.config();
  const int NH = cfg.n_head, KV = cfg.kv_heads(), hs = cfg.head_dim();
  const int i = omp_get_thread_num();
  const std::size_t QC = static_cast<std::size_t>(NH) * hs;
  const float* q = qkv_.data();
  if (cfg.llama()) {
    float* own = q_.data() + static_cast<std::size_t>(i) * QC;
    std::copy(q, q + QC, own);
    k::rope_rotate_heads(own, 0, NH, hs, cos_.data(), sin_.data());
    q = own;
  }
  if (i == omp_get_num_threads() - 1) {
    float* k = qkv_.data() + QC;  // the k and v heads, which no other thread reads
    if (cfg.llama()) k::rope_rotate_heads(k, 0, KV, hs, cos_.data(), sin_.data());
    keep_kv(l, t, k);
  }
  return q;
}

// Position t of layer l: its keys kv (KV heads) and values kv + KV * hs into the cache.
void Decoder::keep_kv(int l, int t, const float* kv) {
  const auto& cfg = layout_.config();
  const std::size_t KVC = static_cast<std::size_t>(cfg.kv_heads()) * cfg.head_dim();
  const std::size_t row = (static_cast<std::size_t>(l) * max_T_ + t) * KVC;
  if (kv_ == KvCache::F16) {
    to_half(k_half_.data() + row, kv, static_cast<int>(KVC));
    to_half(v_half_.data() + row, kv + KVC, static_cast<int>(KVC));
  } else {
    std::copy(kv, kv + KVC, k_cache_.data() + row);
    std::copy(kv + KVC, kv + 2 * KVC, v_cache_.data() + row);
  }
}

namespace {
inline float value(float v) {
  return v;
}
inline float value(std::uint16_t h) {
  return half_to_float(h);
}

// The decoding attention reads its thread's share of the cache a block of k_att_block positions
// at a time, keys then values, each block's scores kept in cache for its softmax and its
// weighted values (the online softmax of flash decoding: a running max and sum per head, the
// partial sums rescaled when the max grows), while the next block's rows are fetched into L2.
// Measured on the Zen 4 (W4 SmolLM2-135M, 2 threads, bench_decode, builds alternated): at 4000
// positions 8.9-9.6 ms per token against 11.6-12.0 with whole-share passes (all the scores, then
// the softmax, then the values a head at a time), fp16 cache 6.9-7.3 against 7.6-8.1; at 16-80
// positions alike.
constexpr int k_att_block = 64;

// The next block's keys (k) and values (v), `lines` cache lines each, fetched into L2 while this
// block is computed, in even pieces spread over the block's scores (`per` lines each): the keys
// first, then the values, one sequential stream at a time. Without it the blocks' rows come from
// memory in the order the heads read them, a few lines of each row at a time, which the hardware
// prefetchers follow poorly. Measured at 4000 positions as above: fetched into L1 (T0) 10.8-11.2
// ms per token, into L2 8.9-9.6; two blocks ahead no better than one; the keys' and values'
// lines side by side (two streams at once) lost most of the gain in a copy of the attention.
struct Ahead {
  const char* k;
  const char* v;
  std::size_t lines, per;
  Ahead(const void* keys, const void* values, std::size_t bytes, int pieces)
      : k(static_cast<const char*>(keys)),
        v(static_cast<const char*>(values)),
        lines((bytes + 63) / 64),
        per(pieces > 0 ? (2 * lines + pieces - 1) / pieces : 0) {}
  [[gnu::always_inline]] void part(int i) const {
    const std::size_t l0 = i * per, l1 = std::min(l0 + per, 2 * lines);
    for (std::size_t l = l0; l < l1; ++l)
      __builtin_prefetch(l < lines ? k + l * 64 : v + (l - lines) * 64, 0, 2);
  }
};

// Consecutive heads of one group in a block: head i's partial sums of values acc(i), its block's
// weights p(i) (exp(score - max)) and the factor r[i] its partial sums are first rescaled by.
struct Heads {
  float* acc0;
  std::size_t acc_stride;
  const float* p0;
  std::size_t p_stride;
  const float* r;
  float* acc(int i) const { return acc0 + i * acc_stride; }
  const float* p(int i) const { return p0 + i * p_stride; }
  Heads from(int i) const { return {acc(i), acc_stride, p(i), p_stride, r + i}; }
};

#if TESSERA_KV_F16  // (AVX2, FMA and F16C: x86-64-v3)
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const std::uint16_t* p) {
  return load_half8(p);
}

// The dot products of 8 positions' keys (rows k + j ld) with q (HS values, in registers): one
// vector of 8 sums, the 8 accumulators reduced together.
template <int HS, typename T>
__m256 scores8(const float* q, const T* k, std::size_t ld) {
  __m256 a[8];
  for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
  for (int c0 = 0; c0 < HS; c0 += 64) {  // 64 columns of q at a time: 8 registers
    __m256 qv[8];
    for (int c = 0; c < 8; ++c) qv[c] = _mm256_loadu_ps(q + c0 + 8 * c);
    for (int c = 0; c < 8; ++c)
      for (int j = 0; j < 8; ++j)
        a[j] = _mm256_fmadd_ps(qv[c], load8(k + j * ld + c0 + 8 * c), a[j]);
  }
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

// The same as block_values for M heads (M <= 3: 12 accumulators and 4 vectors of values fill
// the 16 registers): 32 columns at a time, each position's values loaded once for the M heads.
template <int HS, int M, typename T>
void values_m(const Heads& h, const T* v, std::size_t ld, int n) {
  for (int c0 = 0; c0 < HS; c0 += 32) {
    __m256 a[M][4];
    for (int i = 0; i < M; ++i)
      for (int c = 0; c < 4; ++c)
        a[i][c] = _mm256_mul_ps(_mm256_loadu_ps(h.acc(i) + c0 + 8 * c), _mm256_set1_ps(h.r[i]));
    for (int j = 0; j < n; ++j) {
      __m256 vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = load8(v + j * ld + c0 + 8 * c);
      for (int i = 0; i < M; ++i) {
        const __m256 pj = _mm256_broadcast_ss(h.p(i) + j);
        for (int c = 0; c < 4; ++c) a[i][c] = _mm256_fmadd_ps(pj, vv[c], a[i][c]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(h.acc(i) + c0 + 8 * c, a[i][c]);
  }
}
#endif

// sc (n) = scale x the dot products of q (hs) with n positions' keys (rows k + j ld), with a
// piece of the next block's prefetch before each 8 positions (`piece` first).
template <int HS, typename T>
void block_scores(float* sc, const float* q, const T* k, std::size_t ld, int n, int hs, float scale,
                  const Ahead& ahead, int piece) {
  int j = 0;
#if TESSERA_KV_F16
  if constexpr (HS > 0 && HS % 64 == 0)
    for (const __m256 s = _mm256_set1_ps(scale); j + 8 <= n; j += 8, ++piece) {
      ahead.part(piece);
      _mm256_storeu_ps(sc + j, _mm256_mul_ps(scores8<HS>(q, k + j * ld, ld), s));
    }
#endif
  for (; j < n; ++j) {  // other head sizes (and the tail): the same prefetch, one dot at a time
    if (j % 8 == 0 && j + 8 <= n) ahead.part(piece++);
    sc[j] = dot8(q, k + j * ld, hs) * scale;
  }
}

// The online softmax of one head over a block: its running max m and sum s (in part[0], part[1])
// take in the block's scores sc (n), which become exp(score - new max); returns the factor
// exp(old max - new max) that the head's partial sums of values are to be rescaled by.
float block_softmax(float* part, float* sc, int n) {
  float mx = part[0];
  for (int j = 0; j < n; ++j) mx = std::max(mx, sc[j]);
  for (int j = 0; j < n; ++j) sc[j] = k::exp_approx(sc[j] - mx);  // no sum here: vectorizes
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) sum += sc[j];
  const float r = k::exp_approx(part[0] - mx);  // the first block: exp(-inf) clamps to ~1e-38
  part[0] = mx;
  part[1] = part[1] * r + sum;
  return r;
}

// The m heads h of one group (the same values): each one's partial sums of values
// acc(i) = r[i] acc(i) + sum_j p(i)[j] v_j over the block's n positions (rows v + j ld).
template <int HS, typename T>
void block_values(const Heads& h, int m, const T* v, std::size_t ld, int n, int hs) {
#if TESSERA_KV_F16
  if constexpr (HS > 0 && HS % 32 == 0) {
    for (int i = 0; i < m; i += 3) {
      const int left = std::min(3, m - i);
      if (left == 3)
        values_m<HS, 3>(h.from(i), v, ld, n);
      else if (left == 2)
        values_m<HS, 2>(h.from(i), v, ld, n);
      else
        values_m<HS, 1>(h.from(i), v, ld, n);
    }
    return;
  }
#endif
  for (int i = 0; i < m; ++i) {
    float* acc = h.acc(i);
    for (int c = 0; c < hs; ++c) acc[c] *= h.r[i];
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < hs; ++c) acc[c] += h.p(i)[j] * value(v[j * ld + c]);
  }
}
}  // namespace

// Causal attention of the newest position (t) over the cache, split by positions: this thread's
// share of positions 0..t for every head gives its partials (max score m, sum of exp(s - m),
// sum of exp(s - m) v), which attend_combine merges. The share is read a block at a time (see
// k_att_block), the keys and values each as one stream. The shares are even, where a split by
// heads leaves 9 heads 5 and 4 and reads a group's rows on both threads.
template <int HS, typename T>
void Decoder::attend_share(const float* q, const T* kc, const T* vc, int t) {
  const auto& cfg = layout_.config();
  const int NH = cfg.n_head, hs = HS > 0 ? HS : cfg.head_dim(), group = NH / cfg.kv_heads();
  const std::size_t KVC = static_cast<std::size_t>(cfg.kv_heads()) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const auto [j0, j1] = team_share(t + 1);
  const auto i = static_cast<std::size_t>(omp_get_thread_num());
  const std::size_t stride = static_cast<std::size_t>(hs) + 2;
  float* part = part_.data() + i * NH * stride;
  float* sc = block_.data() + i * NH * (k_att_block + 1);  // the block's scores, then r per head
  float* r = sc + static_cast<std::size_t>(NH) * k_att_block;
  for (int h = 0; h < NH; ++h) {
    float* p = part + h * stride;
    p[0] = -INFINITY;
    std::fill(p + 1, p + stride, 0.0f);
  }
  for (int b0 = j0; b0 < j1; b0 += k_att_block) {
    const int n = std::min(k_att_block, j1 - b0), next = std::min(k_att_block, j1 - b0 - n);
    const std::size_t row = static_cast<std::size_t>(b0) * KVC;
    const Ahead ahead(kc + row + n * KVC, vc + row + n * KVC, next * KVC * sizeof(T), NH * (n / 8));
    for (int h = 0; h < NH; ++h) {
      const std::size_t kv_head = static_cast<std::size_t>(h / group) * hs;
      block_scores<HS>(sc + h * k_att_block, q + static_cast<std::size_t>(h) * hs,
                       kc + row + kv_head, KVC, n, hs, scale, ahead, h * (n / 8));
      r[h] = block_softmax(part + h * stride, sc + h * k_att_block, n);
    }
    for (int h0 = 0; h0 < NH; h0 += group)
      block_values<HS>(
          Heads{part + h0 * stride + 2, stride, sc + h0 * k_att_block, k_att_block, r + h0}, group,
          vc + row + static_cast<std::size_t>(h0 / group) * hs, KVC, n, hs);
  }
}

// attend_share with the head size known at compile time where it is a common one.
template <typename T>
void Decoder::attend(const float* q, const T* kc, const T* vc, int t) {
  const int hs = layout_.config().head_dim();
  if (hs == 64)
    attend_share<64>(q, kc, vc, t);
  else if (hs == 128)
    attend_share<128>(q, kc, vc, t);
  else
    attend_share<0>(q, kc, vc, t);
}

// out (NH * hs) = the team's partials merged: per head, each share's values weighted by
// exp(m_share - m) over the same-weighted sum of their exp sums (an empty share weighs 0).
void Decoder::attend_combine(float* out) const {
  const auto& cfg = layout_.config();
  const int NH = cfg.n_head, hs = cfg.head_dim(), nt = omp_get_num_threads();
  const std::size_t stride = static_cast<std::size_t>(NH) * (hs + 2);
  for (int h = 0; h < NH; ++h) {
    const float* p0 = part_.data() + static_cast<std::size_t>(h) * (hs + 2);
    float mx = -INFINITY;
    for (int i = 0; i < nt; ++i) mx = std::max(mx, p0[i * stride]);
    float* o = out + static_cast<std::size_t>(h) * hs;
    std::fill(o, o + hs, 0.0f);
    float sum = 0.0f;
    for (int i = 0; i < nt; ++i) {
      const float* p = p0 + i * stride;
      if (p[1] == 0.0f) continue;  // no positions
      const float w = k::exp_approx(p[0] - mx);
      sum += w * p[1];
      for (int c = 0; c < hs; ++c) o[c] += w * p[2 + c];
    }
    const float inv = 1.0f / sum;
    for (int c = 0; c < hs; ++c) o[c] *= inv;
  }
}

// Layer l at position t, by every thread of the team.
void Decoder::layer(int l, int t) {
  const auto& cfg = layout_.config();
  const int C = cfg.n_embd, F = cfg.ffn(), i = omp_get_thread_num();
  const std::size_t KVC = static_cast<std::size_t>(cfg.kv_heads()) * cfg.head_dim();
  const auto& w = layout_.layers[l];
  auto at = [this](std::size_t off) { return off == k_absent ? nullptr : params_ + off; };
  float* x = x_.data();
  float* ln = ln_.data() + static_cast<std::size_t>(i) * C;
  float* att = att_.data() + static_cast<std::size_t>(i) * C;
  norm_row(cfg, ln, x, at(w.ln1_w), at(w.ln1_b));
  linear(l, 0, qkv_.data(), ln, at(w.qkv_w), at(w.qkv_b), C, cfg.qkv_rows(), false);
  wait_for_attention(l, t);
  const float* q = query_and_cache(l, t);
  const std::size_t cache = static_cast<std::size_t>(l) * max_T_ * KVC;
  if (kv_ == KvCache::F16)
    attend(q, k_half_.data() + cache, v_half_.data() + cache, t);
  else
    attend(q, k_cache_.data() + cache, v_cache_.data() + cache, t);
  wait_for_attention(l, t);
  attend_combine(att);
  linear(l, 1, x, att, at(w.attproj_w), at(w.attproj_b), C, C, true);
  wait_for_team(l, 2);
  norm_row(cfg, ln, x, at(w.ln2_w), at(w.ln2_b));
  linear(l, 2, fch_.data(), ln, at(w.fc_w), at(w.fc_b), C, cfg.fc_rows(), false);
  // llama: the rows of gate and up this thread computed (no barrier after them); GPT-2: its share
  const TeamRows fc = linear_rows(cfg, 2, cfg.fc_rows());
  if (fc.barrier) wait_for_team(l, 3);
  const auto [f0, f1] = fc.barrier ? team_share(F) : fc.first;
  float* act = fch_.data();
  if (cfg.llama()) {
    k::swiglu_slice(act_.data() + f0, fch_.data() + f0, fch_.data() + F + f0, f1 - f0);
    act = act_.data();
  } else {
    k::gelu_slice(act + f0, act + f0, f1 - f0);
  }
  wait_for_team(l, 3);
  linear(l, 3, x, act, at(w.fcproj_w), at(w.fcproj_b), F, C, true);
}

int Decoder::share(int layer, int which, ByteSpan* out) const {
  const bool own = which == k_head_product ? !kernels_.head : !kernels_.linear;
  if (own) return fp32_share(layout_, params_, layer, which, out);
  return kernels_.share ? kernels_.share(layer, which, out) : 0;
}

// Before product `which` of `layer`, each thread that waits for the team fetches its share.
void Decoder::wait_for_team(int layer, int which) {
  wait_fetching(layer * 8 + which, [&](ByteSpan* out) { return share(layer, which, out); });
}

// Before the attention of layer l (and again before its o product), each thread that waits
// fetches the keys and values of its attention's positions, then its share of the o product.
void Decoder::wait_for_attention(int l, int t) {
  wait_fetching(l * 8 + k_head_product + 1, [&](ByteSpan* out) {  // after every product's key
    const int n = cache_share(l, t, out);
    return n + share(l, 1, out + n);
  });
}

// The cached keys and values (2 spans, or none) that this thread's attention at position t of
// layer l reads, as attend_share shares the positions, but t itself (written after this).
int Decoder::cache_share(int l, int t, ByteSpan* out) const {
  const auto& cfg = layout_.config();
  const std::size_t KVC = static_cast<std::size_t>(cfg.kv_heads()) * cfg.head_dim();
  const std::size_t elem = kv_ == KvCache::F16 ? sizeof(std::uint16_t) : sizeof(float);
  const auto [j0, j_end] = team_share(t + 1);
  const int j1 = std::min(j_end, t);
  if (j1 <= j0) return 0;
  const std::size_t row = (static_cast<std::size_t>(l) * max_T_ + j0) * KVC * elem;
  const std::size_t bytes = static_cast<std::size_t>(j1 - j0) * KVC * elem;
  const bool half = kv_ == KvCache::F16;
  const void* k = half ? static_cast<const void*>(k_half_.data()) : k_cache_.data();
  const void* v = half ? static_cast<const void*>(v_half_.data()) : v_cache_.data();
  out[0] = {static_cast<const char*>(k) + row, bytes};
  out[1] = {static_cast<const char*>(v) + row, bytes};
  return 2;
}

// The team's barrier, each waiting thread fetching the spans plan(out) gives (kept from one
// barrier to the next while `key` stays the same, so that the fetch goes on where it stopped).
template <typename Plan>
void Decoder::wait_fetching(int key, Plan&& plan) {
  Lookahead& a = ahead_[static_cast<std::size_t>(omp_get_thread_num())];
  if (a.key != key) {
    a.key = key;
    a.span = 0;
    a.at = 0;
    a.spans = plan(a.span_of);
  }
  team_.wait(omp_get_num_threads(), [&a] { return a.fetch_line(); });
}

bool Decoder::Lookahead::fetch_line() {
  if (span == spans) return false;
  const ByteSpan& s = span_of[span];
  __builtin_prefetch(static_cast<const char*>(s.data) + at, 0, 3);  // for reading, into L1
  at += 64;
  if (at >= s.bytes) {
    ++span;
    at = 0;
  }
  return true;
}

void Decoder::check_token(std::int32_t token) const {
  const auto& cfg = layout_.config();
  if (token < 0 || token >= cfg.vocab_size)
    throw Error(fmt::format("token id {} is outside the vocabulary of {}", token, cfg.vocab_size));
}

void Decoder::embed(std::int32_t token, int t, float* x) const {
  const int C = layout_.config().n_embd;
  const float* P = params_;
  if (kernels_.embed) {
    kernels_.embed(token, x);
  } else {
    const float* e = P + layout_.wte + static_cast<std::size_t>(token) * C;
    std::copy(e, e + C, x);
  }
  if (layout_.wpe != k_absent)
    for (int c = 0; c < C; ++c) x[c] += P[layout_.wpe + static_cast<std::size_t>(t) * C + c];
}

void Decoder::size_team_buffers() {
  const auto& cfg = layout_.config();
  const std::size_t C = cfg.n_embd;
  const auto team = static_cast<std::size_t>(omp_get_max_threads());  // a region's is not larger
  if (ahead_.size() < team) ahead_.resize(team);
  if (ln_.size() < team * C) {
    ln_.resize(team * C);
    att_.resize(team * C);
    q_.resize(team * cfg.n_head * cfg.head_dim());
    part_.resize(team * cfg.n_head * (cfg.head_dim() + 2));
    block_.resize(team * cfg.n_head * (k_att_block + 1));
  }
}

// By every thread of the team.
void Decoder::logits_of_x() {
  const auto& cfg = layout_.config();
  const int C = cfg.n_embd;
  const float* P = params_;
  float* ln = ln_.data() + static_cast<std::size_t>(omp_get_thread_num()) * C;
  norm_row(cfg, ln, x_.data(), P + layout_.lnf_w,
           layout_.lnf_b == k_absent ? nullptr : P + layout_.lnf_b);
  if (kernels_.head)
    kernels_.head(logits_.data(), ln);
  else
    team_linear(gemm_, logits_.data(), ln, P + layout_.head, nullptr, C, false,
                team_rows(cfg.padded_vocab()));
}

const float* Decoder::step(std::int32_t token, bool want_logits) {
  const auto& cfg = layout_.config();
  if (pos_ >= max_T_)
    throw Error(fmt::format("the context is full ({} tokens)", max_T_), "generate fewer tokens");
  check_token(token);
  const int t = pos_;
  embed(token, t, x_.data());
  if (cfg.llama()) k::rope_table(cos_.data(), sin_.data(), 1, cfg.head_dim(), inv_freq_.data(), t);
  size_team_buffers();
  team_.reset();
  // Each product's wait for the team has its waiting threads fetch their share of the next:
  // the next layer's qkv, the head, and at the end the next step's first product.
#pragma omp parallel
  {
    for (int l = 0; l < cfg.n_layer; ++l) {
      layer(l, t);
      if (l + 1 < cfg.n_layer)
        wait_for_team(l + 1, 0);
      else if (want_logits)
        wait_for_team(0, k_head_product);
    }
    if (want_logits) logits_of_x();
    wait_for_team(0, 0);
  }
  ++pos_;
  return want_logits ? logits_.data() : nullptr;
}

namespace {
// The block's op table for a chunk of a prompt fed to the decoder: RoutedOps (the linears, fp32 or
// packed) with the rotation at the chunk's positions (pos0 on) and the attention given by the
// decoder (over its cache, the chunk's keys and values written into it first).
class PrefillOps : public RoutedOps {
 public:
  using Attend = std::function<void(float* out, float* lse, const float* qkv, int T)>;
  PrefillOps(kernels::GemmLibrary lib, const BlockLinear& fn, int layer,
             const BlockWeights<float>& w, int pos0, const Attend& attend)
      : RoutedOps(lib, fn, layer, w), pos0_(pos0), attend_(attend) {}
  void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, const double* inv_freq) {
    k::rope_forward(qkv, B, T, NH, KV, hs, inv_freq, pos0_);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int /*B = 1*/, int T, int /*NH*/,
                         int /*KV*/, int /*hs*/) {
    attend_(out, lse, qkv, T);
  }

 private:
  int pos0_;
  const Attend& attend_;
};

#if TESSERA_KV_F16
// out (n) = in (fp16) as fp32.
void from_half(float* out, const std::uint16_t* in, std::size_t n) {
  std::size_t c = 0;
  for (; c + 8 <= n; c += 8) _mm256_storeu_ps(out + c, load_half8(in + c));
  for (; c < n; ++c) out[c] = half_to_float(in[c]);
}
#else
void from_half(float*, const std::uint16_t*, std::size_t) {}
#endif
}  // namespace

// The m rows of qkv (positions p .. p + m - 1 of layer l): their keys and values into the cache,
// then their attention over the cache's positions 0 .. p + m - 1 (the fp16 cache read back as
// fp32, so each step after reads the same rounded values).
void Decoder::attend_chunk(int l, int p, float* out, float* lse, const float* qkv, int m) {
  const auto& cfg = layout_.config();
  const int NH = cfg.n_head, KV = cfg.kv_heads(), hs = cfg.head_dim();
  const std::size_t W = cfg.qkv_rows(), QC = static_cast<std::size_t>(NH) * hs;
  const std::size_t KVC = static_cast<std::size_t>(KV) * hs;
  const std::size_t layer = static_cast<std::size_t>(l) * max_T_ * KVC;
  for (int i = 0; i < m; ++i) keep_kv(l, p + i, qkv + i * W + QC);  // (llama: k rotated)
  const std::size_t seen = (static_cast<std::size_t>(p) + m) * KVC;
  const float *kc = nullptr, *vc = nullptr;  // (the other cache's buffers are empty)
  std::vector<float> wide;
  if (kv_ == KvCache::F16) {
    wide.resize(2 * seen);
    from_half(wide.data(), k_half_.data() + layer, seen);
    from_half(wide.data() + seen, v_half_.data() + layer, seen);
    kc = wide.data();
    vc = wide.data() + seen;
  } else {
    kc = k_cache_.data() + layer;
    vc = v_cache_.data() + layer;
  }
  k::attention_rows(gemm_, out, lse, qkv, static_cast<std::int64_t>(W), kc, vc,
                    static_cast<std::int64_t>(KVC), m, p, NH, KV, hs);
}

const float* Decoder::prefill(const std::int32_t* tokens, int n, bool want_logits) {
  const auto& cfg = layout_.config();
  TESSERA_CHECK(n >= 0, "prefill of {} tokens", n);
  if (n == 0) return nullptr;
  if (n > max_T_ - pos_)
    throw Error(
        fmt::format("{} more tokens do not fit the context of {} ({} held)", n, max_T_, pos_),
        "give fewer tokens");
  for (int i = 0; i < n; ++i) check_token(tokens[i]);
  if (n == 1 || (kernels_.linear && !kernels_.matmul)) {
    const float* logits = nullptr;
    for (int i = 0; i < n; ++i) logits = step(tokens[i], want_logits && i + 1 == n);
    return logits;
  }
  // In chunks of at most k_prefill_rows tokens: one block's activations for them, and each
  // thread's scores of a head (chunk x positions so far), stay tens of MB at 8192 positions.
  const std::size_t C = cfg.n_embd;
  const int rows = std::min(n, k_prefill_rows);
  const BlockActOffsets offsets(cfg, static_cast<std::size_t>(rows));
  Buffer<float> x(rows * C), acts(offsets.end);
  for (int done = 0; done < n; done += rows) {
    const int p = pos_, m = std::min(rows, n - done);
    for (int i = 0; i < m; ++i) embed(tokens[done + i], p + i, x.data() + i * C);
    const BlockActs<float> a = BlockActOffsets(cfg, static_cast<std::size_t>(m)).view(acts.data());
    const BlockShape shape = block_shape(cfg, 1, m);
    for (int l = 0; l < cfg.n_layer; ++l) {
      const auto& lo = layout_.layers[l];
      const auto w = block_weights(lo, params_ + lo.begin);
      const PrefillOps::Attend attend = [this, l, p](float* out, float* lse, const float* qkv,
                                                     int T) {
        attend_chunk(l, p, out, lse, qkv, T);
      };
      PrefillOps ops(gemm_, kernels_.matmul, l, w, p, attend);
      block_forward(ops, w, a, x.data(), shape);
      std::copy(a.res3, a.res3 + m * C, x.data());
    }
    pos_ = p + m;
    if (done + m == n) std::copy(x.data() + (m - 1) * C, x.data() + m * C, x_.data());
  }
  if (!want_logits) return nullptr;
  size_team_buffers();
#pragma omp parallel
  logits_of_x();
  return logits_.data();
}

}  // namespace tessera::model
