#include "tessera/model/gpt.hpp"

#include <omp.h>

#include <chrono>
#include <cmath>

#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/cpu/vec_math.hpp"
#include "tessera/model/gpt_block.hpp"

namespace tessera::model {

namespace k = kernels::cpu;

namespace {

// The op table of model/gpt_block.hpp on the CPU kernels (fp32; the residual add is a copy and an
// accumulating GEMM, the GELU a kernel of its own).
class CpuOps {
 public:
  using A = float;
  using W = float;
  CpuOps(kernels::GemmLibrary lib, kernels::Profile* profile, ParamStore* store = nullptr)
      : lib_(lib), profile_(profile), store_(store) {}
  ~CpuOps() { finish(); }

  void mark(kernels::OpFamily f) {
    if (!profile_) return;
    finish();
    current_ = f;
    t0_ = std::chrono::steady_clock::now();
  }
  void finish() {
    if (!profile_ || current_ == kernels::OpFamily::Count) return;
    (*profile_)[current_] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    current_ = kernels::OpFamily::Count;
  }
  void progress() {
    if (store_) store_->progress();
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, std::int64_t N, int C) {
    k::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* /*dinp_a: dinp itself*/, float* dw, float* db,
                          const float* dout, const float* inp, const float* w, const float* mean,
                          const float* rstd, std::int64_t N, int C) {
    k::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void linear(float* out, const float* inp, const float* w, const float* b, std::int64_t N, int IC,
              int OC) {
    k::linear_forward(lib_, out, inp, w, b, N, IC, OC);
  }
  void linear_residual(float* out, const float* residual, const float* inp, const float* w,
                       const float* b, std::int64_t N, int IC, int OC) {
    k::copy(out, residual, N * OC);
    k::linear_forward(lib_, out, inp, w, b, N, IC, OC, true);
  }
  void linear_gelu(float* out, float* pre, const float* inp, const float* w, const float* b,
                   std::int64_t N, int IC, int OC) {
    k::linear_forward(lib_, pre, inp, w, b, N, IC, OC);
    k::gelu_forward(out, pre, N * OC);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, std::int64_t N, int IC, int OC) {
    k::linear_backward(lib_, dinp, dw, db, dout, inp, w, N, IC, OC);
  }
  void linear_backward_input_dgelu(float* dinp, const float* dout, const float* w, const float* pre,
                                   std::int64_t N, int IC, int OC) {
    k::linear_backward_input(lib_, dinp, dout, w, N, IC, OC);
    k::gelu_backward(dinp, pre, dinp, N * IC);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    k::attention_forward(lib_, out, lse, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int C, int NH) {
    k::attention_backward(lib_, dqkv, dout, qkv, out, lse, B, T, C, NH);
  }

 private:
  kernels::GemmLibrary lib_;
  kernels::Profile* profile_;
  ParamStore* store_;
  kernels::OpFamily current_ = kernels::OpFamily::Count;
  std::chrono::steady_clock::time_point t0_;
};

// A layer's parameters (a block from the store, laid out from `w.begin`) and activations.
BlockWeights<float> block_weights(const LayerOffsets& w, const float* blk) {
  auto P = [&](std::size_t off) { return blk + (off - w.begin); };
  return {P(w.ln1_w), P(w.ln1_b), P(w.qkv_w), P(w.qkv_b), P(w.attproj_w), P(w.attproj_b),
          P(w.ln2_w), P(w.ln2_b), P(w.fc_w),  P(w.fc_b),  P(w.fcproj_w),  P(w.fcproj_b)};
}
BlockGrads block_grads(const LayerOffsets& w, float* gblk) {
  auto G = [&](std::size_t off) { return gblk + (off - w.begin); };
  return {G(w.ln1_w), G(w.ln1_b), G(w.qkv_w), G(w.qkv_b), G(w.attproj_w), G(w.attproj_b),
          G(w.ln2_w), G(w.ln2_b), G(w.fc_w),  G(w.fc_b),  G(w.fcproj_w),  G(w.fcproj_b)};
}
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
    if (ends_with("ln_1.weight") || ends_with("ln_2.weight") || ends_with("ln_f.weight")) {
      std::fill(p, p + t.numel, 1.0f);
      continue;
    }
    if (ends_with(".bias")) continue;  // zeros
    float stdev =
        (ends_with("attn.c_proj.weight") || ends_with("mlp.c_proj.weight")) ? std_resid : std_base;
    std::size_t n_init = t.numel;
    if (n == "wte.weight")
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
  const std::size_t Vp = cfg.padded_vocab();
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
    l.qkv = take(N * 3 * C);
    l.atty = take(N * C);
    l.att_lse = take(N * NH);
    l.res2 = take(N * C);
    l.ln2 = take(N * C);
    l.ln2_mean = take(N);
    l.ln2_rstd = take(N);
    l.fch = take(N * 4 * C);
    l.fch_gelu = take(N * 4 * C);
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
  d_qkv = take(N * 3 * C);
  d_fch = take(N * 4 * C);
  buf.resize(off);
}

float forward(const ParamLayout& layout, ParamStore& store, Activations& a,
              const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
              const ForwardOptions& opt) {
  const auto& cfg = layout.config();
  if (T > cfg.block_size)
    throw Error(
        fmt::format("sequence length {} exceeds the model's block_size {}", T, cfg.block_size));
  a.allocate(cfg, B, T);
  const int C = cfg.n_embd, NH = cfg.n_head, V = cfg.vocab_size, Vp = cfg.padded_vocab();
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  const auto lib = opt.gemm;
  kernels::Profile* const PROF = opt.profile;
  store.begin_forward();
  // Block pointers: the store decides where each block's parameters are (flat buffer, gathered
  // shard, ...); offsets in the layout are made relative to the block's start.
  const float* E = store.params(0);
  auto PE = [&](std::size_t off) { return E + off; };
  for (std::int64_t i = 0; i < N; ++i)
    if (inputs[i] < 0 || inputs[i] >= V)
      throw Error(
          fmt::format("input token id {} is outside the model's vocabulary of {}", inputs[i], V),
          "the data was tokenized with a larger vocabulary than model.vocab_size");

  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::Embedding);
    k::embedding_forward(a.at(a.encoded), inputs, PE(layout.wte), PE(layout.wpe), B, T, C);
  }
  const float* residual = a.at(a.encoded);
  const BlockShape shape{B, T, C, NH};
  for (int l = 0; l < cfg.n_layer; ++l) {
    CpuOps ops(lib, PROF);
    block_forward(ops, block_weights(layout.layers[l], store.params(l + 1)), block_acts(a, l),
                  residual, shape);
    residual = a.at(a.layers[l].res3);
    store.release(l + 1);
  }
  const float* F = store.params(cfg.n_layer + 1);
  auto PF = [&](std::size_t off) { return F + (off - layout.lnf_w); };
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::LayerNorm);
    k::layernorm_forward(a.at(a.lnf), a.at(a.lnf_mean), a.at(a.lnf_rstd), residual,
                         PF(layout.lnf_w), PF(layout.lnf_b), N, C);
  }
  // LM head tied to the token embedding: logits (N,Vp) = lnf (N,C) @ wte^T (C,Vp)
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::Gemm);
    k::linear_forward(lib, a.at(a.logits), a.at(a.lnf), PE(layout.wte), nullptr, N, C, Vp);
  }
  store.release(cfg.n_layer + 1);
  if (!targets) return 0.0f;
  for (std::int64_t i = 0; i < N; ++i)
    if (targets[i] >= V || targets[i] < -1)  // -1: an ignored target (Goldfish)
      throw Error(
          fmt::format("target token id {} is outside the model's vocabulary of {}", targets[i], V),
          "the data was tokenized with a larger vocabulary than model.vocab_size");
  if (opt.training) {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::CrossEntropy);
    k::cross_entropy_forward_backward(a.at(a.losses), a.at(a.logits), targets, N, V, Vp, opt.dloss);
  } else {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::CrossEntropy);
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

void backward(const ParamLayout& layout, ParamStore& store, Activations& a,
              const std::int32_t* inputs, int B, int T, kernels::GemmLibrary lib,
              kernels::Profile* PROF) {
  const auto& cfg = layout.config();
  TESSERA_CHECK(a.B == B && a.T == T,
                "backward() needs the forward() activations of the same batch");
  const int C = cfg.n_embd, NH = cfg.n_head, Vp = cfg.padded_vocab();
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  store.begin_backward();
  const float* E = store.params(0);
  float* GEb = store.grads(0);
  auto PE = [&](std::size_t off) { return E + off; };
  auto GE = [&](std::size_t off) { return GEb + off; };
  const int LB = cfg.n_layer + 1;  // the final LayerNorm's block
  const float* F = store.params(LB);
  float* GFb = store.grads(LB);
  auto PF = [&](std::size_t off) { return F + (off - layout.lnf_w); };
  auto GF = [&](std::size_t off) { return GFb + (off - layout.lnf_w); };
  float* d_res = a.at(a.d_res);
  float* d_ln = a.at(a.d_ln);

  // LM head: logits now hold dlogits (N,Vp)
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::Gemm);
    k::linear_backward(lib, d_ln, GE(layout.wte), nullptr, a.at(a.logits), a.at(a.lnf),
                       PE(layout.wte), N, C, Vp);
  }
  std::fill(d_res, d_res + N * C, 0.0f);
  const float* last = cfg.n_layer > 0 ? a.at(a.layers.back().res3) : a.at(a.encoded);
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::LayerNorm);
    k::layernorm_backward(d_res, GF(layout.lnf_w), GF(layout.lnf_b), d_ln, last, PF(layout.lnf_w),
                          a.at(a.lnf_mean), a.at(a.lnf_rstd), N, C);
  }

  store.grads_done(LB);  // ln_f
  store.release(LB);
  const BlockShape shape{B, T, C, NH};
  const BlockScratch<float> scratch{d_res,          d_res,         d_ln,
                                    a.at(a.d_atty), a.at(a.d_qkv), a.at(a.d_fch)};
  for (int l = cfg.n_layer - 1; l >= 0; --l) {
    const float* x = l == 0 ? a.at(a.encoded) : a.at(a.layers[l - 1].res3);
    CpuOps ops(lib, PROF, &store);
    block_backward(ops, block_weights(layout.layers[l], store.params(l + 1)),
                   block_grads(layout.layers[l], store.grads(l + 1)), block_acts(a, l), scratch, x,
                   shape);
    store.grads_done(l + 1);  // this layer's gradients are final
    store.release(l + 1);
  }
  {
    kernels::ProfileScope ps_(PROF, kernels::OpFamily::Embedding);
    k::embedding_backward(GE(layout.wte), GE(layout.wpe), d_res, inputs, B, T, C);
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
              kernels::Profile* profile, const BackwardHooks* hooks) {
  FlatStore store(layout, params, grads, hooks);
  backward(layout, store, acts, inputs, B, T, gemm, profile);
}

// ---------------------------------------------------------------- decoding
Decoder::Decoder(const ParamLayout& layout, const float* params, int max_T,
                 kernels::GemmLibrary gemm)
    : layout_(layout), params_(params), max_T_(max_T), gemm_(gemm) {
  const auto& cfg = layout.config();
  if (max_T > cfg.block_size)
    throw Error(
        fmt::format("decoding length {} exceeds the model's block_size {}", max_T, cfg.block_size));
  const std::size_t C = cfg.n_embd;
  k_cache_.resize(static_cast<std::size_t>(cfg.n_layer) * max_T * C);
  v_cache_.resize(static_cast<std::size_t>(cfg.n_layer) * max_T * C);
  x_.resize(C);
  ln_.resize(C);
  qkv_.resize(3 * C);
  att_.resize(C);
  fch_.resize(4 * C);
  logits_.resize(cfg.padded_vocab());
  scores_.resize(max_T);
}

const float* Decoder::step(std::int32_t token, bool want_logits) {
  const auto& cfg = layout_.config();
  if (pos_ >= max_T_)
    throw Error(fmt::format("the context is full ({} tokens)", max_T_), "generate fewer tokens");
  if (token < 0 || token >= cfg.vocab_size)
    throw Error(fmt::format("token id {} is outside the vocabulary of {}", token, cfg.vocab_size));
  const int C = cfg.n_embd, NH = cfg.n_head, hs = cfg.head_dim(), t = pos_;
  const float* P = params_;
  float* x = x_.data();
  float mean, rstd;
  const float* e = P + layout_.wte + static_cast<std::size_t>(token) * C;
  const float* p = P + layout_.wpe + static_cast<std::size_t>(t) * C;
  for (int c = 0; c < C; ++c) x[c] = e[c] + p[c];
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int l = 0; l < cfg.n_layer; ++l) {
    const auto& w = layout_.layers[l];
    k::layernorm_forward(ln_.data(), &mean, &rstd, x, P + w.ln1_w, P + w.ln1_b, 1, C);
    k::linear_forward(gemm_, qkv_.data(), ln_.data(), P + w.qkv_w, P + w.qkv_b, 1, C, 3 * C);
    float* kc = k_cache_.data() + static_cast<std::size_t>(l) * max_T_ * C;
    float* vc = v_cache_.data() + static_cast<std::size_t>(l) * max_T_ * C;
    std::copy(qkv_.data() + C, qkv_.data() + 2 * C, kc + static_cast<std::size_t>(t) * C);
    std::copy(qkv_.data() + 2 * C, qkv_.data() + 3 * C, vc + static_cast<std::size_t>(t) * C);
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv_.data() + h * hs;
      float* sc = scores_.data();
      float mx = -INFINITY;
      for (int j = 0; j <= t; ++j) {
        const float* kj = kc + static_cast<std::size_t>(j) * C + h * hs;
        float s = 0.0f;
        for (int c = 0; c < hs; ++c) s += q[c] * kj[c];
        sc[j] = s * scale;
        mx = std::max(mx, sc[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j <= t; ++j) {
        sc[j] = k::exp_approx(sc[j] - mx);
        sum += sc[j];
      }
      float* o = att_.data() + h * hs;
      std::fill(o, o + hs, 0.0f);
      for (int j = 0; j <= t; ++j) {
        const float* vj = vc + static_cast<std::size_t>(j) * C + h * hs;
        float pj = sc[j] / sum;
        for (int c = 0; c < hs; ++c) o[c] += pj * vj[c];
      }
    }
    k::linear_forward(gemm_, x, att_.data(), P + w.attproj_w, P + w.attproj_b, 1, C, C, true);
    k::layernorm_forward(ln_.data(), &mean, &rstd, x, P + w.ln2_w, P + w.ln2_b, 1, C);
    k::linear_forward(gemm_, fch_.data(), ln_.data(), P + w.fc_w, P + w.fc_b, 1, C, 4 * C);
    k::gelu_forward(fch_.data(), fch_.data(), 4 * C);
    k::linear_forward(gemm_, x, fch_.data(), P + w.fcproj_w, P + w.fcproj_b, 1, 4 * C, C, true);
  }
  ++pos_;
  if (!want_logits) return nullptr;
  k::layernorm_forward(ln_.data(), &mean, &rstd, x, P + layout_.lnf_w, P + layout_.lnf_b, 1, C);
  k::linear_forward(gemm_, logits_.data(), ln_.data(), P + layout_.wte, nullptr, 1, C,
                    cfg.padded_vocab());
  return logits_.data();
}

}  // namespace tessera::model
