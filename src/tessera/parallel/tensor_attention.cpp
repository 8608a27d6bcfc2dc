#include "tessera/parallel/tensor_attention.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/parallel/tensor_layernorm.hpp"

namespace tessera::parallel {

using comm::Axis;

int TensorAttentionLayout::local_batch(int B) const {
  if (B <= 0 || B % tz != 0)
    throw Error(fmt::format("a batch of {} sequences cannot be split over tz={}", B, tz),
                "attention needs whole sequences per rank: use a micro-batch divisible by tz");
  return B / tz;
}

int TensorAttentionLayout::batch_offset(int B) const {
  return local_batch(B) * tz_index;
}

TensorAttentionLayout make_tensor_attention_layout(const comm::Topology& topo, int C, int n_head) {
  TensorAttentionLayout l;
  const comm::GridShape& s = topo.shape();
  l.tx = s.tx;
  l.ty = s.ty;
  l.tz = s.tz;
  l.tx_index = topo.coord(Axis::TX);
  l.ty_index = topo.coord(Axis::TY);
  l.tz_index = topo.coord(Axis::TZ);
  if (C <= 0 || n_head <= 0 || C % n_head != 0)
    throw Error(fmt::format("attention needs C divisible by n_head, got C={} n_head={}", C, n_head),
                "fix the model config");
  if (n_head % l.ty != 0)
    throw Error(fmt::format("n_head={} is not divisible by ty={}", n_head, l.ty),
                "attention heads are split over ty: choose ty dividing the number of heads");
  if (C % l.tx != 0)
    throw Error(fmt::format("n_embd={} is not divisible by tx={}", C, l.tx),
                "choose tx dividing the model's hidden size");
  l.C = C;
  l.n_head = n_head;
  l.head_size = C / n_head;
  l.c_local = C / l.tx;
  l.c_offset = l.tx_index * l.c_local;
  l.heads_local = n_head / l.ty;
  l.head_offset = l.ty_index * l.heads_local;
  l.att_local = l.heads_local * l.head_size;
  l.qkv = make_tensor_linear_layout(topo, C, 3 * C, false);
  l.proj = make_tensor_linear_layout(topo, C, C, true);
  TESSERA_CHECK(l.qkv.in_local == l.c_local && l.qkv.out_local == 3 * l.att_local,
                "qkv layout does not match the attention layout");
  TESSERA_CHECK(l.proj.in_local == l.att_local && l.proj.out_local == l.c_local,
                "proj layout does not match the attention layout");
  return l;
}

TensorAttentionComms tensor_attention_comms(comm::Runtime& rt, const comm::Topology& topo) {
  TensorAttentionComms c;
  c.qkv = tensor_linear_comms(rt, topo, false);
  c.proj = tensor_linear_comms(rt, topo, true);
  c.tx = &rt.group(topo, comm::AxisSet{Axis::TX});
  c.tz = &rt.group(topo, comm::AxisSet{Axis::TZ});
  return c;
}

// ---- head-grouped order ----

int grouped_source_row(const std::vector<int>& segments, int ty, int r) {
  int total = 0;
  for (int s : segments) total += s;
  const int per_rank = total / ty;
  const int j = r / per_rank;
  int within = r % per_rank, base = 0;
  for (int s : segments) {
    const int part = s / ty;
    if (within < part) return base + j * part + within;
    within -= part;
    base += s;
  }
  TESSERA_CHECK(false, "row {} outside the {} rows of the segments", r, total);
  return -1;
}

int qkv_head_grouped_source_row(int C, int ty, int r) {
  return grouped_source_row({C, C, C}, ty, r);
}

void qkv_rows_to_head_grouped(const float* src, float* dst, int C, int ty, std::int64_t row_len) {
  for (int r = 0; r < 3 * C; ++r) {
    const float* s =
        src + static_cast<std::int64_t>(qkv_head_grouped_source_row(C, ty, r)) * row_len;
    std::copy(s, s + row_len, dst + r * row_len);
  }
}

void qkv_rows_from_head_grouped(const float* src, float* dst, int C, int ty, std::int64_t row_len) {
  for (int r = 0; r < 3 * C; ++r) {
    const float* s = src + r * row_len;
    std::copy(s, s + row_len,
              dst + static_cast<std::int64_t>(qkv_head_grouped_source_row(C, ty, r)) * row_len);
  }
}

// ---- buffers ----

TensorAttentionActivations::TensorAttentionActivations(const TensorAttentionLayout& l, int B,
                                                       int T) {
  const std::int64_t bl = l.local_batch(B), n = bl * T;
  ln_out.assign(n * l.c_local, 0.0f);
  ln_mean.assign(n, 0.0f);
  ln_rstd.assign(n, 0.0f);
  qkv.assign(n * 3 * l.att_local, 0.0f);
  att.assign(n * l.att_local, 0.0f);
  lse.assign(bl * l.heads_local * T, 0.0f);
}

TensorAttentionWorkspace::TensorAttentionWorkspace(const TensorAttentionLayout& l, int B, int T)
    : qkv(l.qkv), proj(l.proj) {
  const std::int64_t n = static_cast<std::int64_t>(l.local_batch(B)) * T;
  row_stats.assign(2 * n, 0.0f);
  proj_out.assign(n * l.c_local, 0.0f);
  d_att.assign(n * l.att_local, 0.0f);
  d_qkv.assign(n * 3 * l.att_local, 0.0f);
  d_ln.assign(n * l.c_local, 0.0f);
  d_ln_params.assign(2 * l.c_local, 0.0f);
}

namespace {

void check_buffers(const TensorAttentionLayout& l, int B, int T,
                   const TensorAttentionActivations& acts, const TensorAttentionWorkspace& ws) {
  const std::int64_t n = static_cast<std::int64_t>(l.local_batch(B)) * T;
  TESSERA_CHECK(static_cast<std::int64_t>(acts.ln_out.size()) == n * l.c_local &&
                    static_cast<std::int64_t>(acts.qkv.size()) == n * 3 * l.att_local &&
                    static_cast<std::int64_t>(acts.lse.size()) ==
                        static_cast<std::int64_t>(l.local_batch(B)) * l.heads_local * T,
                "attention activations were built for another layout or batch");
  TESSERA_CHECK(static_cast<std::int64_t>(ws.row_stats.size()) == 2 * n &&
                    static_cast<std::int64_t>(ws.d_qkv.size()) == n * 3 * l.att_local &&
                    static_cast<int>(ws.d_ln_params.size()) == 2 * l.c_local,
                "attention workspace was built for another layout or batch");
}

}  // namespace

// ---- forward ----

void tensor_attention_forward(kernels::GemmLibrary lib, const TensorAttentionLayout& l,
                              const TensorAttentionComms& c, float* y, const float* x,
                              const TensorAttentionParams& p, int B, int T,
                              TensorAttentionActivations& acts, TensorAttentionWorkspace& ws,
                              int key) {
  check_buffers(l, B, T, acts, ws);
  TESSERA_CHECK(c.tx && c.tx->size() == l.tx, "tx communicator does not match the layout");
  const int bl = l.local_batch(B);
  const std::int64_t n = static_cast<std::int64_t>(bl) * T;
  const int cl = l.c_local;

  // 1. LayerNorm over the full C of rows split over tx (tensor_layernorm.hpp).
  tensor_layernorm_forward(*c.tx, acts.ln_out.data(), acts.ln_mean.data(), acts.ln_rstd.data(), x,
                           p.ln_w, p.ln_b, n, cl, l.C, ws.row_stats.data());

  // 2. qkv: normal linear, (n, c_local) -> (n, 3*att_local) = [q | k | v] of this rank's heads.
  tensor_linear_forward(lib, l.qkv, c.qkv, acts.qkv.data(), acts.ln_out.data(), p.qkv_w, p.qkv_b, n,
                        ws.qkv, key);
  // 3. attention of this rank's heads (replicated over tx).
  kernels::cpu::attention_forward(lib, acts.att.data(), acts.lse.data(), acts.qkv.data(), bl, T,
                                  l.heads_local, l.heads_local, l.att_local / l.heads_local);
  // 4. proj: transposed linear, (n, att_local) -> (n, c_local), then the residual add.
  tensor_linear_forward(lib, l.proj, c.proj, ws.proj_out.data(), acts.att.data(), p.proj_w,
                        p.proj_b, n, ws.proj, key);
  kernels::cpu::add(y, x, ws.proj_out.data(), n * cl);
}

// ---- backward ----

void tensor_attention_backward(kernels::GemmLibrary lib, const TensorAttentionLayout& l,
                               const TensorAttentionComms& c, float* dx,
                               const TensorAttentionGrads& g, const float* dy, const float* x,
                               const TensorAttentionParams& p, int B, int T,
                               const TensorAttentionActivations& acts,
                               TensorAttentionWorkspace& ws) {
  check_buffers(l, B, T, acts, ws);
  TESSERA_CHECK(c.tx && c.tx->size() == l.tx, "tx communicator does not match the layout");
  TESSERA_CHECK(c.tz && c.tz->size() == l.tz, "tz communicator does not match the layout");
  const int bl = l.local_batch(B);
  const std::int64_t n = static_cast<std::int64_t>(bl) * T;
  const int cl = l.c_local;

  // 1. proj (transposed): d_att (n, att_local) all-reduced over tx (proj's output axis).
  tensor_linear_backward(lib, l.proj, c.proj, ws.d_att.data(), g.proj_w, g.proj_b, dy,
                         acts.att.data(), ws.proj.w_block.data(), n, ws.proj);
  // 2. attention of this rank's heads.
  kernels::cpu::attention_backward(lib, ws.d_qkv.data(), ws.d_att.data(), acts.qkv.data(),
                                   acts.att.data(), acts.lse.data(), bl, T, l.heads_local,
                                   l.heads_local, l.att_local / l.heads_local);
  // 3. qkv (normal): d_ln (n, c_local) all-reduced over ty (qkv's output axis).
  tensor_linear_backward(lib, l.qkv, c.qkv, ws.d_ln.data(), g.qkv_w, g.qkv_b, ws.d_qkv.data(),
                         acts.ln_out.data(), ws.qkv.w_block.data(), n, ws.qkv);

  // 4. LayerNorm (tensor_layernorm.hpp): dx = dy + the LayerNorm path; its parameter
  //    gradients are complete over ty already (replicated rows) and summed over tz.
  if (dx != dy) std::copy(dy, dy + n * cl, dx);
  tensor_layernorm_backward(*c.tx, *c.tz, dx, g.ln_w, g.ln_b, ws.d_ln.data(), x, p.ln_w,
                            acts.ln_mean.data(), acts.ln_rstd.data(), n, cl, l.C,
                            ws.row_stats.data(), ws.d_ln_params.data());
}

}  // namespace tessera::parallel
