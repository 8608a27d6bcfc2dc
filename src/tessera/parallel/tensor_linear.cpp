#include "tessera/parallel/tensor_linear.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/parallel/sharding.hpp"

namespace tessera::parallel {

using comm::Axis;

std::int64_t TensorLinearLayout::local_rows(std::int64_t n_global) const {
  return rows_per_part(n_global, tz);
}

std::int64_t TensorLinearLayout::row_offset(std::int64_t n_global) const {
  return local_rows(n_global) * tz_index;
}

TensorLinearLayout make_tensor_linear_layout(const comm::Topology& topo, int in, int out,
                                             bool transposed) {
  TensorLinearLayout l;
  l.in = in;
  l.out = out;
  l.transposed = transposed;
  l.in_axis = transposed ? Axis::TY : Axis::TX;
  l.out_axis = transposed ? Axis::TX : Axis::TY;
  l.in_parts = topo.shape().size(l.in_axis);
  l.out_parts = topo.shape().size(l.out_axis);
  l.in_index = topo.coord(l.in_axis);
  l.out_index = topo.coord(l.out_axis);
  l.tz = topo.shape().tz;
  l.tz_index = topo.coord(Axis::TZ);
  if (in <= 0 || out <= 0)
    throw Error(fmt::format("a linear layer needs positive sizes, got in={} out={}", in, out));
  if (in % l.in_parts != 0)
    throw Error(fmt::format("linear in_features={} is not divisible by {}={}", in, l.in_parts,
                            comm::axis_name(l.in_axis)),
                "choose tx and ty that divide the model's hidden sizes");
  if (out % l.out_parts != 0)
    throw Error(fmt::format("linear out_features={} is not divisible by {}={}", out, l.out_parts,
                            comm::axis_name(l.out_axis)),
                "choose tx and ty that divide the model's hidden sizes");
  l.in_local = in / l.in_parts;
  l.out_local = out / l.out_parts;
  l.in_offset = l.in_index * l.in_local;
  l.out_offset = l.out_index * l.out_local;
  l.block_numel = static_cast<std::int64_t>(l.in_local) * l.out_local;
  // The block is sharded over tz by tessera's one convention (parallel/sharding.hpp).
  const auto block = static_cast<std::size_t>(l.block_numel);
  l.shard_counts = shard_counts(block, l.tz, 0, block);
  l.shard_offset = static_cast<std::int64_t>(shard_begin(block, l.tz, l.tz_index));
  l.shard_numel = static_cast<std::int64_t>(l.shard_counts[l.tz_index]);
  return l;
}

TensorLinearComms tensor_linear_comms(comm::Runtime& rt, const comm::Topology& topo,
                                      bool transposed) {
  comm::Communicator* tx = &rt.group(topo, comm::AxisSet{Axis::TX});
  comm::Communicator* ty = &rt.group(topo, comm::AxisSet{Axis::TY});
  comm::Communicator* tz = &rt.group(topo, comm::AxisSet{Axis::TZ});
  TensorLinearComms c;
  c.in_group = transposed ? ty : tx;
  c.out_group = transposed ? tx : ty;
  c.depth = tz;
  return c;
}

TensorLinearWorkspace::TensorLinearWorkspace(const TensorLinearLayout& l)
    : w_block(l.tz > 1 ? l.block_numel : 0, 0.0f),
      dw_block(l.tz > 1 ? l.block_numel : 0, 0.0f),
      dw_shard(l.tz > 1 ? l.shard_numel : 0, 0.0f),
      db(l.tz > 1 ? l.out_local : 0, 0.0f) {}

// ---- slices of global tensors ----

void extract_weight_block(const TensorLinearLayout& l, const float* w, float* w_block) {
  for (int o = 0; o < l.out_local; ++o) {
    const float* src = w + static_cast<std::int64_t>(l.out_offset + o) * l.in + l.in_offset;
    std::copy(src, src + l.in_local, w_block + static_cast<std::int64_t>(o) * l.in_local);
  }
}

void extract_weight_shard(const TensorLinearLayout& l, const float* w, float* w_shard) {
  std::vector<float> block(l.block_numel);
  extract_weight_block(l, w, block.data());
  std::copy(block.begin() + l.shard_offset, block.begin() + l.shard_offset + l.shard_numel,
            w_shard);
}

void extract_bias(const TensorLinearLayout& l, const float* b, float* b_local) {
  std::copy(b + l.out_offset, b + l.out_offset + l.out_local, b_local);
}

namespace {
void extract_rows_cols(const float* src, std::int64_t cols, std::int64_t row0, std::int64_t rows,
                       std::int64_t col0, std::int64_t ncols, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = src + (row0 + r) * cols + col0;
    std::copy(s, s + ncols, dst + r * ncols);
  }
}
}  // namespace

void extract_input(const TensorLinearLayout& l, const float* x, std::int64_t n_global,
                   float* x_local) {
  extract_rows_cols(x, l.in, l.row_offset(n_global), l.local_rows(n_global), l.in_offset,
                    l.in_local, x_local);
}

void extract_output(const TensorLinearLayout& l, const float* y, std::int64_t n_global,
                    float* y_local) {
  extract_rows_cols(y, l.out, l.row_offset(n_global), l.local_rows(n_global), l.out_offset,
                    l.out_local, y_local);
}

// ---- the layer ----

namespace {

// gemm() of kernels/gemm.hpp, through the workspace's tuner when it has one.
void fp32_gemm(TensorLinearWorkspace& ws, kernels::GemmLibrary lib, bool ta, bool tb,
               std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
               const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (ws.tuner)
    ws.tuner->run(lib, kernels::GemmShape{ta, tb, M, N, K}, 1.0f, A, lda, B, ldb, beta, C, ldc);
  else
    kernels::gemm(lib, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

// The bf16 copy of the (out, in) block w of layer `key`: converted unless the workspace holds it.
const std::uint16_t* weight_bf16(TensorLinearWorkspace& ws, const float* w, std::int64_t numel,
                                 int key) {
  if (key < 0 || ws.w16_key != key || static_cast<std::int64_t>(ws.w16.size()) != numel) {
    ws.w16.resize(static_cast<std::size_t>(numel));
    kernels::cpu::to_bf16(ws.w16.data(), w, numel);
    ws.w16_key = key;
  }
  return ws.w16.data();
}

// Sums y (n) over g: in fp32, or (bf16) rounded into buf, summed as bf16 and widened back into y
// when the request completes. A group of one sums nothing and rounds nothing.
comm::Request sum_over(comm::Communicator& g, float* y, std::size_t n,
                       std::vector<std::uint16_t>& buf, bool bf16) {
  if (!bf16 || g.size() == 1) return g.iall_reduce_sum(y, n);
  buf.resize(n);
  std::uint16_t* b = buf.data();
  const auto len = static_cast<std::int64_t>(n);
  kernels::cpu::to_bf16(b, y, len);
  return g.iall_reduce_sum_bf16(b, n).then([y, b, len] { kernels::cpu::from_bf16(y, b, len); });
}

// db (cols) += the column sums of dy (rows, cols).
void add_column_sums(float* db, const float* dy, std::int64_t rows, int cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * cols;
    for (int o = 0; o < cols; ++o) db[o] += row[o];
  }
}

}  // namespace

void linear_gemm_forward(TensorLinearWorkspace& ws, kernels::GemmLibrary lib, std::int64_t n,
                         int out, int in, const float* x, const float* w, int key, float beta,
                         float* y) {
  if (!ws.bf16) return fp32_gemm(ws, lib, false, true, n, out, in, x, in, w, in, beta, y, out);
  const std::uint16_t* x16 = ws.x16;
  if (x16)
    kernels::cpu::to_bf16(ws.x16, x, n * in);
  else
    x16 = kernels::cpu::Bf16Scratch::round(ws.bf16->a, x, n * in);
  const std::uint16_t* w16 = weight_bf16(ws, w, static_cast<std::int64_t>(out) * in, key);
  kernels::gemm_bf16(false, true, n, out, in, 1.0f, x16, in, w16, in, beta, y, out);
}

void linear_gemm_dx(TensorLinearWorkspace& ws, kernels::GemmLibrary lib, std::int64_t n, int in,
                    int out, const float* dy, const float* w, int key, float* dx) {
  if (!ws.bf16) return fp32_gemm(ws, lib, false, false, n, in, out, dy, out, w, in, 0.0f, dx, in);
  const std::uint16_t* dy16 = kernels::cpu::Bf16Scratch::round(ws.bf16->b, dy, n * out);
  ws.bf16->b_owner = &ws;  // the dW GEMM of this gradient may read it again
  ws.dy16 = dy;
  const std::uint16_t* w16 = weight_bf16(ws, w, static_cast<std::int64_t>(out) * in, key);
  kernels::gemm_bf16(false, false, n, in, out, 1.0f, dy16, out, w16, in, 0.0f, dx, in);
}

void linear_gemm_dw(TensorLinearWorkspace& ws, kernels::GemmLibrary lib, int out, int in,
                    std::int64_t n, const float* dy, const float* x, float beta, float* dw) {
  if (!ws.bf16) return fp32_gemm(ws, lib, true, false, out, in, n, dy, out, x, in, beta, dw, in);
  const bool rounded = ws.bf16->b_owner == &ws && ws.dy16 == dy;  // by the dX GEMM just before
  const std::uint16_t* dy16 =
      rounded ? ws.bf16->b.data() : kernels::cpu::Bf16Scratch::round(ws.bf16->b, dy, n * out);
  ws.bf16->b_owner = nullptr;
  ws.dy16 = nullptr;
  const std::uint16_t* x16 =
      ws.x16 ? ws.x16 : kernels::cpu::Bf16Scratch::round(ws.bf16->a, x, n * in);
  kernels::gemm_bf16(true, false, out, in, n, 1.0f, dy16, out, x16, in, beta, dw, in);
}

void tensor_linear_gather_weight(const TensorLinearLayout& l, const TensorLinearComms& c,
                                 const float* w_shard, float* w_block) {
  TESSERA_CHECK(c.depth && c.depth->size() == l.tz, "tz communicator does not match the layout");
  c.depth->iall_gather(w_shard, w_block, l.shard_counts).wait();
}

void tensor_linear_prefetch_weight(const TensorLinearLayout& l, const TensorLinearComms& c,
                                   const float* w_shard, TensorLinearWorkspace& ws, int key) {
  TESSERA_CHECK(c.depth && c.depth->size() == l.tz, "tz communicator does not match the layout");
  if (key >= 0 && ws.cached_key == key) return;
  if (l.tz == 1) {  // the shard is the block
    ws.w_used = w_shard;
    ws.cached_key = key;
    return;
  }
  ws.gather_req.wait();
  ws.gather_req = c.depth->iall_gather(w_shard, ws.w_block.data(), l.shard_counts);
  ws.cached_key = key;
}

const float* tensor_linear_acquire_weight(const TensorLinearLayout& l, const TensorLinearComms& c,
                                          const float* w_shard, TensorLinearWorkspace& ws,
                                          int key) {
  if (l.tz == 1) {  // the shard is the block
    ws.w_used = w_shard;
    ws.cached_key = key;
    return w_shard;
  }
  if (key < 0 || ws.cached_key != key) {
    ws.gather_req.wait();
    tensor_linear_gather_weight(l, c, w_shard, ws.w_block.data());
    ws.cached_key = key;
  }
  ws.gather_req.wait();
  ws.w_used = ws.w_block.data();
  return ws.w_used;
}

void tensor_linear_invalidate(TensorLinearWorkspace& ws) {
  ws.gather_req.wait();
  ws.cached_key = -1;
  ws.w16_key = -1;
}

void tensor_linear_finish(TensorLinearWorkspace& ws) {
  if (ws.dw_dst) {
    ws.dw_req.wait();
    const std::size_t m = ws.dw_shard.size();
    for (std::size_t i = 0; i < m; ++i) ws.dw_dst[i] += ws.dw_shard[i];
    ws.dw_dst = nullptr;
  }
  if (ws.db_dst) {
    ws.db_req.wait();
    for (std::size_t o = 0; o < ws.db.size(); ++o) ws.db_dst[o] += ws.db[o];
    ws.db_dst = nullptr;
  }
}

void tensor_linear_progress(TensorLinearWorkspace& ws) {
  ws.gather_req.test();
  ws.dw_req.test();
  ws.db_req.test();
}

void tensor_linear_forward(kernels::GemmLibrary lib, const TensorLinearLayout& l,
                           const TensorLinearComms& c, float* y, const float* x,
                           const float* w_shard, const float* bias, std::int64_t n,
                           TensorLinearWorkspace& ws, int key, bool accumulate) {
  TESSERA_CHECK(c.in_group && c.in_group->size() == l.in_parts,
                "input-axis communicator does not match the layout");
  TESSERA_CHECK(!accumulate || l.in_parts == 1, "accumulate needs an unsplit input axis");
  TESSERA_CHECK(static_cast<std::int64_t>(ws.w_block.size()) == (l.tz > 1 ? l.block_numel : 0),
                "workspace was built for another layout");
  const float* w = tensor_linear_acquire_weight(l, c, w_shard, ws, key);
  // y (n, out_local) = x (n, in_local) @ w_block^T: the partial sum over this rank's in-range.
  linear_gemm_forward(ws, lib, n, l.out_local, l.in_local, x, w, key, accumulate ? 1.0f : 0.0f, y);
  if (l.in_parts > 1)
    sum_over(*c.in_group, y, static_cast<std::size_t>(n) * l.out_local, ws.sum16, ws.bf16_wire)
        .wait();
  // The bias once, after the sum (each input-axis rank adds it to its copy of the full sum).
  if (bias) {
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      float* row = y + r * l.out_local;
      for (int o = 0; o < l.out_local; ++o) row[o] += bias[o];
    }
  }
}

namespace {
void check_backward(const TensorLinearLayout& l, const TensorLinearComms& c,
                    const TensorLinearWorkspace& ws) {
  TESSERA_CHECK(c.out_group && c.out_group->size() == l.out_parts,
                "output-axis communicator does not match the layout");
  TESSERA_CHECK(c.depth && c.depth->size() == l.tz, "tz communicator does not match the layout");
  const bool z = l.tz > 1;
  TESSERA_CHECK(static_cast<std::int64_t>(ws.dw_block.size()) == (z ? l.block_numel : 0) &&
                    static_cast<std::int64_t>(ws.dw_shard.size()) == (z ? l.shard_numel : 0) &&
                    static_cast<int>(ws.db.size()) == (z ? l.out_local : 0),
                "workspace was built for another layout");
}
}  // namespace

comm::Request tensor_linear_backward_input(kernels::GemmLibrary lib, const TensorLinearLayout& l,
                                           const TensorLinearComms& c, float* dx, const float* dy,
                                           const float* w_block, std::int64_t n,
                                           TensorLinearWorkspace& ws) {
  check_backward(l, c, ws);
  tensor_linear_finish(ws);  // a deferred reduction of an earlier call still owns the buffers
  // dx (n, in_local) = dy (n, out_local) @ w_block (out_local, in_local): partial over this
  // rank's out-range; its all-reduce over the output axis runs during the weight-gradient GEMM.
  comm::Request dx_req;
  if (!dx) return dx_req;
  linear_gemm_dx(ws, lib, n, l.in_local, l.out_local, dy, w_block, ws.cached_key, dx);
  dx_req = sum_over(*c.out_group, dx, static_cast<std::size_t>(n) * l.in_local, ws.dx_sum16,
                    ws.bf16_wire);
  if (!ws.overlap_dx) dx_req.wait();  // the measured baseline: no overlap with the dW GEMM
  return dx_req;
}

void tensor_linear_backward_weight(kernels::GemmLibrary lib, const TensorLinearLayout& l,
                                   const TensorLinearComms& c, float* dw_shard, float* db,
                                   const float* dy, const float* x, std::int64_t n,
                                   TensorLinearWorkspace& ws, comm::Request& dx_req) {
  check_backward(l, c, ws);
  if (l.tz == 1) {  // the shard is the block: accumulate in place, nothing to reduce
    linear_gemm_dw(ws, lib, l.out_local, l.in_local, n, dy, x, 1.0f, dw_shard);
    if (db) add_column_sums(db, dy, n, l.out_local);
    dx_req.wait();
    return;
  }
  // dw_block (out_local, in_local) = dy^T @ x over this rank's rows, then summed over the batch
  // shards of tz and scattered: this rank receives its shard.
  linear_gemm_dw(ws, lib, l.out_local, l.in_local, n, dy, x, 0.0f, ws.dw_block.data());
  dx_req.test();  // drive progress (Open MPI has no progress thread)
  comm::Request dw_req =
      c.depth->ireduce_scatter_sum(ws.dw_block.data(), ws.dw_shard.data(), l.shard_counts);
  // db (out_local): column sums of dy, summed over tz (complete over the input axis already).
  comm::Request db_req;
  if (db) {
    std::fill(ws.db.begin(), ws.db.end(), 0.0f);
    add_column_sums(ws.db.data(), dy, n, l.out_local);
    db_req = c.depth->iall_reduce_sum(ws.db.data(), ws.db.size());
  }
  dx_req.wait();
  ws.dw_req = std::move(dw_req);
  ws.db_req = std::move(db_req);
  ws.dw_dst = dw_shard;
  ws.db_dst = db;
  if (!ws.defer_reduce) tensor_linear_finish(ws);
}

void tensor_linear_backward(kernels::GemmLibrary lib, const TensorLinearLayout& l,
                            const TensorLinearComms& c, float* dx, float* dw_shard, float* db,
                            const float* dy, const float* x, const float* w_block, std::int64_t n,
                            TensorLinearWorkspace& ws) {
  comm::Request dx_req = tensor_linear_backward_input(lib, l, c, dx, dy, w_block, n, ws);
  tensor_linear_backward_weight(lib, l, c, dw_shard, db, dy, x, n, ws, dx_req);
}

}  // namespace tessera::parallel
