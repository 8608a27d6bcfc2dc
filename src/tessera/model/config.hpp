// The model's hyperparameters. One model definition serves every family; a family is a set of
// choices the definition reads from here:
//   gpt2:  LayerNorm (weight and bias), learned positions, GELU MLP of 4 * n_embd, biases on every
//          linear layer, the head tied to the token embedding, n_kv_head = n_head.
//   llama: RMSNorm (weight only, norm_eps), rotary positions on q and k (rope_theta and
//          rope_scaling, Hugging Face's rotate-half layout), SwiGLU MLP (gate and up of
//          intermediate_size, then down),
//          no biases, grouped-query attention (n_kv_head heads of keys and values, each shared by
//          n_head / n_kv_head query heads), the head tied or not (tie_embeddings).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::model {

inline constexpr int k_vocab_pad_multiple = 128;

enum class Family { Gpt2, Llama };
const char* family_name(Family f);  // "gpt2", "llama"

// Rotary frequency scaling (llama only), as Hugging Face's config.json `rope_scaling` names it:
//   none:   inv_freq_i = theta^(-2i/hs)
//   linear: inv_freq_i / factor (positions interpolated by factor)
//   llama3: Llama 3.1's per-band scaling. With wavelen = 2 pi / inv_freq_i and
//           orig = original_max_position_embeddings: wavelen < orig / high_freq_factor keeps
//           inv_freq_i; wavelen > orig / low_freq_factor divides it by factor; in between it is
//           (1 - s) inv_freq_i / factor + s inv_freq_i, s = (orig / wavelen - low) / (high - low).
// freq_factors (any kind; llama.cpp's GGUF tensor rope_freqs.weight): hs/2 divisors applied
// after the above, or empty. llama.cpp's converters store llama3 scaling this way.
enum class RopeScalingKind { None, Linear, Llama3 };
const char* rope_scaling_name(RopeScalingKind k);  // "none", "linear", "llama3"

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::None;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
  std::vector<float> freq_factors;
  bool scaled() const { return kind != RopeScalingKind::None || !freq_factors.empty(); }
  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 256;
  int block_size = 128;    // max sequence length (rows of the position embedding)
  int vocab_size = 50257;  // real vocabulary; the embedding is padded to padded_vocab()
  Family family = Family::Gpt2;
  // llama only (gpt2 has n_kv_head = n_head, an MLP of 4 * n_embd and a tied head):
  int n_kv_head = 0;          // 0: n_head
  int intermediate_size = 0;  // 0: 4 * n_embd
  double norm_eps = 1e-5;     // RMSNorm epsilon (gpt2's LayerNorm: 1e-5 always)
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = {};
  bool tie_embeddings = true;

  bool llama() const { return family == Family::Llama; }
  int head_dim() const { return n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int ffn() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  // Rows of the fused q, k, v projection: (n_head + 2 n_kv_head) head_dim.
  int qkv_rows() const { return (n_head + 2 * kv_heads()) * head_dim(); }
  // Rows of the MLP's first projection: gpt2's fc (4C), llama's gate and up (2 x ffn).
  int fc_rows() const { return llama() ? 2 * ffn() : ffn(); }
  int padded_vocab() const {
    return (vocab_size + k_vocab_pad_multiple - 1) / k_vocab_pad_multiple * k_vocab_pad_multiple;
  }
  bool operator==(const ModelConfig&) const = default;
};

// Shapes beyond these are refused before anything is built or allocated: the largest models of
// the literature have about 10^12 parameters and a few hundred layers.
inline constexpr int k_max_layers = 16384;
inline constexpr int k_max_vocab = 1 << 30;
inline constexpr double k_max_params = 1e14;

// Parameters of the model (with the padded vocabulary rows), computed in floating point so that
// any shape, however absurd, gives a number instead of an overflow.
double param_count(const ModelConfig& cfg);

// The rotary inverse frequency of each pair of a head's channels (head_dim() / 2 values), from
// rope_theta and rope_scaling; every rotary kernel takes this table. Unscaled, entry i is
// std::pow(rope_theta, -2.0 * i / head_dim()).
std::vector<double> rope_inv_freq(const ModelConfig& cfg);

// Throws tessera::Error when the shape is not a valid model (positive sizes, heads divide width,
// kv heads divide heads, an even head size for rotary positions, no llama-only setting on a gpt2
// model), or is absurdly large (more than k_max_layers layers or k_max_params parameters; the
// message says how much memory it would need).
void validate(const ModelConfig& cfg);
// The size limits of validate() alone.
void validate_size(const ModelConfig& cfg);

// FLOPs of one forward pass over T tokens of context, per token (matmuls + attention scores and
// values, full T x T counted as the GPU kernels compute it). Training (fwd + bwd) is 3x this.
double forward_flops_per_token(const ModelConfig& cfg, int T);

std::string describe(const ModelConfig& cfg);  // "L=4 H=4 C=256 T=128 V=50257 (16.1M params)"

}  // namespace tessera::model
