#include "tessera/quant/runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/ops.hpp"

namespace tessera::quant {

void require_gpt2(const model::ModelConfig& cfg) {
  if (cfg.llama())
    throw Error("quantization covers the gpt2 family so far; this model is a llama",
                "quantize a gpt2 model; the llama sites (q/k/v, o, gate/up, down) are not mapped "
                "yet");
}

namespace k = kernels::cpu;

const char* lin_hf_name(Lin kind) {
  switch (kind) {
    case Lin::Qkv:
      return "attn.c_attn";
    case Lin::AttnProj:
      return "attn.c_proj";
    case Lin::Fc:
      return "mlp.c_fc";
    case Lin::FcProj:
      return "mlp.c_proj";
  }
  return "?";
}

std::string linear_name(int layer, Lin kind) {
  return fmt::format("h.{}.{}", layer, lin_hf_name(kind));
}

int lin_rows(const model::ModelConfig& cfg, Lin kind) {
  const int C = cfg.n_embd;
  switch (kind) {
    case Lin::Qkv:
      return 3 * C;
    case Lin::AttnProj:
      return C;
    case Lin::Fc:
      return 4 * C;
    case Lin::FcProj:
      return C;
  }
  return 0;
}

int lin_cols(const model::ModelConfig& cfg, Lin kind) {
  return kind == Lin::FcProj ? 4 * cfg.n_embd : cfg.n_embd;
}

std::size_t lin_weight_offset(const model::ParamLayout& layout, int layer, Lin kind) {
  const auto& w = layout.layers[layer];
  switch (kind) {
    case Lin::Qkv:
      return w.qkv_w;
    case Lin::AttnProj:
      return w.attproj_w;
    case Lin::Fc:
      return w.fc_w;
    case Lin::FcProj:
      return w.fcproj_w;
  }
  return 0;
}

std::size_t lin_bias_offset(const model::ParamLayout& layout, int layer, Lin kind) {
  const auto& w = layout.layers[layer];
  switch (kind) {
    case Lin::Qkv:
      return w.qkv_b;
    case Lin::AttnProj:
      return w.attproj_b;
    case Lin::Fc:
      return w.fc_b;
    case Lin::FcProj:
      return w.fcproj_b;
  }
  return 0;
}

const char* act_mode_name(ActMode m) {
  switch (m) {
    case ActMode::None:
      return "none";
    case ActMode::PerToken:
      return "per-token";
    case ActMode::PerTensor:
      return "per-tensor";
    case ActMode::Int8Mixed:
      return "int8-mixed";
  }
  return "?";
}

ActMode parse_act_mode(const std::string& s) {
  if (s == "none") return ActMode::None;
  if (s == "per-token") return ActMode::PerToken;
  if (s == "per-tensor") return ActMode::PerTensor;
  if (s == "int8-mixed") return ActMode::Int8Mixed;
  throw Error(fmt::format("unknown activation quantization '{}'", s),
              "use none, per-token, per-tensor or int8-mixed");
}

namespace {
inline void quant_row(float* x, int n, float absmax) {
  if (absmax <= 0.0f) return;
  const float s = absmax / 127.0f, inv = 1.0f / s;
  for (int c = 0; c < n; ++c) x[c] = std::nearbyint(x[c] * inv) * s;
}
}  // namespace

void fake_quant_activations(const ActQuant& aq, float* x, std::int64_t N, int cols) {
  switch (aq.mode) {
    case ActMode::None:
      return;
    case ActMode::PerToken: {
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < N; ++i) {
        float* r = x + i * cols;
        float m = 0.0f;
        for (int c = 0; c < cols; ++c) m = std::max(m, std::fabs(r[c]));
        quant_row(r, cols, m);
      }
      return;
    }
    case ActMode::PerTensor: {
      float m = 0.0f;
      for (std::int64_t i = 0; i < N * cols; ++i) m = std::max(m, std::fabs(x[i]));
      if (m <= 0.0f) return;
      const float s = m / 127.0f, inv = 1.0f / s;
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < N * cols; ++i) x[i] = std::nearbyint(x[i] * inv) * s;
      return;
    }
    case ActMode::Int8Mixed: {
      // Outlier columns: some |x| >= threshold in this input (LLM.int8(), section 1.5).
      std::vector<char> outlier(cols, 0);
      for (std::int64_t i = 0; i < N; ++i) {
        const float* r = x + i * cols;
        for (int c = 0; c < cols; ++c)
          if (std::fabs(r[c]) >= aq.threshold) outlier[c] = 1;
      }
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < N; ++i) {
        float* r = x + i * cols;
        float m = 0.0f;
        for (int c = 0; c < cols; ++c)
          if (!outlier[c]) m = std::max(m, std::fabs(r[c]));
        if (m <= 0.0f) continue;
        const float s = m / 127.0f, inv = 1.0f / s;
        for (int c = 0; c < cols; ++c)
          if (!outlier[c]) r[c] = std::nearbyint(r[c] * inv) * s;
      }
      return;
    }
  }
}

void Runner::ensure(std::int64_t N) {
  if (N <= cap_) return;
  const auto& cfg = layout_.config();
  const std::size_t C = cfg.n_embd;
  cap_ = N;
  ln_.resize(N * C);
  qkv_.resize(N * 3 * C);
  att_.resize(N * C);
  lse_.resize(N * cfg.n_head);
  fch_.resize(N * 4 * C);
  tmp_.resize(N * 4 * C);
  x_.resize(N * C);
}

void Runner::embed(const float* params, const std::int32_t* tokens, int B, int T, float* x) {
  const auto& cfg = layout_.config();
  if (T > cfg.block_size)
    throw Error(
        fmt::format("sequence length {} exceeds the model's block_size {}", T, cfg.block_size));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(B) * T; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg.vocab_size)
      throw Error(fmt::format("token id {} is outside the model's vocabulary of {}", tokens[i],
                              cfg.vocab_size));
  k::embedding_forward(x, tokens, params + layout_.wte, params + layout_.wpe, B, T, cfg.n_embd);
}

void Runner::block(const float* P, int l, float* x, int B, int T, const Hooks& hooks) {
  const auto& cfg = layout_.config();
  const int C = cfg.n_embd, NH = cfg.n_head;
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  ensure(N);
  const auto& w = layout_.layers[l];
  auto linear_in = [&](Lin kind, float* in, int cols) -> const float* {
    if (hooks.capture) hooks.capture(l, kind, in, N, cols);
    if (hooks.stop_after == static_cast<int>(kind)) return nullptr;
    if (hooks.act.mode == ActMode::None) return in;
    std::memcpy(tmp_.data(), in, sizeof(float) * N * cols);
    fake_quant_activations(hooks.act, tmp_.data(), N, cols);
    return tmp_.data();
  };
  std::vector<float> mean(N), rstd(N);
  k::layernorm_forward(ln_.data(), mean.data(), rstd.data(), x, P + w.ln1_w, P + w.ln1_b, N, C);
  const float* in = linear_in(Lin::Qkv, ln_.data(), C);
  if (!in) return;
  k::linear_forward(gemm_, qkv_.data(), in, P + w.qkv_w, P + w.qkv_b, N, C, 3 * C);
  k::attention_forward(gemm_, att_.data(), lse_.data(), qkv_.data(), B, T, NH, NH, C / NH);
  in = linear_in(Lin::AttnProj, att_.data(), C);
  if (!in) return;
  k::linear_forward(gemm_, x, in, P + w.attproj_w, P + w.attproj_b, N, C, C, true);
  k::layernorm_forward(ln_.data(), mean.data(), rstd.data(), x, P + w.ln2_w, P + w.ln2_b, N, C);
  in = linear_in(Lin::Fc, ln_.data(), C);
  if (!in) return;
  k::linear_forward(gemm_, fch_.data(), in, P + w.fc_w, P + w.fc_b, N, C, 4 * C);
  k::gelu_forward(fch_.data(), fch_.data(), N * 4 * C);
  in = linear_in(Lin::FcProj, fch_.data(), 4 * C);
  if (!in) return;
  k::linear_forward(gemm_, x, in, P + w.fcproj_w, P + w.fcproj_b, N, 4 * C, C, true);
  if (hooks.residual) hooks.residual(l, x, N, C);
}

void Runner::head(const float* P, const float* x, std::int64_t N, float* logits) {
  const auto& cfg = layout_.config();
  const int C = cfg.n_embd;
  ensure(N);
  std::vector<float> mean(N), rstd(N);
  k::layernorm_forward(ln_.data(), mean.data(), rstd.data(), x, P + layout_.lnf_w,
                       P + layout_.lnf_b, N, C);
  k::linear_forward(gemm_, logits, ln_.data(), P + layout_.wte, nullptr, N, C, cfg.padded_vocab());
}

void Runner::logits(const float* P, const std::int32_t* tokens, int B, int T, float* logits,
                    const Hooks& hooks) {
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  ensure(N);
  embed(P, tokens, B, T, x_.data());
  for (int l = 0; l < layout_.config().n_layer; ++l) block(P, l, x_.data(), B, T, hooks);
  head(P, x_.data(), N, logits);
}

}  // namespace tessera::quant
