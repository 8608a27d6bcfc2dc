#include "tessera/quant/runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/model/cpu_ops.hpp"

namespace tessera::quant {

namespace k = kernels::cpu;

const char* lin_hf_name(const model::ModelConfig& cfg, Lin kind) {
  static constexpr const char* gpt2[k_num_lin] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                  "mlp.c_proj"};
  static constexpr const char* llama[k_num_lin] = {"self_attn.qkv_proj", "self_attn.o_proj",
                                                   "mlp.gate_up_proj", "mlp.down_proj"};
  return (cfg.llama() ? llama : gpt2)[static_cast<int>(kind)];
}

std::string linear_name(const model::ModelConfig& cfg, int layer, Lin kind) {
  return cfg.llama() ? fmt::format("model.layers.{}.{}", layer, lin_hf_name(cfg, kind))
                     : fmt::format("h.{}.{}", layer, lin_hf_name(cfg, kind));
}

int lin_rows(const model::ModelConfig& cfg, Lin kind) {
  return model::block_linear_shape(cfg, static_cast<int>(kind)).rows;
}

int lin_cols(const model::ModelConfig& cfg, Lin kind) {
  return model::block_linear_shape(cfg, static_cast<int>(kind)).cols;
}

std::size_t lin_weight_offset(const model::ParamLayout& layout, int layer, Lin kind) {
  return model::block_linear_weight(layout, layer, static_cast<int>(kind));
}

bool is_linear_weight(const model::ParamTensor& t) {
  return t.layer >= 0 && t.shape.size() == 2;
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

namespace {

// Thrown by HookedOps after the input of Hooks::stop_after was captured; Runner::block catches
// it, leaving the residual stream it was given untouched.
struct StopBlock {};

// The block's op table with the runner's hooks in front of every linear (RoutedOps numbers the
// linears as Lin does): it hands the input to the capture hook, stops the block where asked and
// applies the simulated activation quantization to a copy of the input.
static_assert(static_cast<int>(Lin::Qkv) == 0 && static_cast<int>(Lin::FcProj) == 3);
class HookedOps : public model::RoutedOps {
 public:
  HookedOps(kernels::GemmLibrary lib, const Hooks& hooks, const model::BlockLinear& linear,
            int layer, const model::BlockWeights<float>& w, float* scratch)
      : RoutedOps(lib, linear, layer, w), hooks_(hooks), scratch_(scratch) {}

 protected:
  const float* input(int site, const float* x, std::int64_t N, int cols) override {
    const auto kind = static_cast<Lin>(site);
    if (hooks_.capture) hooks_.capture(layer(), kind, x, N, cols);
    if (hooks_.stop_after == site) throw StopBlock{};
    if (hooks_.act.mode == ActMode::None) return x;
    std::memcpy(scratch_, x, sizeof(float) * N * cols);
    fake_quant_activations(hooks_.act, scratch_, N, cols);
    return scratch_;
  }

 private:
  const Hooks& hooks_;
  float* scratch_;  // (N, max(C, ffn))
};

}  // namespace

void Runner::ensure(std::int64_t N) {
  if (N <= cap_) return;
  const auto& cfg = layout_.config();
  cap_ = N;
  acts_.resize(model::BlockActOffsets(cfg, N).end);
  tmp_.resize(static_cast<std::size_t>(N) * std::max(cfg.n_embd, cfg.ffn()));
  x_.resize(static_cast<std::size_t>(N) * cfg.n_embd);
}

void Runner::embed(const float* params, const std::int32_t* tokens, int B, int T, float* x,
                   const Hooks* hooks) {
  const auto& cfg = layout_.config();
  if (T > cfg.block_size)
    throw Error(
        fmt::format("sequence length {} exceeds the model's block_size {}", T, cfg.block_size));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(B) * T; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg.vocab_size)
      throw Error(fmt::format("token id {} is outside the model's vocabulary of {}", tokens[i],
                              cfg.vocab_size));
  const float* wpe = layout_.wpe == model::k_absent ? nullptr : params + layout_.wpe;
  if (!hooks || !hooks->embed)
    return k::embedding_forward(x, tokens, params + layout_.wte, wpe, B, T, cfg.n_embd);
  const std::int64_t C = cfg.n_embd;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(B) * T; ++i) {
    float* xi = x + i * C;
    hooks->embed(tokens[i], xi);
    if (wpe)
      for (std::int64_t c = 0; c < C; ++c) xi[c] += wpe[(i % T) * C + c];
  }
}

void Runner::block(const float* P, int l, float* x, int B, int T, const Hooks& hooks) {
  const auto& cfg = layout_.config();
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  ensure(N);
  const auto& lo = layout_.layers[l];
  const auto w = model::block_weights(lo, P + lo.begin);
  const auto acts = model::BlockActOffsets(cfg, N).view(acts_.data());
  model::BlockLinear linear;
  if (hooks.linear)
    linear = [&hooks](int layer, int site, float* out, const float* x, const float* bias,
                      std::int64_t n) {
      hooks.linear(layer, static_cast<Lin>(site), out, x, bias, n);
    };
  HookedOps ops(gemm_, hooks, linear, l, w, tmp_.data());
  try {
    model::block_forward(ops, w, acts, x, model::block_shape(cfg, B, T));
  } catch (const StopBlock&) {
    return;
  }
  std::copy(acts.res3, acts.res3 + N * cfg.n_embd, x);
  if (hooks.residual) hooks.residual(l, x, N, cfg.n_embd);
}

void Runner::head(const float* P, const float* x, std::int64_t N, float* logits,
                  const Hooks* hooks) {
  const auto& cfg = layout_.config();
  const int C = cfg.n_embd;
  ensure(N);
  float* ln = acts_.data();  // the block's activations are free here
  std::vector<float> mean(N), rstd(N);
  if (cfg.llama())
    k::rmsnorm_forward(ln, rstd.data(), x, P + layout_.lnf_w, N, C,
                       static_cast<float>(cfg.norm_eps));
  else
    k::layernorm_forward(ln, mean.data(), rstd.data(), x, P + layout_.lnf_w, P + layout_.lnf_b, N,
                         C);
  if (hooks && hooks->head)
    hooks->head(logits, ln, N);
  else
    k::linear_forward(gemm_, logits, ln, P + layout_.head, nullptr, N, C, cfg.padded_vocab());
}

void Runner::logits(const float* P, const std::int32_t* tokens, int B, int T, float* logits,
                    const Hooks& hooks) {
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  ensure(N);
  embed(P, tokens, B, T, x_.data(), &hooks);
  for (int l = 0; l < layout_.config().n_layer; ++l) block(P, l, x_.data(), B, T, hooks);
  head(P, x_.data(), N, logits, &hooks);
}

}  // namespace tessera::quant
