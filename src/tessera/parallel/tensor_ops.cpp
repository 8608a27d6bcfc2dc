#include "tessera/parallel/tensor_ops.hpp"

#include <algorithm>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/parallel/tensor_layernorm.hpp"

namespace tessera::parallel {

namespace k = kernels::cpu;

namespace {
// The member of the four (in BlockLinear's order) that linear `id` uses.
template <typename T>
T& pick(BlockLinear id, T& qkv, T& proj, T& fc, T& fcproj) {
  T* const all[] = {&qkv, &proj, &fc, &fcproj};
  return *all[static_cast<int>(id)];
}
}  // namespace

const TensorLinearLayout& TensorBlockGrid::layout(BlockLinear id) const {
  return pick(id, qkv, proj, fc, fcproj);
}

const TensorLinearComms& TensorBlockGrid::comms(BlockLinear id) const {
  return pick(id, qkv_c, proj_c, fc_c, fcproj_c);
}

TensorLinearWorkspace& TensorBlockWorkspace::of(BlockLinear id) {
  return pick(id, qkv, proj, fc, fcproj);
}

void TensorOpsScratch::resize(const TensorBlockGrid& g, std::int64_t n, bool sequence_parallel) {
  row_stats.assign(2 * n, 0.0f);
  norm_params.assign(2 * g.c_local, 0.0f);
  proj_out.assign(n * g.c_local, 0.0f);
  if (sequence_parallel) {
    const std::int64_t wide = std::max({g.qkv.out, g.fc.out, g.proj.in, g.fcproj.in});
    sp_full.assign(n * wide, 0.0f);
    sp_part.assign(n * wide, 0.0f);
  }
}

namespace {

void add_bias_rows(float* y, const float* b, std::int64_t rows, int cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (int o = 0; o < cols; ++o) y[r * cols + o] += b[o];
}

void col_sums_into(float* db, const float* dy, std::int64_t rows, int cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (int o = 0; o < cols; ++o) db[o] += dy[r * cols + o];
}

}  // namespace

BlockLinear TensorOps::which(const float* w) const {
  if (w == w_.qkv_w) return BlockLinear::Qkv;
  if (w == w_.attproj_w) return BlockLinear::Proj;
  if (w == w_.fc_w) return BlockLinear::Fc;
  TESSERA_CHECK(w == w_.fcproj_w, "a linear of another layer");
  return BlockLinear::FcProj;
}

std::int64_t TensorOps::sp_rows() const {
  return n_ / g_.tx->size();
}

// ---- norms: the rank's rows and channels, statistics over tx (N and C: the caller's local
// shape; the rank's own n and cl are used) ----

void TensorOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                  const float* w, const float* b, std::int64_t, int) {
  tensor_layernorm_forward(*g_.tx, out, mean, rstd, inp, w, b, n_, g_.c_local, g_.C,
                           s_.row_stats.data());
}

void TensorOps::layernorm_backward(float* dinp, float*, float* dw, float* db, const float* dout,
                                   const float* inp, const float* w, const float* mean,
                                   const float* rstd, std::int64_t, int) {
  tensor_layernorm_backward(*g_.tx, *g_.tz, dinp, dw, db, dout, inp, w, mean, rstd, n_, g_.c_local,
                            g_.C, s_.row_stats.data(), s_.norm_params.data());
}

void TensorOps::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w,
                                std::int64_t, int, float eps) {
  tensor_rmsnorm_forward(*g_.tx, out, rstd, inp, w, n_, g_.c_local, g_.C, eps, s_.row_stats.data());
}

void TensorOps::rmsnorm_backward(float* dinp, float*, float* dw, const float* dout,
                                 const float* inp, const float* w, const float* rstd, std::int64_t,
                                 int) {
  tensor_rmsnorm_backward(*g_.tx, *g_.tz, dinp, dw, dout, inp, w, rstd, n_, g_.c_local, g_.C,
                          s_.row_stats.data(), s_.norm_params.data());
}

// ---- linears ----

void TensorOps::linear(float* out, const float* inp, const float* w, const float* b, std::int64_t,
                       int, int) {
  const BlockLinear id = which(w);
  const TensorLinearLayout& l = g_.layout(id);
  TESSERA_CHECK(!l.transposed, "linear() is a normal linear (qkv, fc)");
  if (sp_) {
    sp_normal_forward(out, inp, w, b, l.out_local);
    return;
  }
  const KeepInput k = keep(id);
  tensor_linear_forward(lib_, l, g_.comms(id), out, inp, w, b, n_, ws_.of(id), key_);
}

void TensorOps::linear_residual(float* out, const float* residual, const float* inp, const float* w,
                                const float* b, std::int64_t, int, int) {
  const BlockLinear id = which(w);
  const TensorLinearLayout& l = g_.layout(id);
  TESSERA_CHECK(l.transposed, "linear_residual() is a transposed linear (attproj, fcproj)");
  if (!sp_ && l.in_parts == 1) {  // no partial sums: the GEMM adds onto the residual
    k::copy(out, residual, n_ * g_.c_local);
    const KeepInput k = keep(id);
    tensor_linear_forward(lib_, l, g_.comms(id), out, inp, w, b, n_, ws_.of(id), key_, true);
    return;
  }
  float* y = s_.proj_out.data();
  if (sp_) {
    sp_transposed_forward(y, inp, w, b, l.in_local);
  } else {
    const KeepInput k = keep(id);
    tensor_linear_forward(lib_, l, g_.comms(id), y, inp, w, b, n_, ws_.of(id), key_);
  }
  k::add(out, residual, y, n_ * g_.c_local);
}

void TensorOps::linear_gelu(float* out, float* pre, const float* inp, const float* w,
                            const float* b, std::int64_t N, int IC, int OC) {
  linear(pre, inp, w, b, N, IC, OC);
  const std::int64_t rows = sp_ ? sp_rows() : n_;
  k::gelu_forward(out, pre, rows * g_.layout(which(w)).out_local);
}

void TensorOps::linear_backward(float* dinp, float* dw, float* db, const float* dout,
                                const float* inp, const float* w, std::int64_t, int, int) {
  const BlockLinear id = which(w);
  const TensorLinearLayout& l = g_.layout(id);
  if (sp_) {
    if (!l.transposed) {
      sp_normal_backward(dinp, dw, db, dout, inp, w, l.out_local);
    } else {
      sp_transposed_backward_weight(id, dw, db, dout, inp, l.in_local);
      if (dinp) sp_transposed_backward_input(dinp, dout, w, l.in_local);
    }
    return;
  }
  TensorLinearWorkspace& ws = ws_.of(id);
  const KeepInput k = keep(id);
  if (dgelu_dinp_) {  // the second half of GPT-2's fcproj backward
    TESSERA_CHECK(!dinp && id == BlockLinear::FcProj, "fcproj's weight gradient must follow");
    tensor_linear_backward_weight(lib_, l, g_.comms(id), dw, db, dout, inp, n_, ws, dx_pending_);
    k::gelu_backward(dgelu_dinp_, dgelu_pre_, dgelu_dinp_, n_ * l.in_local);
    dgelu_dinp_ = nullptr;
    return;
  }
  tensor_linear_backward(lib_, l, g_.comms(id), dinp, dw, db, dout, inp, ws.w_used, n_, ws);
}

void TensorOps::linear_backward_input_dgelu(float* dinp, const float* dout, const float* w,
                                            const float* pre, std::int64_t, int, int) {
  const BlockLinear id = which(w);
  const TensorLinearLayout& l = g_.layout(id);
  if (sp_) {
    sp_transposed_backward_input(dinp, dout, w, l.in_local);
    k::gelu_backward(dinp, pre, dinp, sp_rows() * l.in_local);
    return;
  }
  TensorLinearWorkspace& ws = ws_.of(id);
  dx_pending_ = tensor_linear_backward_input(lib_, l, g_.comms(id), dinp, dout, ws.w_used, n_, ws);
  dgelu_dinp_ = dinp;
  dgelu_pre_ = pre;
}

// ---- sequence parallelism (ty = tz = 1: the weight shards are the whole blocks) ----

void TensorOps::sp_normal_forward(float* out, const float* inp, const float* w, const float* b,
                                  int OC) {
  const int cl = g_.c_local;
  const std::int64_t ns = sp_rows();
  float* part = s_.sp_part.data();
  linear_gemm_forward(ws_.of(which(w)), lib_, n_, OC, cl, inp, w, key_, 0.0f, part);
  sp_reduce_scatter(part, out, static_cast<std::size_t>(ns) * OC);
  if (b) add_bias_rows(out, b, ns, OC);
}

void TensorOps::sp_transposed_forward(float* out, const float* inp, const float* w, const float* b,
                                      int IC) {
  const int cl = g_.c_local;
  float* full = s_.sp_full.data();
  sp_all_gather(inp, full, static_cast<std::size_t>(sp_rows()) * IC);
  linear_gemm_forward(ws_.of(which(w)), lib_, n_, cl, IC, full, w, key_, 0.0f, out);
  if (b) add_bias_rows(out, b, n_, cl);
}

void TensorOps::sp_normal_backward(float* dinp, float* dw, float* db, const float* dout,
                                   const float* inp, const float* w, int OC) {
  const int cl = g_.c_local;
  float* full = s_.sp_full.data();
  sp_all_gather(dout, full, static_cast<std::size_t>(sp_rows()) * OC);
  TensorLinearWorkspace& ws = ws_.of(which(w));
  if (dinp) linear_gemm_dx(ws, lib_, n_, cl, OC, full, w, key_, dinp);
  linear_gemm_dw(ws, lib_, OC, cl, n_, full, inp, 1.0f, dw);  // bf16: reads full as dX rounded it
  if (db) col_sums_into(db, full, n_, OC);
}

void TensorOps::sp_transposed_backward_input(float* dinp, const float* dout, const float* w,
                                             int IC) {
  const int cl = g_.c_local;
  float* part = s_.sp_part.data();
  linear_gemm_dx(ws_.of(which(w)), lib_, n_, IC, cl, dout, w, key_, part);
  sp_reduce_scatter(part, dinp, static_cast<std::size_t>(sp_rows()) * IC);
}

void TensorOps::sp_transposed_backward_weight(BlockLinear id, float* dw, float* db,
                                              const float* dout, const float* inp, int IC) {
  const int cl = g_.c_local;
  float* full = s_.sp_full.data();
  sp_all_gather(inp, full, static_cast<std::size_t>(sp_rows()) * IC);
  linear_gemm_dw(ws_.of(id), lib_, cl, IC, n_, dout, full, 1.0f, dw);
  if (db) col_sums_into(db, dout, n_, cl);
}

// In bf16 (bf16_wire): rounded before, widened after; the reduce-scatter's sums rounded at every
// addition, the all-gather exact (its values are GEMM inputs the GEMMs round to bf16 anyway,
// except the bias gradient's column sums of a gathered output gradient).
void TensorOps::sp_reduce_scatter(const float* part, float* out, std::size_t n) {
  if (!s_.bf16_wire) return g_.tx->reduce_scatter_sum(part, out, n);
  const std::size_t p = g_.tx->size();
  s_.wire_full.resize(p * n);
  s_.wire_part.resize(n);
  k::to_bf16(s_.wire_full.data(), part, static_cast<std::int64_t>(p * n));
  g_.tx
      ->ireduce_scatter_sum_bf16(s_.wire_full.data(), s_.wire_part.data(),
                                 std::vector<std::size_t>(p, n))
      .wait();
  k::from_bf16(out, s_.wire_part.data(), static_cast<std::int64_t>(n));
}

void TensorOps::sp_all_gather(const float* in, float* full, std::size_t n) {
  if (!s_.bf16_wire) return g_.tx->all_gather(in, full, n);
  const std::size_t p = g_.tx->size();
  s_.wire_full.resize(p * n);
  s_.wire_part.resize(n);
  k::to_bf16(s_.wire_part.data(), in, static_cast<std::int64_t>(n));
  g_.tx->all_gather(s_.wire_part.data(), s_.wire_full.data(), n);
  k::from_bf16(full, s_.wire_full.data(), static_cast<std::int64_t>(p * n));
}

// ---- the rank's heads and columns ----

void TensorOps::swiglu_forward(float* out, const float* inp, std::int64_t N, int F) {
  k::swiglu_forward(out, inp, N, F);
}
void TensorOps::swiglu_backward(float* dinp, const float* dout, const float* inp, std::int64_t N,
                                int F) {
  k::swiglu_backward(dinp, dout, inp, N, F);
}
void TensorOps::rope_forward(float* qkv, int B, int T, int NH, int KV, int hs,
                             const double* inv_freq) {
  k::rope_forward(qkv, B, T, NH, KV, hs, inv_freq);
}
void TensorOps::rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs,
                              const double* inv_freq) {
  k::rope_backward(dqkv, B, T, NH, KV, hs, inv_freq);
}
void TensorOps::attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH,
                                  int KV, int hs) {
  k::attention_forward(lib_, out, lse, qkv, B, T, NH, KV, hs);
}
void TensorOps::attention_backward(float* dqkv, const float* dout, const float* qkv,
                                   const float* out, const float* lse, int B, int T, int NH, int KV,
                                   int hs) {
  k::attention_backward(lib_, dqkv, dout, qkv, out, lse, B, T, NH, KV, hs);
}

}  // namespace tessera::parallel
