// The 3D-parallel linear layer of AxoNN (Singh et al., "A 4D Hybrid Algorithm"): a linear
// y = x @ W^T + b of the global model, W (out, in), computed on a tx x ty x tz tensor grid.
//
// Sharding convention (normal layer; `transposed` swaps the roles of tx and ty):
//  - in features are split over the "input axis" tx into tx equal contiguous ranges; out features
//    over the "output axis" ty into ty equal contiguous ranges. Rank (cx, cy, cz) computes with
//    the block W[out_offset : out_offset+out_local, in_offset : in_offset+in_local], row-major
//    (out_local, in_local), in_local = in/tx, out_local = out/ty, in_offset = cx*in_local,
//    out_offset = cy*out_local.
//  - that block, flattened, is sharded again over tz with the ZeRO convention of
//    data_parallel.hpp: tz rank z owns elements [z*ceil(B/tz), min(B, (z+1)*ceil(B/tz))) of the B
//    block elements (the last shards may be shorter or empty). Only the shard is stored; the
//    forward all-gathers the block over tz.
//  - the batch (rows) is split over tz too (AxoNN divides the batch over G_data x G_z): a layer
//    called with N global rows sees rows [cz*N/tz, (cz+1)*N/tz) on every rank of tz index cz.
//    That is why the weight gradient is a reduce-SCATTER over tz (a sum over batch shards) and the
//    bias gradient an all-reduce over tz.
//  - activations: the input x_local (n, in_local) holds the rank's rows and its input-axis column
//    range, replicated over the output axis; the output y_local (n, out_local) holds the rank's
//    rows and its output-axis column range, replicated over the input axis. The output layout of a
//    normal layer (columns split over ty, replicated over tx) is therefore exactly the input
//    layout of a transposed one, so a normal/transposed pair needs no re-layout.
//  - bias b (out): the rank holds b[out_offset : out_offset+out_local], replicated over the input
//    axis and tz. It is added once, after the all-reduce of the partial outputs (never to the
//    partial sums). Its gradient is the column sum of dy_local, which is already complete over the
//    input axis (dy_local is replicated there) and only needs the sum over the batch shards: an
//    all-reduce over tz. It ends replicated over the input axis and tz, like the bias.
//
// Collectives per call, in this order on every rank (the same sequence on every rank of a grid):
//  forward:  all-gather of the weight block over tz; GEMM; all-reduce of y over the input axis.
//  backward: GEMM dx = dy @ W_block, all-reduce of dx over the output axis (non-blocking, in flight
//            during the weight-gradient GEMM); GEMM dW_block = dy^T @ x, reduce-scatter over tz
//            into the shard; bias-gradient all-reduce over tz. The backward uses the gathered block
//            left by the forward in the workspace (or re-gathered with tensor_linear_gather_weight,
//            e.g. after a recomputation or another layer's forward reused the workspace).
// Gradients follow the kernels' convention: dw_shard and db ACCUMULATE (+=), dx is overwritten.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_tuner.hpp"

namespace tessera::parallel {

// Which slice of a global linear this rank holds (see the convention above).
struct TensorLinearLayout {
  int in = 0, out = 0;  // global features: W (out, in), b (out), x (N, in), y (N, out)
  bool transposed = false;
  comm::Axis in_axis = comm::Axis::TX;    // splits `in`; forward all-reduce axis
  comm::Axis out_axis = comm::Axis::TY;   // splits `out`; backward (dx) all-reduce axis
  int in_parts = 1, in_index = 0;         // size of in_axis and this rank's coordinate on it
  int out_parts = 1, out_index = 0;       // size of out_axis and this rank's coordinate on it
  int tz = 1, tz_index = 0;               // size of tz and this rank's coordinate on it
  int in_local = 0, in_offset = 0;        // columns [in_offset, in_offset + in_local) of x and W
  int out_local = 0, out_offset = 0;      // rows [out_offset, +out_local) of W, entries of b, y
  std::int64_t block_numel = 0;           // out_local * in_local
  std::vector<std::size_t> shard_counts;  // (tz) elements of the block owned by each tz rank
  std::int64_t shard_offset = 0;          // first block element of this rank's shard
  std::int64_t shard_numel = 0;           // shard_counts[tz_index]

  // Rows of the batch on this rank for a global batch of n_global rows (split over tz).
  std::int64_t local_rows(std::int64_t n_global) const;
  std::int64_t row_offset(std::int64_t n_global) const;
};

// Throws tessera::Error if `in` is not divisible by the input axis or `out` by the output axis.
TensorLinearLayout make_tensor_linear_layout(const comm::Topology& topo, int in, int out,
                                             bool transposed);

// The communicators a layer uses. Created through rt.group (collectively, always in the order
// tx, ty, tz whatever `transposed` is, so that every rank asks in the same order).
struct TensorLinearComms {
  comm::Communicator* in_group = nullptr;   // the input axis: sums the partial outputs
  comm::Communicator* out_group = nullptr;  // the output axis: sums the partial input gradients
  comm::Communicator* depth = nullptr;      // tz: weight gather / gradient reduce-scatter
};
TensorLinearComms tensor_linear_comms(comm::Runtime& rt, const comm::Topology& topo,
                                      bool transposed);

// Scratch of one layer call (or of several layers of the same shape, used one after the other).
struct TensorLinearWorkspace {
  TensorLinearWorkspace() = default;
  explicit TensorLinearWorkspace(const TensorLinearLayout& layout);
  // tz > 1 only (with tz = 1 the shard is the block: the layer reads the weights and accumulates
  // the gradients in place, with no copy):
  std::vector<float> w_block;   // (out_local, in_local) the gathered weight block
  std::vector<float> dw_block;  // (out_local, in_local) partial weight gradient before the tz sum
  std::vector<float> dw_shard;  // (shard_numel) reduced gradient shard before accumulation
  std::vector<float> db;        // (out_local) partial bias gradient before the tz sum
  // The block the last acquire (or forward) made current: w_block, or with tz = 1 the shard.
  const float* w_used = nullptr;

  // ---- overlap of communication with computation; the defaults give the blocking behaviour ----
  // Weight gathers: w_block holds (or is receiving, gather_req pending) the block of the layer
  // with key cached_key (-1: nothing reusable). A caller passing keys >= 0 (e.g. the layer index)
  // gets a prefetched block without waiting, and no second gather when the block is still there.
  int cached_key = -1;
  comm::Request gather_req;
  // Backward: the dX all-reduce runs during the dW GEMM (false: after it, to measure).
  bool overlap_dx = true;
  // Backward: leave the dW reduce-scatter and the bias all-reduce in flight when returning
  // (tensor_linear_finish completes them into the destinations given to the backward).
  bool defer_reduce = false;
  comm::Request dw_req, db_req;
  float* dw_dst = nullptr;
  float* db_dst = nullptr;
  // GEMM layout tuning (kernels/gemm_tuner.hpp): when set, the layer's three fp32 GEMMs run
  // through the tuner (tuned the first time each shape is seen, its fastest form used from then
  // on).
  kernels::GemmTuner* tuner = nullptr;

  // ---- bf16 mixed precision (set: bf16 GEMM operands, fp32 accumulation and output) ----
  // The activations and output gradients a GEMM reads are rounded into this scratch (shared by
  // the layers: `a` holds activations, `b` output gradients), the weight block into w16. The
  // parameters, the biases (added in fp32), the gradients and every collective stay fp32.
  kernels::cpu::Bf16Scratch* bf16 = nullptr;
  // The bf16 copy of the block of layer w16_key (-1: none). Kept until the next invalidate, so a
  // workspace that serves one layer only converts its block once per step.
  std::vector<std::uint16_t> w16;
  int w16_key = -1;
  // The output gradient the last dX GEMM rounded into bf16->b (while bf16->b_owner is this
  // workspace): the dW GEMM that follows on the same gradient reads it instead of rounding again.
  const float* dy16 = nullptr;
  // The partial sums over the input axis (forward) and the input gradient's over the output axis
  // travel in bf16 (rounded, summed as bf16 at every addition, widened back): half the bytes;
  // sum16 and dx_sum16 hold them on the wire.
  bool bf16_wire = false;
  std::vector<std::uint16_t> sum16, dx_sum16;
  // The bf16 copy of the input that the caller keeps for the current call (null: none): the
  // forward GEMM rounds its input into it instead of the shared scratch, and the weight-gradient
  // GEMM reads it as is, so the caller need not keep the fp32 input between the two.
  std::uint16_t* x16 = nullptr;
};

// ---- the slices of global tensors that a rank holds (for tests, checkpoints, initialisation) ----
// w_block (out_local, in_local) <- W (out, in)
void extract_weight_block(const TensorLinearLayout& l, const float* w, float* w_block);
// w_shard (shard_numel) <- W (out, in)
void extract_weight_shard(const TensorLinearLayout& l, const float* w, float* w_shard);
// b_local (out_local) <- b (out)
void extract_bias(const TensorLinearLayout& l, const float* b, float* b_local);
// x_local (n_global/tz, in_local) <- x (n_global, in)
void extract_input(const TensorLinearLayout& l, const float* x, std::int64_t n_global,
                   float* x_local);
// y_local (n_global/tz, out_local) <- y (n_global, out)
void extract_output(const TensorLinearLayout& l, const float* y, std::int64_t n_global,
                    float* y_local);

// ---- the layer's GEMMs in the workspace's precision (fp32, or bf16 operands if ws.bf16) ----
// w: the fp32 block (out, in) of layer `key` (-1: not cached, converted on every call).
// y (n, out) = x (n, in) @ w^T  [+ y if beta = 1]
void linear_gemm_forward(TensorLinearWorkspace& ws, kernels::GemmLibrary lib, std::int64_t n,
                         int out, int in, const float* x, const float* w, int key, float beta,
                         float* y);
// dx (n, in) = dy (n, out) @ w (overwrites)
void linear_gemm_dx(TensorLinearWorkspace& ws, kernels::GemmLibrary lib, std::int64_t n, int in,
                    int out, const float* dy, const float* w, int key, float* dx);
// dw (out, in) = dy^T (out, n) @ x (n, in)  [+ dw if beta = 1]
void linear_gemm_dw(TensorLinearWorkspace& ws, kernels::GemmLibrary lib, int out, int in,
                    std::int64_t n, const float* dy, const float* x, float beta, float* dw);

// ---- the layer; n = local rows ----
// w_block (block_numel) <- all-gather of w_shard (shard_numel) over tz.
void tensor_linear_gather_weight(const TensorLinearLayout& l, const TensorLinearComms& c,
                                 const float* w_shard, float* w_block);
// Starts gathering the block of layer `key` into ws.w_block (non-blocking) unless it is there
// already. The next forward or acquire with the same key waits for it instead of gathering.
void tensor_linear_prefetch_weight(const TensorLinearLayout& l, const TensorLinearComms& c,
                                   const float* w_shard, TensorLinearWorkspace& ws, int key);
// Makes ws.w_block hold the block of layer `key` (waits for its prefetch, or gathers now; key -1
// always gathers) and returns it.
const float* tensor_linear_acquire_weight(const TensorLinearLayout& l, const TensorLinearComms& c,
                                          const float* w_shard, TensorLinearWorkspace& ws, int key);
// Forget the cached block (the weights changed). Waits for a gather in flight.
void tensor_linear_invalidate(TensorLinearWorkspace& ws);
// Completes a deferred weight-gradient reduce-scatter / bias all-reduce (no-op if none), adding
// the results into the destinations given to tensor_linear_backward.
void tensor_linear_finish(TensorLinearWorkspace& ws);
// Drives the workspace's requests in flight (Open MPI has no progress thread).
void tensor_linear_progress(TensorLinearWorkspace& ws);

// y (n, out_local) = x (n, in_local) @ W_block^T summed over the input axis, + b_local (out_local,
// may be null). Gathers the block into ws.w_block (left there for the backward).
// key: as in tensor_linear_acquire_weight (-1: gather now). accumulate: y += instead (only without
// a split of the input axis, where there is no partial sum to reduce: fuses a residual add).
void tensor_linear_forward(kernels::GemmLibrary lib, const TensorLinearLayout& l,
                           const TensorLinearComms& c, float* y, const float* x,
                           const float* w_shard, const float* bias, std::int64_t n,
                           TensorLinearWorkspace& ws, int key = -1, bool accumulate = false);

// dx (n, in_local) = dy @ W_block summed over the output axis (overwrite; skipped if null, and so
// is its all-reduce: decide it per layer, identically on every rank);
// dw_shard (shard_numel) += this rank's shard of sum over tz of dy^T @ x;
// db (out_local) += sum over rows and over tz of dy (skipped if null).
// dy (n, out_local), x (n, in_local) as given to the forward, w_block (block_numel) the gathered
// block (normally ws.w_block after the forward).
void tensor_linear_backward(kernels::GemmLibrary lib, const TensorLinearLayout& l,
                            const TensorLinearComms& c, float* dx, float* dw_shard, float* db,
                            const float* dy, const float* x, const float* w_block, std::int64_t n,
                            TensorLinearWorkspace& ws);

// tensor_linear_backward in two calls, so that work can run between them (the caller's own
// element-wise op on dx, e.g. GELU's backward after the weight gradient): the first computes dx
// and starts its all-reduce (returned; waited by the second), the second computes dw and db and
// waits for dx. The collectives start in the same order as in tensor_linear_backward.
comm::Request tensor_linear_backward_input(kernels::GemmLibrary lib, const TensorLinearLayout& l,
                                           const TensorLinearComms& c, float* dx, const float* dy,
                                           const float* w_block, std::int64_t n,
                                           TensorLinearWorkspace& ws);
void tensor_linear_backward_weight(kernels::GemmLibrary lib, const TensorLinearLayout& l,
                                   const TensorLinearComms& c, float* dw_shard, float* db,
                                   const float* dy, const float* x, std::int64_t n,
                                   TensorLinearWorkspace& ws, comm::Request& dx_req);

}  // namespace tessera::parallel
