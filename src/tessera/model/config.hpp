// GPT-2 architecture hyperparameters.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::model {

inline constexpr int k_vocab_pad_multiple = 128;

struct ModelConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 256;
  int block_size = 128;    // max sequence length (rows of the position embedding)
  int vocab_size = 50257;  // real vocabulary; the embedding is padded to padded_vocab()

  int head_dim() const { return n_embd / n_head; }
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

// Throws tessera::Error when the shape is not a valid GPT (positive sizes, heads divide width),
// or is absurdly large (more than k_max_layers layers or k_max_params parameters; the message
// says how much memory it would need).
void validate(const ModelConfig& cfg);

// FLOPs of one forward pass over T tokens of context, per token (matmuls + attention scores and
// values, full T x T counted as the GPU kernels compute it). Training (fwd + bwd) is 3x this.
double forward_flops_per_token(const ModelConfig& cfg, int T);

std::string describe(const ModelConfig& cfg);  // "L=4 H=4 C=256 T=128 V=50257 (16.1M params)"

}  // namespace tessera::model
