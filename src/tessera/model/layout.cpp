#include "tessera/model/layout.hpp"

#include <cmath>

#include "tessera/core/error.hpp"

namespace tessera::model {

namespace {
// The rotary scaling's parameters: positive and finite, and what each kind reads consistent.
void validate_rope_scaling(const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  const auto finite_positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (r.kind != RopeScalingKind::None && !finite_positive(r.factor))
    throw Error(fmt::format("model.rope_scaling factor must be positive, got {}", r.factor),
                "the inverse frequencies are divided by the factor (Llama 3.1: 8)");
  if (r.kind == RopeScalingKind::Llama3 &&
      !(finite_positive(r.low_freq_factor) && r.high_freq_factor > r.low_freq_factor &&
        std::isfinite(r.high_freq_factor) && r.original_max_position_embeddings > 0))
    throw Error(
        fmt::format("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor "
                    "and original_max_position_embeddings > 0, got {}, {} and {}",
                    r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings),
        "Llama 3.1 uses low_freq_factor 1, high_freq_factor 4 and an original context of 8192");
  if (r.freq_factors.empty()) return;
  if (r.freq_factors.size() != static_cast<std::size_t>(c.head_dim() / 2))
    throw Error(fmt::format("the rotary frequency factors are {} values, but the head size {} "
                            "needs {}",
                            r.freq_factors.size(), c.head_dim(), c.head_dim() / 2),
                "one factor per pair of a head's channels");
  for (float f : r.freq_factors)
    if (!finite_positive(f))
      throw Error(fmt::format("a rotary frequency factor is {}; they must be positive", f),
                  "each factor divides one inverse frequency");
}
}  // namespace

namespace {
// " rope=llama3x8", " rope=factors" (only per-dimension factors), or "" (no scaling).
std::string describe_rope_scaling(const RopeScaling& r) {
  if (r.kind != RopeScalingKind::None)
    return fmt::format(" rope={}x{}", rope_scaling_name(r.kind), r.factor);
  return r.freq_factors.empty() ? "" : " rope=factors";
}
}  // namespace

const char* rope_scaling_name(RopeScalingKind k) {
  switch (k) {
    case RopeScalingKind::Linear:
      return "linear";
    case RopeScalingKind::Llama3:
      return "llama3";
    default:
      return "none";
  }
}

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int hs = c.head_dim(), half = hs / 2;
  const RopeScaling& r = c.rope_scaling;
  std::vector<double> inv(static_cast<std::size_t>(half));
  const double pi = 3.14159265358979323846;
  const double orig = r.original_max_position_embeddings;
  for (int i = 0; i < half; ++i) {
    double f = std::pow(c.rope_theta, -2.0 * i / hs);
    if (r.kind == RopeScalingKind::Linear) f /= r.factor;
    if (r.kind == RopeScalingKind::Llama3) {
      const double wavelen = 2 * pi / f;
      if (wavelen > orig / r.low_freq_factor) {
        f /= r.factor;
      } else if (wavelen >= orig / r.high_freq_factor) {
        const double s =
            (orig / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1 - s) * f / r.factor + s * f;
      }
    }
    if (!r.freq_factors.empty()) f /= r.freq_factors[static_cast<std::size_t>(i)];
    inv[static_cast<std::size_t>(i)] = f;
  }
  return inv;
}

void validate(const ModelConfig& c) {
  auto positive = [](int v, const char* name) {
    if (v <= 0) throw Error(fmt::format("model.{} must be positive, got {}", name, v));
  };
  positive(c.n_layer, "n_layer");
  positive(c.n_head, "n_head");
  positive(c.n_embd, "n_embd");
  positive(c.block_size, "block_size");
  positive(c.vocab_size, "vocab_size");
  if (c.n_embd % c.n_head != 0)
    throw Error(
        fmt::format("model.n_embd ({}) is not divisible by model.n_head ({})", c.n_embd, c.n_head),
        "choose n_head so that each head has n_embd / n_head channels");
  if (c.n_kv_head < 0 || c.intermediate_size < 0)
    throw Error("model.n_kv_head and model.intermediate_size must be positive (or 0: the default)");
  if (!c.llama()) {
    if (c.n_kv_head != 0 && c.n_kv_head != c.n_head)
      throw Error("model.n_kv_head is a llama setting: gpt2 has as many key-value heads as heads",
                  "remove n_kv_head, or use family = \"llama\"");
    if (c.intermediate_size != 0 && c.intermediate_size != 4 * c.n_embd)
      throw Error("model.intermediate_size is a llama setting: gpt2's MLP is 4 * n_embd wide",
                  "remove intermediate_size, or use family = \"llama\"");
    if (!c.tie_embeddings)
      throw Error("gpt2's head is tied to the token embedding (tie_embeddings = true)",
                  "remove tie_embeddings, or use family = \"llama\"");
    if (c.rope_scaling.scaled())
      throw Error("rope scaling is a llama setting: gpt2 has learned positions",
                  "remove rope_scaling, or use family = \"llama\"");
    return validate_size(c);
  }
  if (c.n_head % c.kv_heads() != 0)
    throw Error(fmt::format("model.n_head ({}) is not divisible by model.n_kv_head ({})", c.n_head,
                            c.kv_heads()),
                "each key-value head serves n_head / n_kv_head query heads; choose a divisor");
  if (c.head_dim() % 2 != 0)
    throw Error(fmt::format("rotary positions need an even head size (n_embd / n_head = {})",
                            c.head_dim()));
  if (!(c.norm_eps > 0 && c.norm_eps < 1))
    throw Error(fmt::format("model.norm_eps must be in (0, 1), got {}", c.norm_eps));
  if (!(c.rope_theta > 1 && c.rope_theta < 1e12))
    throw Error(fmt::format("model.rope_theta must be in (1, 1e12), got {}", c.rope_theta));
  validate_rope_scaling(c);
  validate_size(c);
}

void validate_size(const ModelConfig& c) {
  const double n = param_count(c);
  if (c.n_layer > k_max_layers || c.vocab_size > k_max_vocab || n > k_max_params)
    throw Error(fmt::format("a model of n_layer={}, n_embd={}, vocab_size={}, block_size={} has "
                            "{:.3g} parameters and would need {:.3g} GB of memory for its fp32 "
                            "weights alone",
                            c.n_layer, c.n_embd, c.vocab_size, c.block_size, n, 4 * n / 1e9),
                fmt::format("tessera takes models of at most {} layers, a vocabulary of at most {} "
                            "and {:.0e} parameters; check the model's shape",
                            k_max_layers, k_max_vocab, k_max_params));
}

double param_count(const ModelConfig& c) {
  const double C = c.n_embd, L = c.n_layer, P = c.block_size;
  const double Vp = std::ceil(c.vocab_size / double(k_vocab_pad_multiple)) * k_vocab_pad_multiple;
  const double F = c.intermediate_size > 0 ? c.intermediate_size : 4.0 * C;
  const double kv = c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
  const double qkv = C + 2.0 * C * kv / c.n_head;  // rows of the q, k, v projection
  if (c.llama())  // embedding; per layer 2 RMSNorms, q k v o, gate up down; the norm; the head
    return Vp * C + L * (qkv * C + C * C + 3 * F * C + 2 * C) + C + (c.tie_embeddings ? 0 : Vp * C);
  // wte, wpe; per layer 2 LayerNorms, qkv, attention projection, MLP; the final LayerNorm
  return Vp * C + P * C + L * (12 * C * C + 13 * C) + 2 * C;
}

double forward_flops_per_token(const ModelConfig& c, int T) {
  const double C = c.n_embd, L = c.n_layer, V = c.vocab_size;
  const double F = c.ffn(), qkv = c.qkv_rows(), fc = c.fc_rows();
  double matmul_params = L * (qkv * C + C * C + fc * C + F * C) + C * V;
  double attention = L * 2.0 * 2.0 * T * C;  // QK^T and PV over the n_head query heads, per token
  return 2.0 * matmul_params + attention;
}

const char* family_name(Family f) {
  return f == Family::Llama ? "llama" : "gpt2";
}

std::string describe(const ModelConfig& c) {
  ParamLayout layout(c);
  if (c.llama())
    return fmt::format("llama L={} H={} KV={} C={} F={} T={} V={}{}{} ({:.2f}M params)", c.n_layer,
                       c.n_head, c.kv_heads(), c.n_embd, c.ffn(), c.block_size, c.vocab_size,
                       c.tie_embeddings ? " tied" : "", describe_rope_scaling(c.rope_scaling),
                       layout.count_unpadded() / 1e6);
  return fmt::format("L={} H={} C={} T={} V={} ({:.2f}M params)", c.n_layer, c.n_head, c.n_embd,
                     c.block_size, c.vocab_size, layout.count_unpadded() / 1e6);
}

ParamLayout::ParamLayout(const ModelConfig& cfg) : ParamLayout(cfg, LocalNumel{}) {}

ParamLayout::ParamLayout(const ModelConfig& cfg, const LocalNumel& local_numel)
    : cfg_(cfg), local_(static_cast<bool>(local_numel)) {
  validate(cfg);
  const std::int64_t C = cfg.n_embd, Vp = cfg.padded_vocab(), P = cfg.block_size;
  // align = false: the tensor starts right after the previous one (llama's q, k, v and gate, up
  // are read as one matrix each).
  auto add = [&](std::string name, std::vector<std::int64_t> shape, bool decay, bool transposed,
                 int layer, bool align = true) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    if (local_numel) {
      ParamTensor global{name, shape, 0, n, decay, transposed, layer};
      n = local_numel(global);
      shape = {static_cast<std::int64_t>(n)};
    }
    // Keep every tensor 16-float aligned (64 bytes) for vector loads.
    if (align) total_ = (total_ + 15) / 16 * 16;
    tensors_.push_back({std::move(name), std::move(shape), total_, n, decay, transposed, layer});
    total_ += n;
    return tensors_.back().offset;
  };
  if (cfg.llama()) {
    add_llama(cfg, add);
  } else {
    wte = add("wte.weight", {Vp, C}, true, false, -1);
    wpe = add("wpe.weight", {P, C}, true, false, -1);
    for (int l = 0; l < cfg.n_layer; ++l) {
      auto p = fmt::format("h.{}.", l);
      LayerOffsets o{};
      o.begin = (total_ + 15) / 16 * 16;
      o.ln1_w = add(p + "ln_1.weight", {C}, false, false, l);
      o.ln1_b = add(p + "ln_1.bias", {C}, false, false, l);
      o.qkv_w = add(p + "attn.c_attn.weight", {3 * C, C}, true, true, l);
      o.qkv_b = add(p + "attn.c_attn.bias", {3 * C}, false, false, l);
      o.attproj_w = add(p + "attn.c_proj.weight", {C, C}, true, true, l);
      o.attproj_b = add(p + "attn.c_proj.bias", {C}, false, false, l);
      o.ln2_w = add(p + "ln_2.weight", {C}, false, false, l);
      o.ln2_b = add(p + "ln_2.bias", {C}, false, false, l);
      o.fc_w = add(p + "mlp.c_fc.weight", {4 * C, C}, true, true, l);
      o.fc_b = add(p + "mlp.c_fc.bias", {4 * C}, false, false, l);
      o.fcproj_w = add(p + "mlp.c_proj.weight", {C, 4 * C}, true, true, l);
      o.fcproj_b = add(p + "mlp.c_proj.bias", {C}, false, false, l);
      o.end = total_;
      layers.push_back(o);
    }
    lnf_w = add("ln_f.weight", {C}, false, false, -1);
    lnf_b = add("ln_f.bias", {C}, false, false, -1);
    head = wte;
  }
  total_ = (total_ + 15) / 16 * 16;
  for (auto& t : tensors_) t.vocab_rows = t.offset == wte || t.offset == head;
}

// LlamaForCausalLM's tensors and names; no biases, no positions.
template <class Add>
void ParamLayout::add_llama(const ModelConfig& cfg, Add& add) {
  const std::int64_t C = cfg.n_embd, Vp = cfg.padded_vocab(), F = cfg.ffn();
  const std::int64_t q = C, kv = static_cast<std::int64_t>(cfg.kv_heads()) * cfg.head_dim();
  wte = add("model.embed_tokens.weight", {Vp, C}, true, false, -1);
  wpe = k_absent;
  for (int l = 0; l < cfg.n_layer; ++l) {
    auto p = fmt::format("model.layers.{}.", l);
    LayerOffsets o{};
    o.begin = (total_ + 15) / 16 * 16;
    o.ln1_w = add(p + "input_layernorm.weight", {C}, false, false, l);
    o.qkv_w = add(p + "self_attn.q_proj.weight", {q, C}, true, false, l);
    add(p + "self_attn.k_proj.weight", {kv, C}, true, false, l, false);
    add(p + "self_attn.v_proj.weight", {kv, C}, true, false, l, false);
    o.attproj_w = add(p + "self_attn.o_proj.weight", {C, C}, true, false, l);
    o.ln2_w = add(p + "post_attention_layernorm.weight", {C}, false, false, l);
    o.fc_w = add(p + "mlp.gate_proj.weight", {F, C}, true, false, l);
    add(p + "mlp.up_proj.weight", {F, C}, true, false, l, false);
    o.fcproj_w = add(p + "mlp.down_proj.weight", {C, F}, true, false, l);
    o.ln1_b = o.qkv_b = o.attproj_b = o.ln2_b = o.fc_b = o.fcproj_b = k_absent;
    o.end = total_;
    layers.push_back(o);
  }
  lnf_w = add("model.norm.weight", {C}, false, false, -1);
  lnf_b = k_absent;
  head = cfg.tie_embeddings ? wte : add("lm_head.weight", {Vp, C}, true, false, -1);
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::size_t ParamLayout::count_unpadded() const {
  std::size_t n = 0;
  for (const auto& t : tensors_) n += t.numel;
  const std::size_t pad = static_cast<std::size_t>(cfg_.padded_vocab() - cfg_.vocab_size) *
                          cfg_.n_embd * (head == wte ? 1 : 2);
  return n - pad;
}

LinearShape block_linear_shape(const ModelConfig& cfg, int which) {
  const int rows[] = {cfg.qkv_rows(), cfg.n_embd, cfg.fc_rows(), cfg.n_embd};
  return {rows[which], which == 3 ? cfg.ffn() : cfg.n_embd};
}

std::size_t block_linear_weight(const ParamLayout& layout, int layer, int which) {
  const LayerOffsets& w = layout.layers[layer];
  const std::size_t offsets[] = {w.qkv_w, w.attproj_w, w.fc_w, w.fcproj_w};
  return offsets[which];
}

}  // namespace tessera::model
