// LayerNorm of the residual stream on the tensor grid: rows (n, the rank's batch shard) with their
// C channels split over tx (the rank holds c_local = C/tx of them, replicated over ty). The mean
// and variance need the whole row, so the forward all-reduces per-row partial sums over tx, in two
// passes like the single-rank kernel (sum x -> mean; sum (x-mean)^2 -> variance), n floats each;
// the backward all-reduces the two per-row partial sums sum(w*g) and sum(w*g*xhat) over tx (2n
// floats, one call). The weight and bias gradients are complete over ty (every ty rank holds the
// same rows) and are summed over the batch shards of tz: an all-reduce over tz, never over ty.
// Used by the attention and MLP sub-blocks and by the final LayerNorm (tensor_model.hpp).
//
// RMSNorm (llama) the same way with one statistic: the forward all-reduces the per-row partial
// sums of squares over tx (n floats), the backward the per-row partial sums of w*g*xhat (n
// floats); the weight gradient is summed over tz. No bias.
//
// Without a split (tx = 1, and tz = 1 for the backward) these are the single-rank kernels of
// kernels/cpu/ops.hpp.
#pragma once

#include <cstdint>

#include "tessera/comm/communicator.hpp"

namespace tessera::parallel {

// out (n, c_local) = LayerNorm(x) * w + b on the rank's channel slice; mean, rstd (n) saved for
// the backward. row_stats: scratch of 2n floats.
void tensor_layernorm_forward(comm::Communicator& tx, float* out, float* mean, float* rstd,
                              const float* x, const float* w, const float* b, std::int64_t n,
                              int c_local, int C, float* row_stats);

// dx (n, c_local) += the LayerNorm path of dout (ACCUMULATES, like the single-rank kernel: the
// caller puts the residual gradient there first); dw, db (c_local) += their gradients summed over
// tz. row_stats: 2n floats; param_scratch: 2*c_local floats.
void tensor_layernorm_backward(comm::Communicator& tx, comm::Communicator& tz, float* dx, float* dw,
                               float* db, const float* dout, const float* x, const float* w,
                               const float* mean, const float* rstd, std::int64_t n, int c_local,
                               int C, float* row_stats, float* param_scratch);

// out (n, c_local) = x * rstd * w, rstd = 1 / sqrt(mean over the C channels of x^2 + eps);
// rstd (n) saved for the backward. row_stats: scratch of n floats.
void tensor_rmsnorm_forward(comm::Communicator& tx, float* out, float* rstd, const float* x,
                            const float* w, std::int64_t n, int c_local, int C, float eps,
                            float* row_stats);

// dx (n, c_local) += the RMSNorm path of dout (ACCUMULATES); dw (c_local) += its gradient summed
// over tz. row_stats: n floats; param_scratch: c_local floats.
void tensor_rmsnorm_backward(comm::Communicator& tx, comm::Communicator& tz, float* dx, float* dw,
                             const float* dout, const float* x, const float* w, const float* rstd,
                             std::int64_t n, int c_local, int C, float* row_stats,
                             float* param_scratch);

}  // namespace tessera::parallel
