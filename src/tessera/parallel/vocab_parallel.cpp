#include "tessera/parallel/vocab_parallel.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/kernels/cpu/vec_math.hpp"
#include "tessera/parallel/sharding.hpp"

namespace tessera::parallel {

using comm::Axis;

std::int64_t VocabParallelLayout::local_rows(std::int64_t n_global) const {
  return rows_per_part(n_global, tz);
}

std::int64_t VocabParallelLayout::row_offset(std::int64_t n_global) const {
  return local_rows(n_global) * tz_index;
}

VocabParallelLayout make_vocab_parallel_layout(const comm::Topology& topo, int vocab,
                                               int padded_vocab, int channels) {
  VocabParallelLayout l;
  l.vocab = vocab;
  l.padded_vocab = padded_vocab;
  l.channels = channels;
  l.tx = topo.shape().tx;
  l.ty = topo.shape().ty;
  l.tz = topo.shape().tz;
  l.tx_index = topo.coord(Axis::TX);
  l.ty_index = topo.coord(Axis::TY);
  l.tz_index = topo.coord(Axis::TZ);
  if (vocab <= 0 || channels <= 0 || padded_vocab < vocab)
    throw Error(
        fmt::format("a vocabulary-parallel embedding needs 0 < V <= Vp and C > 0, got V={} "
                    "Vp={} C={}",
                    vocab, padded_vocab, channels));
  l.vocab_parts = l.tx * l.ty;
  l.vocab_index = topo.group_rank(comm::AxisSet{Axis::TX, Axis::TY});
  if (padded_vocab % l.vocab_parts != 0)
    throw Error(fmt::format("the padded vocabulary {} is not divisible by tx*ty={}", padded_vocab,
                            l.vocab_parts),
                "the vocabulary is padded to a multiple of 128: use tx*ty dividing 128");
  if (channels % l.tx != 0)
    throw Error(fmt::format("n_embd={} is not divisible by tx={}", channels, l.tx),
                "choose tx dividing the model's hidden size");
  l.vocab_local = padded_vocab / l.vocab_parts;
  l.vocab_offset = l.vocab_index * l.vocab_local;
  l.real_local = std::clamp(vocab - l.vocab_offset, 0, l.vocab_local);
  l.c_local = channels / l.tx;
  l.c_offset = l.tx_index * l.c_local;
  l.block_numel = static_cast<std::int64_t>(l.vocab_local) * channels;
  // The block is sharded over tz by tessera's one convention (parallel/sharding.hpp).
  const auto block = static_cast<std::size_t>(l.block_numel);
  l.shard_counts = shard_counts(block, l.tz, 0, block);
  l.shard_offset = static_cast<std::int64_t>(shard_begin(block, l.tz, l.tz_index));
  l.shard_numel = static_cast<std::int64_t>(l.shard_counts[l.tz_index]);
  return l;
}

VocabParallelComms vocab_parallel_comms(comm::Runtime& rt, const comm::Topology& topo) {
  VocabParallelComms c;
  c.tx = &rt.group(topo, comm::AxisSet{Axis::TX});
  c.ty = &rt.group(topo, comm::AxisSet{Axis::TY});
  c.depth = &rt.group(topo, comm::AxisSet{Axis::TZ});
  c.vocab = &rt.group(topo, comm::AxisSet{Axis::TX, Axis::TY});
  return c;
}

VocabParallelWorkspace::VocabParallelWorkspace(const VocabParallelLayout& l, std::int64_t n,
                                               int max_t)
    : n_local(n),
      // without tz the shard is the block: the weight and its gradient are used in place
      w_block(l.tz > 1 ? l.block_numel : 0, 0.0f),
      dw_block(l.tz > 1 ? l.block_numel : 0, 0.0f),
      dw_shard(l.tz > 1 ? l.shard_numel : 0, 0.0f),
      h_full(n * l.channels, 0.0f),
      cols(n * l.channels, 0.0f),
      logits(n * l.vocab_local, 0.0f),
      row_max(n, 0.0),
      row_sums(2 * n, 0.0f),
      dwpe(static_cast<std::size_t>(max_t) * l.c_local, 0.0f),
      tx_counts(l.tx, static_cast<std::size_t>(n * l.c_local)) {}

// ---- slices of global tensors ----

namespace {
void extract_rows_cols(const float* src, std::int64_t cols, std::int64_t row0, std::int64_t rows,
                       std::int64_t col0, std::int64_t ncols, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = src + (row0 + r) * cols + col0;
    std::copy(s, s + ncols, dst + r * ncols);
  }
}

void check_workspace(const VocabParallelLayout& l, const VocabParallelWorkspace& ws,
                     std::int64_t n) {
  TESSERA_CHECK(
      static_cast<std::int64_t>(ws.w_block.size()) == (l.tz > 1 ? l.block_numel : 0) &&
          static_cast<std::int64_t>(ws.dw_shard.size()) == (l.tz > 1 ? l.shard_numel : 0) &&
          static_cast<int>(ws.tx_counts.size()) == l.tx,
      "workspace was built for another layout");
  TESSERA_CHECK(n <= ws.n_local, "workspace was built for {} rows, called with {}", ws.n_local, n);
}

void check_comms(const VocabParallelLayout& l, const VocabParallelComms& c) {
  TESSERA_CHECK(c.tx && c.tx->size() == l.tx && c.ty && c.ty->size() == l.ty && c.depth &&
                    c.depth->size() == l.tz && c.vocab && c.vocab->size() == l.vocab_parts &&
                    c.vocab->rank() == l.vocab_index,
                "communicators do not match the layout");
}

// The rank's vocabulary block of wte: all-gathered over tz into the workspace, or (tz = 1) the
// shard itself. Remembered for the LM head's backward.
const float* weight_block(const VocabParallelLayout& l, const VocabParallelComms& c,
                          const float* wte_shard, VocabParallelWorkspace& ws) {
  if (l.tz > 1) {
    vocab_gather_weight(l, c, wte_shard, ws.w_block.data());
    ws.w_used = ws.w_block.data();
  } else {
    ws.w_used = wte_shard;
  }
  return ws.w_used;
}

// The bf16 copy of the block the forward uses (bf16 mixed precision): converted unless valid (a
// gathered block is converted on every forward; the shard once per change of the weights).
const std::uint16_t* weight_block_bf16(const VocabParallelLayout& l, VocabParallelWorkspace& ws) {
  if (!ws.w16_valid || l.tz > 1) {
    ws.w16.resize(static_cast<std::size_t>(l.block_numel));
    kernels::cpu::to_bf16(ws.w16.data(), ws.w_used, l.block_numel);
    ws.w16_valid = l.tz == 1;
  }
  return ws.w16.data();
}

// The tx counts of a call with n rows (n <= ws.n_local).
std::vector<std::size_t> tx_counts(const VocabParallelLayout& l, std::int64_t n) {
  return std::vector<std::size_t>(l.tx, static_cast<std::size_t>(n * l.c_local));
}
}  // namespace

void extract_vocab_weight_block(const VocabParallelLayout& l, const float* wte, float* w_block) {
  const float* src = wte + static_cast<std::int64_t>(l.vocab_offset) * l.channels;
  std::copy(src, src + l.block_numel, w_block);
}

void extract_vocab_weight_shard(const VocabParallelLayout& l, const float* wte, float* w_shard) {
  const float* src = wte + static_cast<std::int64_t>(l.vocab_offset) * l.channels;
  std::copy(src + l.shard_offset, src + l.shard_offset + l.shard_numel, w_shard);
}

void extract_vocab_wpe(const VocabParallelLayout& l, const float* wpe, int rows, float* wpe_local) {
  extract_rows_cols(wpe, l.channels, 0, rows, l.c_offset, l.c_local, wpe_local);
}

void extract_vocab_activation(const VocabParallelLayout& l, const float* x, std::int64_t n_global,
                              float* x_local) {
  extract_rows_cols(x, l.channels, l.row_offset(n_global), l.local_rows(n_global), l.c_offset,
                    l.c_local, x_local);
}

void extract_vocab_logits(const VocabParallelLayout& l, const float* logits, std::int64_t n_global,
                          float* logits_local) {
  extract_rows_cols(logits, l.padded_vocab, l.row_offset(n_global), l.local_rows(n_global),
                    l.vocab_offset, l.vocab_local, logits_local);
}

void extract_vocab_rows(const VocabParallelLayout& l, const std::int32_t* ids,
                        std::int64_t n_global, std::int32_t* ids_local) {
  const std::int64_t r0 = l.row_offset(n_global);
  std::copy(ids + r0, ids + r0 + l.local_rows(n_global), ids_local);
}

// ---- the layers ----

void vocab_gather_weight(const VocabParallelLayout& l, const VocabParallelComms& c,
                         const float* w_shard, float* w_block) {
  TESSERA_CHECK(c.depth && c.depth->size() == l.tz, "tz communicator does not match the layout");
  c.depth->iall_gather(w_shard, w_block, l.shard_counts).wait();
}

void vocab_embedding_forward(const VocabParallelLayout& l, const VocabParallelComms& c, float* out,
                             const std::int32_t* ids, const float* wte_shard,
                             const float* wpe_local, std::int64_t n_global, int T,
                             VocabParallelWorkspace& ws) {
  check_comms(l, c);
  const std::int64_t n = l.local_rows(n_global), r0 = l.row_offset(n_global);
  check_workspace(l, ws, n);
  for (std::int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= l.padded_vocab)
      throw Error(
          fmt::format("token id {} is outside the embedding of {} rows", ids[i], l.padded_vocab),
          "the data was tokenized with a larger vocabulary than model.vocab_size");
  const float* W = weight_block(l, c, wte_shard, ws);
  // Partial lookups in channel-block-major order (tx, n, C/tx): this rank's rows of wte where it
  // owns the id, zeros elsewhere. Exactly one rank of the vocab group contributes each row, so
  // the sums below add zeros only (exact).
  const std::int64_t cl = l.c_local;
  float* part = ws.cols.data();
  std::fill(part, part + n * l.channels, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    if (!l.owns(ids[i])) continue;
    const float* e = W + static_cast<std::int64_t>(ids[i] - l.vocab_offset) * l.channels;
    for (int j = 0; j < l.tx; ++j) std::copy(e + j * cl, e + (j + 1) * cl, part + (j * n + i) * cl);
  }
  c.tx->ireduce_scatter_sum(part, out, tx_counts(l, n)).wait();
  c.ty->iall_reduce_sum(out, static_cast<std::size_t>(n * cl)).wait();
  if (!wpe_local) return;  // no learned positions (llama)
  for (std::int64_t i = 0; i < n; ++i) {
    const float* p = wpe_local + ((r0 + i) % T) * cl;
    float* o = out + i * cl;
    for (std::int64_t k = 0; k < cl; ++k) o[k] += p[k];
  }
}

void vocab_embedding_backward(const VocabParallelLayout& l, const VocabParallelComms& c,
                              float* dwte_shard, float* dwpe_local, const float* dout,
                              const std::int32_t* ids, std::int64_t n_global, int T,
                              VocabParallelWorkspace& ws) {
  check_comms(l, c);
  const std::int64_t n = l.local_rows(n_global), r0 = l.row_offset(n_global);
  check_workspace(l, ws, n);
  TESSERA_CHECK(static_cast<std::int64_t>(ws.dwpe.size()) >= T * l.c_local,
                "workspace was built for shorter sequences");
  const std::int64_t cl = l.c_local;
  // The full C channels of the rank's rows: (tx, n, C/tx).
  c.tx->iall_gather(dout, ws.cols.data(), tx_counts(l, n)).wait();
  // With tz the block's gradient is summed over tz first; without, it accumulates in place.
  float* G = l.tz > 1 ? ws.dw_block.data() : dwte_shard;
  if (l.tz > 1) std::fill(ws.dw_block.begin(), ws.dw_block.end(), 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    if (!l.owns(ids[i])) continue;
    float* g = G + static_cast<std::int64_t>(ids[i] - l.vocab_offset) * l.channels;
    for (int j = 0; j < l.tx; ++j) {
      const float* d = ws.cols.data() + (j * n + i) * cl;
      for (std::int64_t k = 0; k < cl; ++k) g[j * cl + k] += d[k];
    }
  }
  comm::Request dw_req;
  if (l.tz > 1)
    dw_req = c.depth->ireduce_scatter_sum(ws.dw_block.data(), ws.dw_shard.data(), l.shard_counts);
  comm::Request dp_req;
  if (dwpe_local) {
    std::fill(ws.dwpe.begin(), ws.dwpe.begin() + T * cl, 0.0f);
    for (std::int64_t i = 0; i < n; ++i) {
      float* p = ws.dwpe.data() + ((r0 + i) % T) * cl;
      const float* d = dout + i * cl;
      for (std::int64_t k = 0; k < cl; ++k) p[k] += d[k];
    }
    dw_req.test();  // drive progress
    dp_req = c.depth->iall_reduce_sum(ws.dwpe.data(), static_cast<std::size_t>(T * cl));
  }
  dw_req.wait();
  if (l.tz > 1)
    for (std::int64_t e = 0; e < l.shard_numel; ++e) dwte_shard[e] += ws.dw_shard[e];
  if (dwpe_local) {
    dp_req.wait();
    for (std::int64_t e = 0; e < T * cl; ++e) dwpe_local[e] += ws.dwpe[e];
  }
}

void vocab_lm_head_forward(kernels::GemmLibrary lib, const VocabParallelLayout& l,
                           const VocabParallelComms& c, const float* h, const float* wte_shard,
                           std::int64_t n, VocabParallelWorkspace& ws) {
  check_comms(l, c);
  check_workspace(l, ws, n);
  const std::int64_t cl = l.c_local;
  // Start the gather of h over tx, gather the weight block over tz meanwhile.
  comm::Request h_req = c.tx->iall_gather(h, ws.cols.data(), tx_counts(l, n));
  h_req.test();
  const float* W = weight_block(l, c, wte_shard, ws);
  h_req.wait();
  // (tx, n, C/tx) -> h_full (n, C)
  for (std::int64_t i = 0; i < n; ++i)
    for (int j = 0; j < l.tx; ++j) {
      const float* s = ws.cols.data() + (j * n + i) * cl;
      std::copy(s, s + cl, ws.h_full.data() + i * l.channels + j * cl);
    }
  // logits (n, Vr) = h_full (n, C) @ w_block^T (C, Vr)
  if (ws.bf16) {
    const std::uint16_t* h16 =
        kernels::cpu::Bf16Scratch::round(ws.bf16->a, ws.h_full.data(), n * l.channels);
    kernels::gemm_bf16(false, true, n, l.vocab_local, l.channels, 1.0f, h16, l.channels,
                       weight_block_bf16(l, ws), l.channels, 0.0f, ws.logits.data(), l.vocab_local);
    return;
  }
  kernels::gemm(lib, false, true, n, l.vocab_local, l.channels, 1.0f, ws.h_full.data(), l.channels,
                W, l.channels, 0.0f, ws.logits.data(), l.vocab_local);
}

namespace {

// The sharded cross entropy's statistics, row by row: ws.row_max the max logit over the whole
// real vocabulary (a range of padding only contributes -inf), ws.row_sums the sums of exp(z - max)
// and then (at + n) each target's logit (from its owner, zero elsewhere), both summed over the
// ranks. Rows are independent: each loop runs over rows on every thread (the same numbers for any
// thread count).
void sharded_row_stats(const VocabParallelLayout& l, const VocabParallelComms& c,
                       const std::int32_t* targets, std::int64_t n, VocabParallelWorkspace& ws) {
  const int vr = l.vocab_local, real = l.real_local;
  const float* logits = ws.logits.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * vr;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < real; ++j) mx = std::max(mx, z[j]);
    ws.row_max[i] = mx;
  }
  c.vocab->all_reduce_max(ws.row_max.data(), static_cast<std::size_t>(n));
  float* sums = ws.row_sums.data();
  float* target_logit = sums + n;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * vr;
    const float mx = static_cast<float>(ws.row_max[i]);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < real; ++j) s += kernels::cpu::exp_approx(z[j] - mx);
    sums[i] = s;
    target_logit[i] = targets[i] >= 0 && l.owns(targets[i]) ? z[targets[i] - l.vocab_offset] : 0.0f;
  }
  c.vocab->all_reduce_sum(sums, static_cast<std::size_t>(2 * n));
}

// The logits become dloss * (softmax - onehot) over this rank's range; padding and ignored rows
// (target < 0) zero.
void sharded_dlogits(const VocabParallelLayout& l, const std::int32_t* targets, std::int64_t n,
                     float dloss, VocabParallelWorkspace& ws) {
  const int vr = l.vocab_local, real = l.real_local;
  const float* sums = ws.row_sums.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    float* z = ws.logits.data() + i * vr;
    if (targets[i] < 0) {
      std::fill(z, z + vr, 0.0f);
      continue;
    }
    const float mx = static_cast<float>(ws.row_max[i]);
    const float inv = 1.0f / sums[i];
#pragma omp simd
    for (int j = 0; j < real; ++j) z[j] = dloss * kernels::cpu::exp_approx(z[j] - mx) * inv;
    for (int j = real; j < vr; ++j) z[j] = 0.0f;
    if (l.owns(targets[i])) z[targets[i] - l.vocab_offset] -= dloss;
  }
}

}  // namespace

void vocab_cross_entropy(const VocabParallelLayout& l, const VocabParallelComms& c, float* losses,
                         const std::int32_t* targets, std::int64_t n, bool backward, float dloss,
                         VocabParallelWorkspace& ws) {
  check_comms(l, c);
  check_workspace(l, ws, n);
  for (std::int64_t i = 0; i < n; ++i)
    if (targets[i] >= l.vocab)
      throw Error(fmt::format("target token id {} is outside the model's vocabulary of {}",
                              targets[i], l.vocab),
                  "the data was tokenized with a larger vocabulary than model.vocab_size");
  const int vr = l.vocab_local, real = l.real_local;
  float* logits = ws.logits.data();
  if (c.vocab->size() == 1) {  // the whole vocabulary here: the single-rank kernel, row by row
    if (backward)
      kernels::cpu::cross_entropy_forward_backward(losses, logits, targets, n, real, vr, dloss);
    else
      kernels::cpu::cross_entropy_forward(losses, logits, targets, n, real, vr);
    return;
  }
  sharded_row_stats(l, c, targets, n, ws);
  // the loss (as kernels::cpu::cross_entropy_row: lse = max + log(sum); loss = lse - z_target)
  const float* sums = ws.row_sums.data();
  const float* target_logit = sums + n;
  for (std::int64_t i = 0; i < n; ++i) {
    const float lse = static_cast<float>(ws.row_max[i]) + std::log(sums[i]);
    losses[i] = targets[i] < 0 ? 0.0f : lse - target_logit[i];
  }
  if (backward) sharded_dlogits(l, targets, n, dloss, ws);
}

void vocab_lm_head_backward(kernels::GemmLibrary lib, const VocabParallelLayout& l,
                            const VocabParallelComms& c, float* dh, float* dwte_shard,
                            std::int64_t n, VocabParallelWorkspace& ws) {
  check_comms(l, c);
  check_workspace(l, ws, n);
  const std::int64_t cl = l.c_local;
  const float* dlogits = ws.logits.data();
  const float* W = ws.w_used;
  TESSERA_CHECK(W != nullptr, "the LM head's backward needs its forward");
  // 1. partial dh (n, C) = dlogits (n, Vr) @ w_block (Vr, C), written channel-block-major
  //    (tx, n, C/tx) so that the sum over tx lands each channel range on its owner.
  TESSERA_CHECK(!ws.bf16 || static_cast<std::int64_t>(ws.w16.size()) == l.block_numel,
                "the LM head's bf16 backward needs its forward");
  const std::uint16_t* dl16 =
      ws.bf16 ? kernels::cpu::Bf16Scratch::round(ws.bf16->b, dlogits, n * l.vocab_local) : nullptr;
  if (ws.bf16) ws.bf16->b_owner = nullptr;  // `b` is the head's now
  for (int j = 0; j < l.tx; ++j) {
    float* part = ws.cols.data() + j * n * cl;
    if (ws.bf16)
      kernels::gemm_bf16(false, false, n, cl, l.vocab_local, 1.0f, dl16, l.vocab_local,
                         ws.w16.data() + j * cl, l.channels, 0.0f, part, cl);
    else
      kernels::gemm(lib, false, false, n, cl, l.vocab_local, 1.0f, dlogits, l.vocab_local,
                    W + j * cl, l.channels, 0.0f, part, cl);
  }
  comm::Request dh_req = c.tx->ireduce_scatter_sum(ws.cols.data(), dh, tx_counts(l, n));
  // 2. dw_block (Vr, C) = dlogits^T @ h_full over this rank's rows (overlaps the dh sum); without
  //    tz it accumulates straight into the shard's gradient.
  const bool z = l.tz > 1;
  float* dw = z ? ws.dw_block.data() : dwte_shard;
  if (ws.bf16)
    kernels::gemm_bf16(
        true, false, l.vocab_local, l.channels, n, 1.0f, dl16, l.vocab_local,
        kernels::cpu::Bf16Scratch::round(ws.bf16->a, ws.h_full.data(), n * l.channels), l.channels,
        z ? 0.0f : 1.0f, dw, l.channels);
  else
    kernels::gemm(lib, true, false, l.vocab_local, l.channels, n, 1.0f, dlogits, l.vocab_local,
                  ws.h_full.data(), l.channels, z ? 0.0f : 1.0f, dw, l.channels);
  dh_req.wait();
  dh_req = c.ty->iall_reduce_sum(dh, static_cast<std::size_t>(n * cl));
  comm::Request dw_req;
  if (z)
    dw_req = c.depth->ireduce_scatter_sum(ws.dw_block.data(), ws.dw_shard.data(), l.shard_counts);
  dh_req.wait();
  dw_req.wait();
  if (z)
    for (std::int64_t e = 0; e < l.shard_numel; ++e) dwte_shard[e] += ws.dw_shard[e];
}

double vocab_mean_loss(const VocabParallelComms& c, const float* losses,
                       const std::int32_t* targets, std::int64_t n) {
  double acc[2] = {0.0, 0.0};  // sum, count
  for (std::int64_t i = 0; i < n; ++i) {
    if (targets[i] < 0) continue;
    acc[0] += losses[i];
    acc[1] += 1.0;
  }
  c.depth->all_reduce_sum(acc, 2);
  return acc[1] > 0 ? acc[0] / acc[1] : 0.0;
}

}  // namespace tessera::parallel
