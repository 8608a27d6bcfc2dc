#include "tensor_attention_block.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/parallel/tensor_layernorm.hpp"

namespace tessera::parallel {

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
                         acts.att.data(), ws.proj.w_used, n, ws.proj);
  // 2. attention of this rank's heads.
  kernels::cpu::attention_backward(lib, ws.d_qkv.data(), ws.d_att.data(), acts.qkv.data(),
                                   acts.att.data(), acts.lse.data(), bl, T, l.heads_local,
                                   l.heads_local, l.att_local / l.heads_local);
  // 3. qkv (normal): d_ln (n, c_local) all-reduced over ty (qkv's output axis).
  tensor_linear_backward(lib, l.qkv, c.qkv, ws.d_ln.data(), g.qkv_w, g.qkv_b, ws.d_qkv.data(),
                         acts.ln_out.data(), ws.qkv.w_used, n, ws.qkv);

  // 4. LayerNorm (tensor_layernorm.hpp): dx = dy + the LayerNorm path; its parameter
  //    gradients are complete over ty already (replicated rows) and summed over tz.
  if (dx != dy) std::copy(dy, dy + n * cl, dx);
  tensor_layernorm_backward(*c.tx, *c.tz, dx, g.ln_w, g.ln_b, ws.d_ln.data(), x, p.ln_w,
                            acts.ln_mean.data(), acts.ln_rstd.data(), n, cl, l.C,
                            ws.row_stats.data(), ws.d_ln_params.data());
}

}  // namespace tessera::parallel
