// Vocabulary-parallel token embedding and tied LM head with a parallel cross-entropy, on the
// tx x ty x tz tensor grid of tensor_linear.hpp. The full logits (N, Vp) are never formed on any
// rank: each rank holds the logits of its rows and its vocabulary range only, and the softmax
// statistics are combined with all-reduces of N numbers.
//
// Layout convention (global: wte (Vp, C) tied token embedding / LM head weight, wpe (maxT, C),
// activations (N, C) with N = B*T rows, logits (N, Vp); V <= Vp the real vocabulary):
//  - vocabulary group = the tensor axes {tx, ty}, vocab_parts = tx*ty. The padded vocabulary Vp is
//    split into vocab_parts equal contiguous ranges; the range index of rank (cx, cy, cz) is its
//    rank in the {tx, ty} group, topo.group_rank({TX, TY}) (cx + tx*cy with the default axis
//    order), so rank i of the vocab group holds rows [i*Vr, (i+1)*Vr) of wte, Vr = Vp/(tx*ty).
//    Ids >= V in a range are padding: never a target, excluded from the softmax, zero gradient
//    (a range may hold padding only, e.g. V=300, Vp=384 over 8 ranks: [336, 384)).
//  - wte block: the rank's Vr rows with ALL C channels, row-major (Vr, C); flattened and sharded
//    again over tz with the ZeRO convention of tensor_linear (shard z = elements
//    [z*ceil(B/tz), min(B, (z+1)*ceil(B/tz))) of the B = Vr*C block elements). Only the shard is
//    stored; the embedding and the LM head all-gather the block over tz, like a linear.
//  - rows: the batch is split over tz exactly like tensor_linear: a call with N global rows sees
//    rows [cz*N/tz, (cz+1)*N/tz) (so a tz slice may start mid-sequence; position = row % T).
//  - activations (the embedding output, its gradient, the LM head input h = final LayerNorm
//    output and its gradient dh): x_local (n, C/tx) = the rank's rows and channels
//    [cx*C/tx, (cx+1)*C/tx), replicated over ty. This is the input layout of a normal
//    tensor_linear (in split over tx) and the output layout of a transposed one (out split over
//    tx), i.e. the residual-stream layout of a normal/transposed pair: the embedding output feeds
//    the first block as is, and the last block's (transposed) layout feeds the LM head as is.
//  - logits_local (n, Vr): the rank's rows x its vocabulary range (replicated nowhere: the tx*ty*tz
//    ranks hold disjoint pieces, N*Vp/(tx*ty*tz) floats each). The per-row losses (n) are
//    replicated over the vocab group.
//  - wpe: wpe_local (maxT, C/tx) = the rank's channel range, replicated over ty and tz (like the
//    bias of a linear: its gradient is complete over ty and summed over tz by an all-reduce).
//
// Collectives per call, in this order on every rank:
//  embedding forward:  all-gather wte block over tz; reduce-scatter of the (n, C) partial lookups
//                      over tx (each rank keeps its channel range); all-reduce over ty.
//  embedding backward: all-gather of dout over tx (the full C channels of the rank's rows);
//                      reduce-scatter of the block gradient over tz; all-reduce of dwpe over tz.
//  LM head forward:    all-gather wte block over tz; all-gather of h over tx; GEMM
//                      logits_local = h (n, C) @ wte_block^T.
//  cross-entropy:      all-reduce max (n) over {tx,ty}; all-reduce sum (2n: sum of exp, target
//                      logit, contributed by the rank owning the target) over {tx,ty}.
//  LM head backward:   GEMM dh partial = dlogits_local @ wte_block; reduce-scatter over tx
//                      (in flight during the GEMM dwte_block = dlogits_local^T @ h); all-reduce of
//                      dh over ty; reduce-scatter of the block gradient over tz.
// Volumes per call: O(n*C) activations and O(n) statistics, never O(n*Vp).
//
// Gradients follow the kernels' convention: dwte_shard and dwpe ACCUMULATE (+=; the embedding and
// the LM head both add to the same tied shard), dh is overwritten, dlogits overwrite the logits.
// The per-rank softmax math mirrors kernels::cpu::cross_entropy_* (same exp_approx, same order of
// operations per element); it belongs in the kernels' Backend table when a CUDA version is added.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tessera::parallel {

struct VocabParallelLayout {
  int vocab = 0;         // V: real vocabulary (ids >= V are padding)
  int padded_vocab = 0;  // Vp: rows of wte
  int channels = 0;      // C
  int tx = 1, tx_index = 0;
  int ty = 1, ty_index = 0;
  int tz = 1, tz_index = 0;
  int vocab_parts = 1, vocab_index = 0;   // tx*ty and this rank's rank in the {tx, ty} group
  int vocab_local = 0, vocab_offset = 0;  // Vr: wte rows [vocab_offset, vocab_offset + Vr)
  int real_local = 0;  // real ids in the range: clamp(V - vocab_offset, 0, Vr); the rest is padding
  int c_local = 0, c_offset = 0;          // activation channels [c_offset, c_offset + c_local)
  std::int64_t block_numel = 0;           // Vr * C
  std::vector<std::size_t> shard_counts;  // (tz) elements of the block owned by each tz rank
  std::int64_t shard_offset = 0;          // first block element of this rank's shard
  std::int64_t shard_numel = 0;           // shard_counts[tz_index]

  // Rows of the batch on this rank for a global batch of n_global rows (split over tz).
  std::int64_t local_rows(std::int64_t n_global) const;
  std::int64_t row_offset(std::int64_t n_global) const;
  bool owns(std::int32_t id) const { return id >= vocab_offset && id < vocab_offset + vocab_local; }
};

// Throws tessera::Error if V > Vp, Vp is not divisible by tx*ty or C by tx.
VocabParallelLayout make_vocab_parallel_layout(const comm::Topology& topo, int vocab,
                                               int padded_vocab, int channels);

// Created through rt.group collectively, in the order tx, ty, tz, {tx, ty}.
struct VocabParallelComms {
  comm::Communicator* tx = nullptr;     // channel split of the activations
  comm::Communicator* ty = nullptr;     // replication of the activations
  comm::Communicator* depth = nullptr;  // tz: weight gather / gradient reduce-scatter, row split
  comm::Communicator* vocab = nullptr;  // {tx, ty}: the softmax statistics
};
VocabParallelComms vocab_parallel_comms(comm::Runtime& rt, const comm::Topology& topo);

// Scratch for calls with at most n_local rows (local rows) and sequences of at most max_t.
// Largest buffer: the logits slice (n_local, Vr), or an O(n_local*C) / O(Vr*C) one; no buffer is
// ever (N, Vp).
struct VocabParallelWorkspace {
  VocabParallelWorkspace() = default;
  VocabParallelWorkspace(const VocabParallelLayout& layout, std::int64_t n_local, int max_t);
  std::int64_t n_local = 0;
  // With tz = 1 the shard is the block: these three stay empty and the weight and its gradient
  // are used in place.
  std::vector<float> w_block;     // (Vr, C) the gathered weight block
  std::vector<float> dw_block;    // (Vr, C) partial block gradient before the tz sum
  std::vector<float> dw_shard;    // (shard_numel) reduced gradient shard before accumulation
  const float* w_used = nullptr;  // the block the last forward used (w_block or the shard)
  std::vector<float> h_full;      // (n_local, C) the LM head input gathered over tx (kept for bwd)
  std::vector<float> cols;        // (tx, n_local, C/tx) channel-block-major scratch for tx comms
  std::vector<float> logits;      // (n_local, Vr) this rank's logits slice, then its dlogits
  std::vector<double> row_max;    // (n_local) global max of each row's real logits
  std::vector<float> row_sums;    // (2*n_local) sum of exp, then target logit, per row
  std::vector<float> dwpe;        // (max_t, C/tx) partial position gradient before the tz sum
  std::vector<std::size_t> tx_counts;  // (tx) n_local*C/tx each (the tx reduce-scatter)
  // bf16 mixed precision (set: the LM head's GEMMs read bf16 operands, as the linears of
  // tensor_linear.hpp): the head input and dlogits rounded into this scratch, the weight block
  // into w16. With tz = 1 w16 stays valid until the weights change (w16_valid = false).
  kernels::cpu::Bf16Scratch* bf16 = nullptr;
  std::vector<std::uint16_t> w16;
  bool w16_valid = false;
};

// ---- the slices of global tensors that a rank holds (tests, checkpoints, initialisation) ----
// w_block (Vr, C) <- wte (Vp, C)
void extract_vocab_weight_block(const VocabParallelLayout& l, const float* wte, float* w_block);
// w_shard (shard_numel) <- wte (Vp, C)
void extract_vocab_weight_shard(const VocabParallelLayout& l, const float* wte, float* w_shard);
// wpe_local (rows, C/tx) <- wpe (rows, C)
void extract_vocab_wpe(const VocabParallelLayout& l, const float* wpe, int rows, float* wpe_local);
// x_local (n_global/tz, C/tx) <- x (n_global, C): activations, h, dh, the embedding output
void extract_vocab_activation(const VocabParallelLayout& l, const float* x, std::int64_t n_global,
                              float* x_local);
// logits_local (n_global/tz, Vr) <- logits (n_global, Vp)
void extract_vocab_logits(const VocabParallelLayout& l, const float* logits, std::int64_t n_global,
                          float* logits_local);
// ids_local (n_global/tz) <- ids (n_global)
void extract_vocab_rows(const VocabParallelLayout& l, const std::int32_t* ids,
                        std::int64_t n_global, std::int32_t* ids_local);

// ---- the layers; every rank of a vocab group passes the same rows (ids, targets, h) ----
// w_block (Vr*C) <- all-gather of w_shard over tz.
void vocab_gather_weight(const VocabParallelLayout& l, const VocabParallelComms& c,
                         const float* w_shard, float* w_block);

// out (n, C/tx) = wte[ids] + wpe[position] on the rank's rows [row_offset, +n) of a (B, T) batch
// of n_global = B*T rows (position of global row r = r % T). ids (n) in [0, Vp), else
// tessera::Error. wpe_local (>= T rows, C/tx; null: no positions). Gathers the block into
// ws.w_block.
void vocab_embedding_forward(const VocabParallelLayout& l, const VocabParallelComms& c, float* out,
                             const std::int32_t* ids, const float* wte_shard,
                             const float* wpe_local, std::int64_t n_global, int T,
                             VocabParallelWorkspace& ws);

// dwte_shard (shard_numel) += this rank's shard of the gradient of the rows it owns;
// dwpe_local (T, C/tx) += (skipped if null). dout (n, C/tx) in the activation layout.
void vocab_embedding_backward(const VocabParallelLayout& l, const VocabParallelComms& c,
                              float* dwte_shard, float* dwpe_local, const float* dout,
                              const std::int32_t* ids, std::int64_t n_global, int T,
                              VocabParallelWorkspace& ws);

// ws.logits (n, Vr) = h @ wte_block^T over the rank's range. h (n, C/tx) in the activation
// layout. Gathers the block into ws.w_block and h into ws.h_full (both kept for the backward).
void vocab_lm_head_forward(kernels::GemmLibrary lib, const VocabParallelLayout& l,
                           const VocabParallelComms& c, const float* h, const float* wte_shard,
                           std::int64_t n, VocabParallelWorkspace& ws);

// Parallel softmax cross-entropy over the real vocabulary on ws.logits (n, Vr):
// losses (n) = log(sum_j<V exp(z_j - m)) + m - z_target with m the row max over j < V, the same on
// every rank of the vocab group. targets (n): < 0 ignored (loss 0, no gradient), >= V is a
// tessera::Error. If backward, ws.logits is overwritten with this rank's slice of
// dloss * (softmax - onehot) (padding columns zero).
void vocab_cross_entropy(const VocabParallelLayout& l, const VocabParallelComms& c, float* losses,
                         const std::int32_t* targets, std::int64_t n, bool backward, float dloss,
                         VocabParallelWorkspace& ws);

// dh (n, C/tx) = dlogits @ wte summed over the vocab group (overwrite);
// dwte_shard (shard_numel) += this rank's shard of sum over tz of dlogits^T @ h.
// Uses ws.logits (the dlogits), ws.h_full and ws.w_block left by the forward and cross-entropy.
void vocab_lm_head_backward(kernels::GemmLibrary lib, const VocabParallelLayout& l,
                            const VocabParallelComms& c, float* dh, float* dwte_shard,
                            std::int64_t n, VocabParallelWorkspace& ws);

// Mean of losses over the non-ignored targets of all rows (sum over tz; losses are replicated over
// the vocab group). Same on every rank; 0 when every target is ignored.
double vocab_mean_loss(const VocabParallelComms& c, const float* losses,
                       const std::int32_t* targets, std::int64_t n);

}  // namespace tessera::parallel
