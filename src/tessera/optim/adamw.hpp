// AdamW with decoupled weight decay (Loshchilov & Hutter), over the flat parameter buffer, the
// learning-rate schedule (linear warmup + cosine decay to min_lr), and global-norm clipping.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/model/layout.hpp"

namespace tessera::optim {

struct AdamWConfig {
  float lr = 6e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to tensors whose ParamTensor::decay is true
};

// One AdamW update of params (n) in place, with moments m, v (n). step is 1-based (bias
// correction). Decay is applied per tensor of the layout. The update reads grads[i] *
// grad_scale: the gradient clipping of clip_scale() fused into the optimizer's one pass (the
// same floats as scaling the gradients in place first, one memory pass fewer).
void adamw_step(const model::ParamLayout& layout, float* params, const float* grads, float* m,
                float* v, const AdamWConfig& cfg, float lr, std::int64_t step,
                float grad_scale = 1.0f);

// Same over one contiguous range [begin, end) with one decay flag (used by sharded optimizers).
void adamw_update_range(float* params, const float* grads, float* m, float* v, std::size_t n,
                        const AdamWConfig& cfg, float lr, bool decay, std::int64_t step,
                        float grad_scale = 1.0f);

// Warmup (linear from lr/warmup to lr over `warmup` steps), then cosine from lr to lr*min_ratio
// at `total` steps. step is 0-based.
float lr_at(std::int64_t step, std::int64_t total, std::int64_t warmup, float lr, float min_ratio);

// L2 norm of grads (n), summed in double in a fixed order (deterministic).
double global_norm(const float* grads, std::size_t n);
// Sum of squares of the grads whose mask byte is non-zero (the slices a tensor-parallel rank
// owns), with global_norm's fixed chunking and order.
double masked_sumsq(const float* grads, const std::uint8_t* mask, std::size_t n);
// The clipping factor min(1, max_norm / norm) (1 when max_norm <= 0: no clipping).
float clip_scale(double norm, double max_norm);
// Scales grads by clip_scale(norm, max_norm); returns the scale used.
float clip_by_global_norm(float* grads, std::size_t n, double norm, double max_norm);

}  // namespace tessera::optim
