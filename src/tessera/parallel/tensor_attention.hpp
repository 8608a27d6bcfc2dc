// How attention splits over the tx x ty x tz tensor grid (AxoNN's 3D parallel matrix
// multiplication, Singh et al., "A 4D Hybrid Algorithm to Scale Parallel Training"): the layout
// of the rank's heads and channels and the head-grouped row order of the fused q|k|v matrix,
// which the tensor-parallel model (tensor_model.hpp, tensor_ops.hpp) runs the one block with.
// Below, for the attention sub-block of GPT-2 (the layer tests compose it from these pieces):
//
//   y = x + proj(attention(qkv(ln1(x))))        x, y (B, T, C) global
//
// qkv (C -> 3C) is a NORMAL 3D-parallel linear (tensor_linear.hpp: in over tx, out over ty) and
// proj (C -> C) a TRANSPOSED one (in over ty, out over tx), so qkv's local output is proj's local
// input after the attention, without any re-layout.
//
// Layouts (n = B*T/tz local rows, cx, cy, cz the rank's tx, ty, tz coordinates):
//  - residual stream x, y, dx, dy: (n, C/tx): the rank's batch shard (whole sequences
//    [cz*B/tz, (cz+1)*B/tz), so B % tz == 0) and channels [cx*C/tx, (cx+1)*C/tx); replicated over
//    ty. It is the input layout of the normal qkv linear and the output layout of the transposed
//    proj linear, so the residual stream stays in one layout through the block (and the next
//    block's normal linear takes it as is).
//  - heads: ty rank cy owns the NH/ty heads [cy*NH/ty, (cy+1)*NH/ty) (NH % ty == 0 required), i.e.
//    channels [cy*C/ty, (cy+1)*C/ty) of the attention output (head h is channels h*hs.. of it).
//    The attention of those heads runs on the rank's rows, replicated over tx.
//  - qkv "head-grouped" order (the permutation): the global c_attn weight W (3C, C) and bias b (3C)
//    keep GPT-2's order (rows [0,C) = q, [C,2C) = k, [2C,3C) = v, head h at rows h*hs.. of each).
//    The normal linear splits its 3C output rows into ty contiguous ranges of 3C/ty, so it is
//    given the rows in head-grouped order: row r of the permuted matrix, with
//      j = r / (3C/ty) (ty rank), s = (r % (3C/ty)) / (C/ty) (0 = q, 1 = k, 2 = v),
//      i = r % (C/ty),
//    is global row s*C + j*(C/ty) + i. Rank cy's local qkv output (n, 3C/ty) is then
//    [q | k | v] of its heads, exactly the (B, T, 3C') layout of kernels::cpu::attention_forward
//    with C' = C/ty and NH' = NH/ty. The permutation only reorders whole rows of W, b (and of their
//    gradients), so checkpoints keep the global order: qkv_rows_to_head_grouped() converts a
//    global tensor to the order the linear's extract_* helpers expect, and
//    qkv_rows_from_head_grouped() back. For ty = 1 the permutation is the identity.
//  - proj weight: the global c_proj W (C, C), no permutation (its input channels are the attention
//    output channels, already split over ty by whole heads).
//
// LayerNorm over channels split over tx: the mean and variance need the full row of C, so the
// forward all-reduces the per-row partial sums over tx, in two passes like the single-rank kernel
// (sum x -> mean; sum (x-mean)^2 -> variance), n floats each. The backward all-reduces the two
// per-row partial sums sum(w*g) and sum(w*g*xhat) over tx (2n floats, one call).
//
// Replicated parameters and their gradients:
//  - ln1 weight and bias: the rank holds the channel slice [cx*C/tx, (cx+1)*C/tx) (the residual
//    stream's channels), replicated over ty and tz. Their gradient is a sum over rows: the rank's
//    rows are complete over ty (every ty rank computes the same LayerNorm on the same rows, and dy
//    of LayerNorm is replicated over ty after the qkv linear's dx all-reduce over ty), so the only
//    missing terms are the other batch shards: ALL-REDUCE OVER tz (never over ty, which would
//    count each row ty times). Result: replicated over ty and tz, like the parameter.
//  - qkv and proj biases: as in tensor_linear.hpp (all-reduce over tz; the bias slice lives on the
//    linear's output axis, replicated over its input axis and tz).
//  - weights: shards over tz, gradient reduce-scatter over tz (tensor_linear.hpp).
//  (Data parallelism adds its own all-reduce over dp for all of them; not done here.)
//
// Collectives per call, in this order on every rank:
//  forward:  ln sums over tx (2 all-reduces), qkv linear (tz all-gather, tx all-reduce), proj
//            linear (tz all-gather, ty all-reduce).
//  backward: proj backward (tx all-reduce of d(att), tz reduce-scatter, tz bias all-reduce), qkv
//            backward (ty all-reduce of d(ln), tz reduce-scatter, tz bias all-reduce), ln row sums
//            over tx (1 all-reduce), ln parameter gradients over tz (1 all-reduce).
// Gradients: parameter gradients ACCUMULATE (+=); dx is overwritten (dy + the LayerNorm path).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/parallel/tensor_linear.hpp"

namespace tessera::parallel {

struct TensorAttentionLayout {
  int C = 0, n_head = 0, head_size = 0;
  int tx = 1, tx_index = 0, ty = 1, ty_index = 0, tz = 1, tz_index = 0;
  int c_local = 0, c_offset = 0;         // residual-stream channels [c_offset, +c_local), C/tx
  int heads_local = 0, head_offset = 0;  // heads [head_offset, +heads_local), NH/ty
  int att_local = 0;                     // heads_local * head_size = C/ty
  TensorLinearLayout qkv;                // normal, C -> 3C (head-grouped rows)
  TensorLinearLayout proj;               // transposed, C -> C

  // Sequences of this rank for a global batch of B sequences (split over tz; throws if B % tz).
  int local_batch(int B) const;
  int batch_offset(int B) const;
};

// Throws tessera::Error unless C % n_head == 0, n_head % ty == 0 and C % tx == 0.
TensorAttentionLayout make_tensor_attention_layout(const comm::Topology& topo, int C, int n_head);

struct TensorAttentionComms {
  TensorLinearComms qkv, proj;
  comm::Communicator* tx = nullptr;  // LayerNorm row sums
  comm::Communicator* tz = nullptr;  // LayerNorm parameter gradients
};
TensorAttentionComms tensor_attention_comms(comm::Runtime& rt, const comm::Topology& topo);

// ---- the head-grouped order of the c_attn rows (see the top of the file) ----
// The general form: a matrix whose rows are segments [s_0 | s_1 | ...] (each divisible by ty) is
// given to a normal linear (rows split into ty contiguous ranges) in the order where ty rank j's
// range is [slice j of s_0 | slice j of s_1 | ...]. GPT-2's c_attn is {C, C, C}; llama's fused
// q, k, v projection {n_head hs, n_kv_head hs, n_kv_head hs} (rank j: its q heads, then its kv
// heads), its fused gate and up projection {F, F} (rank j: matching gate and up slices).
// Global row held at row r of that order.
int grouped_source_row(const std::vector<int>& segments, int ty, int r);
// Global row (GPT-2 order) held at row r of the head-grouped order.
int qkv_head_grouped_source_row(int C, int ty, int r);
// dst (3C, row_len) <- src (3C, row_len) in head-grouped order (row_len = C for W, 1 for b).
void qkv_rows_to_head_grouped(const float* src, float* dst, int C, int ty, std::int64_t row_len);
// The inverse: dst (3C, row_len) in GPT-2 order <- src in head-grouped order.
void qkv_rows_from_head_grouped(const float* src, float* dst, int C, int ty, std::int64_t row_len);

}  // namespace tessera::parallel
