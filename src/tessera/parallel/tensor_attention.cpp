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

}  // namespace tessera::parallel
