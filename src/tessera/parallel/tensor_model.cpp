#include "tessera/parallel/tensor_model.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cpu/ops.hpp"
#include "tessera/parallel/tensor_layernorm.hpp"

namespace tessera::parallel {

using comm::Axis;
namespace k = kernels::cpu;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Which layer tensor a global tensor is (by its Hugging Face name).
enum class Kind { Wte, Wpe, Norm, QkvW, QkvB, ProjW, ProjB, FcW, FcB, FcProjW, FcProjB };

Kind kind_of(const model::ParamTensor& t) {
  const std::string& n = t.name;
  if (n == "wte.weight") return Kind::Wte;
  if (n == "wpe.weight") return Kind::Wpe;
  if (ends_with(n, "attn.c_attn.weight")) return Kind::QkvW;
  if (ends_with(n, "attn.c_attn.bias")) return Kind::QkvB;
  if (ends_with(n, "attn.c_proj.weight")) return Kind::ProjW;
  if (ends_with(n, "attn.c_proj.bias")) return Kind::ProjB;
  if (ends_with(n, "mlp.c_fc.weight")) return Kind::FcW;
  if (ends_with(n, "mlp.c_fc.bias")) return Kind::FcB;
  if (ends_with(n, "mlp.c_proj.weight")) return Kind::FcProjW;
  if (ends_with(n, "mlp.c_proj.bias")) return Kind::FcProjB;
  if (ends_with(n, "ln_1.weight") || ends_with(n, "ln_1.bias") || ends_with(n, "ln_2.weight") ||
      ends_with(n, "ln_2.bias") || ends_with(n, "ln_f.weight") || ends_with(n, "ln_f.bias"))
    return Kind::Norm;
  TESSERA_CHECK(false, "tensor parallelism does not know the parameter {}", n);
  return Kind::Norm;
}

// The options with the chunks checked (empty: the whole model as one chunk).
TensorModelOptions with_chunks(const model::ModelConfig& cfg, TensorModelOptions opt) {
  const int L = cfg.n_layer;
  if (opt.chunks.empty()) opt.chunks = {ModelChunk{0, L, true, true}};
  int prev_end = 0;
  for (std::size_t c = 0; c < opt.chunks.size(); ++c) {
    const auto& ch = opt.chunks[c];
    TESSERA_CHECK(ch.first_layer >= prev_end && ch.first_layer <= ch.end_layer && ch.end_layer <= L,
                  "chunk {} holds layers [{}, {}) (model of {} layers, previous chunk ends at {})",
                  c, ch.first_layer, ch.end_layer, L, prev_end);
    TESSERA_CHECK(!ch.embedding || (c == 0 && ch.first_layer == 0),
                  "the embeddings belong to the first chunk of the model");
    TESSERA_CHECK(!ch.head || (c + 1 == opt.chunks.size() && ch.end_layer == L),
                  "the LM head belongs to the last chunk of the model");
    prev_end = ch.end_layer;
  }
  return opt;
}

}  // namespace

// ---- activations and scratch ----

struct TensorModel::Layer {
  TensorAttentionActivations att;
  std::vector<float> res2;                     // (n, cl) residual after attention
  std::vector<float> ln2, ln2_mean, ln2_rstd;  // (n, cl), (n), (n)
  std::vector<float> fch, fch_gelu;            // (n, 4C/ty)
};

struct TensorModel::WsSet {
  TensorAttentionWorkspace att;
  TensorLinearWorkspace fc, fcproj;
  std::vector<TensorLinearWorkspace*> linears() { return {&att.qkv, &att.proj, &fc, &fcproj}; }
};

// One micro-batch's activations through one chunk of nl layers.
struct TensorModel::Slot {
  std::vector<std::int32_t> ids, targets;  // (n) this rank's rows (embedding / head chunk)
  std::vector<std::vector<float>> resid;   // nl+1 x (n, cl): the input, then each layer's output
  std::vector<Layer> layers;               // nl (none with recomputation)
  std::vector<float> lnf, lnf_mean, lnf_rstd, losses;  // head chunk: (n, cl), (n), (n), (n)
  // Head chunk: the vocabulary workspace's logits (dlogits after training) and LM head input,
  // kept here between the forward and the backward (swapped with the workspace's).
  std::vector<float> logits, h_full;
  bool have_targets = false;
  std::size_t bytes() const {
    std::size_t f = ids.size() + targets.size() + lnf.size() + lnf_mean.size() + lnf_rstd.size() +
                    losses.size() + logits.size() + h_full.size();
    for (const auto& r : resid) f += r.size();
    for (const auto& a : layers)
      f += a.att.ln_out.size() + a.att.ln_mean.size() + a.att.ln_rstd.size() + a.att.qkv.size() +
           a.att.att.size() + a.att.lse.size() + a.res2.size() + a.ln2.size() + a.ln2_mean.size() +
           a.ln2_rstd.size() + a.fch.size() + a.fch_gelu.size();
    return f * sizeof(float);
  }
};

struct TensorModel::State {
  int B = 0, T = 0;
  std::int64_t n = 0;               // local rows
  std::vector<Layer> shared_layer;  // recomputation: the one layer's activations, rebuilt
  std::vector<WsSet> sets;          // 1, or 2 alternating by layer parity (overlap)
  VocabParallelWorkspace vocab_ws;
  std::vector<float> row_stats, ln_params, mlp_out, d_fch, d_ln, d_res;
  std::vector<float> sp_full, sp_part, sp_local;  // sequence parallelism: (n, 4C), (n/tx, 4C)
  std::vector<std::vector<std::unique_ptr<Slot>>> pool;       // per chunk: free slots
  std::map<std::pair<int, int>, std::unique_ptr<Slot>> live;  // (chunk, mb) in flight
  ActivationStats stats;
};

TensorModel::TensorModel(const model::ModelConfig& cfg, const comm::Topology& topo,
                         comm::Runtime& rt, const TensorModelOptions& opt)
    : cfg_(cfg),
      opt_(with_chunks(cfg, opt)),
      global_(cfg),
      att_(make_tensor_attention_layout(topo, cfg.n_embd, cfg.n_head)),
      fc_(make_tensor_linear_layout(topo, cfg.n_embd, 4 * cfg.n_embd, false)),
      fcproj_(make_tensor_linear_layout(topo, 4 * cfg.n_embd, cfg.n_embd, true)),
      vocab_(make_vocab_parallel_layout(topo, cfg.vocab_size, cfg.padded_vocab(), cfg.n_embd)),
      local_(cfg,
             [this](const model::ParamTensor& t) -> std::size_t {
               if (!holds(t)) return 0;
               switch (kind_of(t)) {
                 case Kind::Wte:
                   return static_cast<std::size_t>(vocab_.shard_numel);
                 case Kind::Wpe:
                   return static_cast<std::size_t>(cfg_.block_size) *
                          static_cast<std::size_t>(att_.c_local);
                 case Kind::Norm:
                   return static_cast<std::size_t>(att_.c_local);
                 case Kind::QkvW:
                   return static_cast<std::size_t>(att_.qkv.shard_numel);
                 case Kind::QkvB:
                   return static_cast<std::size_t>(att_.qkv.out_local);
                 case Kind::ProjW:
                   return static_cast<std::size_t>(att_.proj.shard_numel);
                 case Kind::ProjB:
                   return static_cast<std::size_t>(att_.proj.out_local);
                 case Kind::FcW:
                   return static_cast<std::size_t>(fc_.shard_numel);
                 case Kind::FcB:
                   return static_cast<std::size_t>(fc_.out_local);
                 case Kind::FcProjW:
                   return static_cast<std::size_t>(fcproj_.shard_numel);
                 case Kind::FcProjB:
                   return static_cast<std::size_t>(fcproj_.out_local);
               }
               return 0;
             }),
      st_(std::make_unique<State>()) {
  const auto& s = topo.shape();
  tensor_size_ = s.tx * s.ty * s.tz;
  if (opt.sequence_parallel && (s.ty != 1 || s.tz != 1))
    throw Error(fmt::format("sequence parallelism is implemented for 1D tensor parallelism over "
                            "tx; the grid has ty={} tz={}",
                            s.ty, s.tz),
                "set parallel.sequence_parallel = false, or use tx alone");
  // Communicators: every rank asks for the same groups in the same order.
  att_comms_ = tensor_attention_comms(rt, topo);
  fc_comms_ = tensor_linear_comms(rt, topo, false);
  fcproj_comms_ = tensor_linear_comms(rt, topo, true);
  vocab_comms_ = vocab_parallel_comms(rt, topo);
  tensor_group_ = &rt.group(topo, comm::AxisSet{Axis::TX, Axis::TY, Axis::TZ});
  model_group_ = s.pp > 1 ? &rt.group(topo, comm::AxisSet{Axis::PP, Axis::TX, Axis::TY, Axis::TZ})
                          : tensor_group_;

  if (opt.tune_gemm) {
    tuner_ = std::make_unique<kernels::GemmTuner>();
    if (!opt.gemm_tuning_file.empty() && std::filesystem::exists(opt.gemm_tuning_file))
      tuner_->load(opt.gemm_tuning_file);
  }

  // The owners of replicated elements (kept: the gradient norm counts them every step); the
  // local -> global index (8 bytes per local parameter) is rebuilt when needed.
  std::vector<std::int64_t> index;
  build_maps(index, owner_);
}

void TensorModel::build_maps(std::vector<std::int64_t>& index,
                             std::vector<std::uint8_t>& owner) const {
  const int C = cfg_.n_embd;
  const model::ModelConfig& cfg = cfg_;
  const bool norm_owner = att_.ty_index == 0 && att_.tz_index == 0;
  index.assign(local_.total(), -1);
  owner.assign(local_.total(), 0);
  const auto& gt = global_.tensors();
  const auto& lt = local_.tensors();
  TESSERA_CHECK(gt.size() == lt.size(), "local and global layouts differ");
  const bool embedding_here = opt_.chunks.front().embedding;
  for (std::size_t ti = 0; ti < gt.size(); ++ti) {
    if (lt[ti].numel == 0) continue;  // a tensor of another pipeline stage
    const std::int64_t go = static_cast<std::int64_t>(gt[ti].offset);
    std::int64_t* idx = index.data() + lt[ti].offset;
    std::uint8_t* own = owner.data() + lt[ti].offset;
    auto weight = [&](const TensorLinearLayout& L, bool qkv) {
      for (std::int64_t s2 = 0; s2 < L.shard_numel; ++s2) {
        const std::int64_t e = L.shard_offset + s2;
        std::int64_t row = L.out_offset + e / L.in_local;
        if (qkv) row = qkv_head_grouped_source_row(C, att_.ty, static_cast<int>(row));
        idx[s2] = go + row * L.in + L.in_offset + e % L.in_local;
        own[s2] = 1;
      }
    };
    auto bias = [&](const TensorLinearLayout& L, bool qkv) {
      const bool o = L.in_index == 0 && L.tz_index == 0;
      for (int j = 0; j < L.out_local; ++j) {
        std::int64_t row = L.out_offset + j;
        if (qkv) row = qkv_head_grouped_source_row(C, att_.ty, static_cast<int>(row));
        idx[j] = go + row;
        own[j] = o;
      }
    };
    switch (kind_of(gt[ti])) {
      case Kind::Wte:
        for (std::int64_t s2 = 0; s2 < vocab_.shard_numel; ++s2) {
          const std::int64_t e = vocab_.shard_offset + s2;
          idx[s2] = go + (vocab_.vocab_offset + e / C) * C + e % C;
          own[s2] = embedding_here;  // the head's copy (another stage) is not counted
        }
        break;
      case Kind::Wpe:
        for (std::int64_t t = 0; t < cfg.block_size; ++t)
          for (int j = 0; j < att_.c_local; ++j) {
            idx[t * att_.c_local + j] = go + t * C + att_.c_offset + j;
            own[t * att_.c_local + j] = norm_owner;
          }
        break;
      case Kind::Norm:
        for (int j = 0; j < att_.c_local; ++j) {
          idx[j] = go + att_.c_offset + j;
          own[j] = norm_owner;
        }
        break;
      case Kind::QkvW:
        weight(att_.qkv, true);
        break;
      case Kind::QkvB:
        bias(att_.qkv, true);
        break;
      case Kind::ProjW:
        weight(att_.proj, false);
        break;
      case Kind::ProjB:
        bias(att_.proj, false);
        break;
      case Kind::FcW:
        weight(fc_, false);
        break;
      case Kind::FcB:
        bias(fc_, false);
        break;
      case Kind::FcProjW:
        weight(fcproj_, false);
        break;
      case Kind::FcProjB:
        bias(fcproj_, false);
        break;
    }
  }
}

TensorModel::~TensorModel() = default;

bool TensorModel::holds(const model::ParamTensor& t) const {
  const auto& ch = opt_.chunks;
  if (t.layer >= 0) {
    for (const auto& c : ch)
      if (t.layer >= c.first_layer && t.layer < c.end_layer) return true;
    return false;
  }
  switch (kind_of(t)) {
    case Kind::Wte:
      return ch.front().embedding || ch.back().head;
    case Kind::Wpe:
      return ch.front().embedding;
    default:  // ln_f
      return ch.back().head;
  }
}

void TensorModel::save_gemm_choices() const {
  if (tuner_ && !opt_.gemm_tuning_file.empty()) tuner_->save(opt_.gemm_tuning_file);
}

std::vector<std::int64_t> TensorModel::global_index() const {
  std::vector<std::int64_t> index;
  std::vector<std::uint8_t> owner;
  build_maps(index, owner);
  return index;
}

void TensorModel::extract(const float* global, float* local) const {
  const auto index = global_index();
  const std::size_t n = index.size();
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) local[i] = index[i] < 0 ? 0.0f : global[index[i]];
}

void TensorModel::gather_full(const float* local, float* global) {
  std::fill(global, global + global_.total(), 0.0f);
  {
    const auto index = global_index();
    for (std::size_t i = 0; i < index.size(); ++i)
      if (owner_[i]) global[index[i]] = local[i];
  }
  if (model_group_->size() > 1) model_group_->all_reduce_sum(global, global_.total());
}

std::size_t TensorModel::activation_bytes() const {
  const State& s = *st_;
  std::size_t f = 0;
  auto add = [&](const std::vector<float>& v) { f += v.size(); };
  for (const auto& a : s.shared_layer) {
    add(a.att.ln_out), add(a.att.ln_mean), add(a.att.ln_rstd), add(a.att.qkv), add(a.att.att),
        add(a.att.lse);
    add(a.res2), add(a.ln2), add(a.ln2_mean), add(a.ln2_rstd), add(a.fch), add(a.fch_gelu);
  }
  add(s.vocab_ws.logits), add(s.vocab_ws.h_full);
  return f * sizeof(float) + s.stats.live_bytes;
}

const TensorModel::ActivationStats& TensorModel::activation_stats() const {
  return st_->stats;
}

void TensorModel::reset_activation_stats() {
  auto& st = st_->stats;
  st.peak_live = st.live;
  st.peak_bytes = st.live_bytes;
}

std::size_t TensorModel::boundary_numel() const {
  return static_cast<std::size_t>(st_->n) * static_cast<std::size_t>(att_.c_local);
}

// ---- overlap helpers ----

TensorModel::WsSet& TensorModel::ws_of(int layer) {
  auto& sets = st_->sets;
  return sets[static_cast<std::size_t>(layer) % sets.size()];
}

void TensorModel::prefetch_layer(int layer, const float* blk) {
  const auto& w = local_.layers[layer];
  auto PL = [&](std::size_t off) { return blk + (off - w.begin); };
  WsSet& ws = ws_of(layer);
  // The order of consumption (the same on every rank: tz collectives start in one order).
  tensor_linear_prefetch_weight(att_.qkv, att_comms_.qkv, PL(w.qkv_w), ws.att.qkv, layer);
  tensor_linear_prefetch_weight(att_.proj, att_comms_.proj, PL(w.attproj_w), ws.att.proj, layer);
  tensor_linear_prefetch_weight(fc_, fc_comms_, PL(w.fc_w), ws.fc, layer);
  tensor_linear_prefetch_weight(fcproj_, fcproj_comms_, PL(w.fcproj_w), ws.fcproj, layer);
}

void TensorModel::progress_all(model::ParamStore& store) {
  store.progress();
  for (auto& set : st_->sets)
    for (auto* lw : set.linears()) tensor_linear_progress(*lw);
}

// ---- one layer ----

void TensorModel::layer_forward(kernels::GemmLibrary lib, int l, const float* blk, const float* x,
                                float* y, int B, int T, Layer& a) {
  State& s = *st_;
  const auto& w = local_.layers[l];
  auto PL = [&](std::size_t off) { return blk + (off - w.begin); };
  const std::int64_t n = s.n;
  const int cl = att_.c_local;
  TensorAttentionParams ap{PL(w.ln1_w), PL(w.ln1_b),     PL(w.qkv_w),
                           PL(w.qkv_b), PL(w.attproj_w), PL(w.attproj_b)};
  WsSet& ws = ws_of(l);
  tensor_attention_forward(lib, att_, att_comms_, a.res2.data(), x, ap, B, T, a.att, ws.att, l);
  tensor_layernorm_forward(*att_comms_.tx, a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                           a.res2.data(), PL(w.ln2_w), PL(w.ln2_b), n, cl, cfg_.n_embd,
                           s.row_stats.data());
  tensor_linear_forward(lib, fc_, fc_comms_, a.fch.data(), a.ln2.data(), PL(w.fc_w), PL(w.fc_b), n,
                        ws.fc, l);
  k::gelu_forward(a.fch_gelu.data(), a.fch.data(), n * fc_.out_local);
  tensor_linear_forward(lib, fcproj_, fcproj_comms_, s.mlp_out.data(), a.fch_gelu.data(),
                        PL(w.fcproj_w), PL(w.fcproj_b), n, ws.fcproj, l);
  k::add(y, a.res2.data(), s.mlp_out.data(), n * cl);
}

void TensorModel::layer_backward(kernels::GemmLibrary lib, int l, const float* blk, float* gblk,
                                 const float* x, int B, int T, Layer& a, model::ParamStore& store) {
  State& s = *st_;
  const int C = cfg_.n_embd;
  const std::int64_t n = s.n;
  const int cl = att_.c_local;
  auto progress = [&] { progress_all(store); };
  const auto& w = local_.layers[l];
  auto PL = [&](std::size_t off) { return blk + (off - w.begin); };
  auto GL = [&](std::size_t off) { return gblk + (off - w.begin); };
  WsSet& ws = ws_of(l);
  // The blocks: still in the workspace (from the forward, a recompute or a prefetch) or gathered
  // again now; always acquired in the forward's order (qkv, proj, fc, fcproj) on every rank.
  tensor_linear_acquire_weight(att_.qkv, att_comms_.qkv, PL(w.qkv_w), ws.att.qkv, l);
  tensor_linear_acquire_weight(att_.proj, att_comms_.proj, PL(w.attproj_w), ws.att.proj, l);
  tensor_linear_acquire_weight(fc_, fc_comms_, PL(w.fc_w), ws.fc, l);
  tensor_linear_acquire_weight(fcproj_, fcproj_comms_, PL(w.fcproj_w), ws.fcproj, l);
  // d_res: gradient w.r.t. the layer output res3 = res2 + fcproj(gelu(fc(ln2(res2)))).
  tensor_linear_backward(lib, fcproj_, fcproj_comms_, s.d_fch.data(), GL(w.fcproj_w),
                         GL(w.fcproj_b), s.d_res.data(), a.fch_gelu.data(),
                         ws.fcproj.w_block.data(), n, ws.fcproj);
  progress();
  k::gelu_backward(s.d_fch.data(), a.fch.data(), s.d_fch.data(), n * fc_.out_local);
  tensor_linear_backward(lib, fc_, fc_comms_, s.d_ln.data(), GL(w.fc_w), GL(w.fc_b), s.d_fch.data(),
                         a.ln2.data(), ws.fc.w_block.data(), n, ws.fc);
  progress();
  tensor_layernorm_backward(*att_comms_.tx, *att_comms_.tz, s.d_res.data(), GL(w.ln2_w),
                            GL(w.ln2_b), s.d_ln.data(), a.res2.data(), PL(w.ln2_w),
                            a.ln2_mean.data(), a.ln2_rstd.data(), n, cl, C, s.row_stats.data(),
                            s.ln_params.data());
  // d_res: gradient w.r.t. res2 = x + attention sub-block(x).
  TensorAttentionParams ap{PL(w.ln1_w), PL(w.ln1_b),     PL(w.qkv_w),
                           PL(w.qkv_b), PL(w.attproj_w), PL(w.attproj_b)};
  TensorAttentionGrads ag{GL(w.ln1_w), GL(w.ln1_b),     GL(w.qkv_w),
                          GL(w.qkv_b), GL(w.attproj_w), GL(w.attproj_b)};
  tensor_attention_backward(lib, att_, att_comms_, s.d_res.data(), ag, s.d_res.data(), x, ap, B, T,
                            a.att, ws.att);
  progress();
}

// ---- one layer, sequence-parallel (1D over tx; tz = ty = 1, so weight shards are the blocks) ----
//
// Shapes (n rows on the rank, ns = n/tx rows of its sequence slice, cl = C/tx): the normal
// linears' blocks are (K*C, cl), the transposed ones' (cl, K*C); biases of normal linears are
// (K*C) replicated over tx, of transposed ones (cl).

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

void TensorModel::sp_layer_forward(kernels::GemmLibrary lib, int l, const float* blk,
                                   const float* x, float* y, int B, int T, Layer& a) {
  State& s = *st_;
  comm::Communicator& tx = *att_comms_.tx;
  const auto& w = local_.layers[l];
  auto PL = [&](std::size_t off) { return blk + (off - w.begin); };
  const int C = cfg_.n_embd, cl = att_.c_local, P = att_.tx;
  const std::int64_t n = s.n, ns = n / P;
  const int bs = B / P;  // sequences in this rank's slice
  (void)T;
  float* part = s.sp_part.data();
  float* full = s.sp_full.data();
  // attention: LN1 -> qkv partial (n, 3C) -> reduce-scatter rows -> attention on ns rows
  tensor_layernorm_forward(tx, a.att.ln_out.data(), a.att.ln_mean.data(), a.att.ln_rstd.data(), x,
                           PL(w.ln1_w), PL(w.ln1_b), n, cl, C, s.row_stats.data());
  kernels::gemm(lib, false, true, n, 3 * C, cl, 1.0f, a.att.ln_out.data(), cl, PL(w.qkv_w), cl,
                0.0f, part, 3 * C);
  tx.reduce_scatter_sum(part, a.att.qkv.data(), static_cast<std::size_t>(ns) * 3 * C);
  add_bias_rows(a.att.qkv.data(), PL(w.qkv_b), ns, 3 * C);
  k::attention_forward(lib, a.att.att.data(), a.att.lse.data(), a.att.qkv.data(), bs, T,
                       cfg_.n_head, cfg_.n_head, cfg_.head_dim());
  // proj: all-gather the attention output rows, (n, C) @ (cl, C)^T -> (n, cl), residual
  tx.all_gather(a.att.att.data(), full, static_cast<std::size_t>(ns) * C);
  kernels::gemm(lib, false, true, n, cl, C, 1.0f, full, C, PL(w.attproj_w), C, 0.0f,
                s.mlp_out.data(), cl);
  add_bias_rows(s.mlp_out.data(), PL(w.attproj_b), n, cl);
  k::add(a.res2.data(), x, s.mlp_out.data(), n * cl);
  // MLP: LN2 -> fc partial (n, 4C) -> reduce-scatter rows -> GELU on ns rows -> all-gather ->
  // fcproj (n, cl), residual
  tensor_layernorm_forward(tx, a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(),
                           PL(w.ln2_w), PL(w.ln2_b), n, cl, C, s.row_stats.data());
  kernels::gemm(lib, false, true, n, 4 * C, cl, 1.0f, a.ln2.data(), cl, PL(w.fc_w), cl, 0.0f, part,
                4 * C);
  tx.reduce_scatter_sum(part, a.fch.data(), static_cast<std::size_t>(ns) * 4 * C);
  add_bias_rows(a.fch.data(), PL(w.fc_b), ns, 4 * C);
  k::gelu_forward(a.fch_gelu.data(), a.fch.data(), ns * 4 * C);
  tx.all_gather(a.fch_gelu.data(), full, static_cast<std::size_t>(ns) * 4 * C);
  kernels::gemm(lib, false, true, n, cl, 4 * C, 1.0f, full, 4 * C, PL(w.fcproj_w), 4 * C, 0.0f,
                s.mlp_out.data(), cl);
  add_bias_rows(s.mlp_out.data(), PL(w.fcproj_b), n, cl);
  k::add(y, a.res2.data(), s.mlp_out.data(), n * cl);
}

void TensorModel::sp_layer_backward(kernels::GemmLibrary lib, int l, const float* blk, float* gblk,
                                    const float* x, int B, int T, Layer& a,
                                    model::ParamStore& store) {
  State& s = *st_;
  comm::Communicator& tx = *att_comms_.tx;
  comm::Communicator& tz = *att_comms_.tz;  // size 1 here
  const auto& w = local_.layers[l];
  auto PL = [&](std::size_t off) { return blk + (off - w.begin); };
  auto GL = [&](std::size_t off) { return gblk + (off - w.begin); };
  const int C = cfg_.n_embd, cl = att_.c_local, P = att_.tx;
  const std::int64_t n = s.n, ns = n / P;
  const int bs = B / P;
  float* part = s.sp_part.data();
  float* full = s.sp_full.data();
  float* loc = s.sp_local.data();
  float* d_res = s.d_res.data();
  // fcproj: dW += d_res^T @ gelu (gathered again); d_gelu partial (n, 4C) reduce-scattered.
  tx.all_gather(a.fch_gelu.data(), full, static_cast<std::size_t>(ns) * 4 * C);
  kernels::gemm(lib, true, false, cl, 4 * C, n, 1.0f, d_res, cl, full, 4 * C, 1.0f, GL(w.fcproj_w),
                4 * C);
  col_sums_into(GL(w.fcproj_b), d_res, n, cl);
  kernels::gemm(lib, false, false, n, 4 * C, cl, 1.0f, d_res, cl, PL(w.fcproj_w), 4 * C, 0.0f, part,
                4 * C);
  tx.reduce_scatter_sum(part, loc, static_cast<std::size_t>(ns) * 4 * C);
  store.progress();
  k::gelu_backward(loc, a.fch.data(), loc, ns * 4 * C);
  // fc: all-gather d_fch rows; dW += d_fch^T @ ln2, db += column sums, d_ln2 = d_fch @ W.
  tx.all_gather(loc, full, static_cast<std::size_t>(ns) * 4 * C);
  kernels::gemm(lib, true, false, 4 * C, cl, n, 1.0f, full, 4 * C, a.ln2.data(), cl, 1.0f,
                GL(w.fc_w), cl);
  col_sums_into(GL(w.fc_b), full, n, 4 * C);
  kernels::gemm(lib, false, false, n, cl, 4 * C, 1.0f, full, 4 * C, PL(w.fc_w), cl, 0.0f,
                s.d_ln.data(), cl);
  store.progress();
  tensor_layernorm_backward(tx, tz, d_res, GL(w.ln2_w), GL(w.ln2_b), s.d_ln.data(), a.res2.data(),
                            PL(w.ln2_w), a.ln2_mean.data(), a.ln2_rstd.data(), n, cl, C,
                            s.row_stats.data(), s.ln_params.data());
  // proj: dW += d_res^T @ att (gathered again); d_att partial (n, C) reduce-scattered.
  tx.all_gather(a.att.att.data(), full, static_cast<std::size_t>(ns) * C);
  kernels::gemm(lib, true, false, cl, C, n, 1.0f, d_res, cl, full, C, 1.0f, GL(w.attproj_w), C);
  col_sums_into(GL(w.attproj_b), d_res, n, cl);
  kernels::gemm(lib, false, false, n, C, cl, 1.0f, d_res, cl, PL(w.attproj_w), C, 0.0f, part, C);
  tx.reduce_scatter_sum(part, loc, static_cast<std::size_t>(ns) * C);
  store.progress();
  // attention on this rank's sequences: d_qkv (ns, 3C) into part's tail-free start.
  float* d_qkv = s.d_fch.data();  // (n, 4C/ty) >= (ns, 3C)
  k::attention_backward(lib, d_qkv, loc, a.att.qkv.data(), a.att.att.data(), a.att.lse.data(), bs,
                        T, cfg_.n_head, cfg_.n_head, cfg_.head_dim());
  // qkv: all-gather d_qkv rows; dW += d_qkv^T @ ln1, db += column sums, d_ln1 = d_qkv @ W.
  tx.all_gather(d_qkv, full, static_cast<std::size_t>(ns) * 3 * C);
  kernels::gemm(lib, true, false, 3 * C, cl, n, 1.0f, full, 3 * C, a.att.ln_out.data(), cl, 1.0f,
                GL(w.qkv_w), cl);
  col_sums_into(GL(w.qkv_b), full, n, 3 * C);
  kernels::gemm(lib, false, false, n, cl, 3 * C, 1.0f, full, 3 * C, PL(w.qkv_w), cl, 0.0f,
                s.d_ln.data(), cl);
  store.progress();
  tensor_layernorm_backward(tx, tz, d_res, GL(w.ln1_w), GL(w.ln1_b), s.d_ln.data(), x, PL(w.ln1_w),
                            a.att.ln_mean.data(), a.att.ln_rstd.data(), n, cl, C,
                            s.row_stats.data(), s.ln_params.data());
}

// ---- buffers and slots ----

void TensorModel::init_layer(Layer& a, int B, int T) const {
  const int C = cfg_.n_embd, cl = att_.c_local;
  const std::int64_t n = st_->n;
  if (opt_.sequence_parallel) {
    const std::int64_t ns = n / att_.tx;  // rows of the replicated region
    a.att.ln_out.resize(n * cl);
    a.att.ln_mean.resize(n);
    a.att.ln_rstd.resize(n);
    a.att.qkv.resize(ns * 3 * C);
    a.att.att.resize(ns * C);
    a.att.lse.resize(static_cast<std::size_t>(B / att_.tx) * cfg_.n_head * T);
    a.res2.resize(n * cl);
    a.ln2.resize(n * cl);
    a.ln2_mean.resize(n);
    a.ln2_rstd.resize(n);
    a.fch.resize(ns * 4 * C);
    a.fch_gelu.resize(ns * 4 * C);
    return;
  }
  a.att = TensorAttentionActivations(att_, B, T);
  a.res2.resize(n * cl);
  a.ln2.resize(n * cl);
  a.ln2_mean.resize(n);
  a.ln2_rstd.resize(n);
  a.fch.resize(n * fc_.out_local);
  a.fch_gelu.resize(n * fc_.out_local);
}

void TensorModel::prepare(int B, int T) {
  if (T > cfg_.block_size)
    throw Error(
        fmt::format("sequence length {} exceeds the model's block_size {}", T, cfg_.block_size));
  State& s = *st_;
  if (s.B == B && s.T == T) return;
  const int L = cfg_.n_layer, C = cfg_.n_embd;
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  att_.local_batch(B);  // throws unless B % tz == 0
  const bool sp = opt_.sequence_parallel;
  if (sp && B % att_.tx != 0)
    throw Error(fmt::format("sequence parallelism splits the micro-batch of {} sequences over "
                            "tx={}: it is not divisible",
                            B, att_.tx),
                "choose a micro-batch divisible by parallel.tx");
  TESSERA_CHECK(s.live.empty(), "the micro-batch shape changed with {} slots in flight",
                s.live.size());
  s = State{};
  s.B = B;
  s.T = T;
  s.n = N / att_.tz;
  const std::int64_t n = s.n;
  const int cl = att_.c_local;
  if (opt_.recompute) {
    s.shared_layer.resize(1);
    init_layer(s.shared_layer[0], B, T);
  }
  // Two workspace sets (by layer parity) when a chunk has layers to overlap across.
  int max_nl = 0;
  for (const auto& ch : opt_.chunks) max_nl = std::max(max_nl, ch.end_layer - ch.first_layer);
  const bool two = !sp && (opt_.prefetch || opt_.defer_dw) && L > 1 && max_nl > 1;
  s.sets.resize(two ? 2 : 1);
  for (auto& w : s.sets) {
    w.att = TensorAttentionWorkspace(att_, B, T);
    w.fc = TensorLinearWorkspace(fc_);
    w.fcproj = TensorLinearWorkspace(fcproj_);
    for (auto* lw : w.linears()) {
      lw->tuner = tuner_.get();
      lw->overlap_dx = opt_.overlap_dx;
      lw->defer_reduce = opt_.defer_dw && two;
    }
  }
  s.vocab_ws = VocabParallelWorkspace(vocab_, n, T);
  s.row_stats.resize(2 * n);
  s.ln_params.resize(2 * cl);
  s.mlp_out.resize(n * cl);
  s.d_fch.resize(n * fc_.out_local);
  s.d_ln.resize(n * cl);
  s.d_res.resize(n * cl);
  if (sp) {
    s.sp_full.resize(n * 4 * C);
    s.sp_part.resize(n * 4 * C);
    s.sp_local.resize(n / att_.tx * 4 * C);
  }
  s.pool.resize(opt_.chunks.size());
}

void TensorModel::invalidate_weights() {
  for (auto& set : st_->sets)
    for (auto* lw : set.linears()) {
      tensor_linear_finish(*lw);
      tensor_linear_invalidate(*lw);
    }
}

void TensorModel::begin_step(int B, int T) {
  prepare(B, T);
  // New parameters since the last pass: nothing cached is valid; nothing may be in flight.
  invalidate_weights();
}

TensorModel::Slot& TensorModel::acquire(int chunk, int mb) {
  State& s = *st_;
  TESSERA_CHECK(s.B > 0, "begin_step() must come before the first micro-batch");
  TESSERA_CHECK(chunk >= 0 && chunk < static_cast<int>(opt_.chunks.size()), "chunk {} of {}", chunk,
                opt_.chunks.size());
  auto key = std::make_pair(chunk, mb);
  auto it = s.live.find(key);
  if (it != s.live.end()) return *it->second;
  std::unique_ptr<Slot> slot;
  auto& pool = s.pool[chunk];
  if (!pool.empty()) {
    slot = std::move(pool.back());
    pool.pop_back();
  } else {
    slot = std::make_unique<Slot>();
    const auto& ch = opt_.chunks[chunk];
    const int nl = ch.end_layer - ch.first_layer;
    const std::int64_t n = s.n;
    const std::size_t bn = boundary_numel();
    slot->resid.assign(nl + 1, std::vector<float>(bn));
    if (!opt_.recompute) {
      slot->layers.resize(nl);
      for (auto& a : slot->layers) init_layer(a, s.B, s.T);
    }
    if (ch.embedding) slot->ids.resize(n);
    if (ch.head) {
      slot->targets.resize(n);
      slot->lnf.resize(bn);
      slot->lnf_mean.resize(n);
      slot->lnf_rstd.resize(n);
      slot->losses.resize(n);
      slot->logits.resize(s.vocab_ws.logits.size());
      slot->h_full.resize(s.vocab_ws.h_full.size());
    }
  }
  auto& st = s.stats;
  const std::size_t b = slot->bytes();
  st.live += 1;
  st.live_bytes += b;
  st.peak_live = std::max(st.peak_live, st.live);
  st.peak_bytes = std::max(st.peak_bytes, st.live_bytes);
  st.slot_bytes_max = std::max(st.slot_bytes_max, b);
  slot->have_targets = false;
  return *s.live.emplace(key, std::move(slot)).first->second;
}

TensorModel::Slot& TensorModel::live_slot(int chunk, int mb) const {
  auto it = st_->live.find({chunk, mb});
  TESSERA_CHECK(it != st_->live.end(), "no forward of micro-batch {} on chunk {} in flight", mb,
                chunk);
  return *it->second;
}

void TensorModel::release_slot(int chunk, int mb) {
  State& s = *st_;
  auto it = s.live.find({chunk, mb});
  if (it == s.live.end()) return;
  s.stats.live -= 1;
  s.stats.live_bytes -= it->second->bytes();
  s.pool[chunk].push_back(std::move(it->second));
  s.live.erase(it);
}

float* TensorModel::chunk_input(int chunk, int mb) {
  TESSERA_CHECK(!opt_.chunks[chunk].embedding, "the first chunk reads tokens, not activations");
  return acquire(chunk, mb).resid.front().data();
}

const float* TensorModel::chunk_output(int chunk, int mb) const {
  return live_slot(chunk, mb).resid.back().data();
}

const float* TensorModel::input_grad() const {
  return st_->d_res.data();
}

// ---- forward ----

float TensorModel::forward_chunk(model::ParamStore& store, int chunk, int mb,
                                 const std::int32_t* inputs, const std::int32_t* targets,
                                 const model::ForwardOptions& opt) {
  State& s = *st_;
  const auto& ch = opt_.chunks.at(chunk);
  const int L = cfg_.n_layer, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int B = s.B, T = s.T;
  const std::int64_t N = static_cast<std::int64_t>(B) * T, n = s.n;
  const int cl = att_.c_local;
  const std::int64_t r0 = vocab_.row_offset(N);
  Slot& sl = acquire(chunk, mb);
  const auto lib = opt.gemm;
  const bool prefetch = opt_.prefetch && !opt_.sequence_parallel && s.sets.size() > 1;
  const float* E = (ch.embedding || ch.head) ? store.params(0) : nullptr;
  if (ch.embedding) {
    for (std::int64_t i = 0; i < N; ++i)
      if (inputs[i] < 0 || inputs[i] >= V)
        throw Error(
            fmt::format("input token id {} is outside the model's vocabulary of {}", inputs[i], V),
            "the data was tokenized with a larger vocabulary than model.vocab_size");
    std::copy(inputs + r0, inputs + r0 + n, sl.ids.begin());
    vocab_embedding_forward(vocab_, vocab_comms_, sl.resid[0].data(), sl.ids.data(), E + local_.wte,
                            E + local_.wpe, N, T, s.vocab_ws);
  }
  const int a = ch.first_layer, b = ch.end_layer;
  for (int l = a; l < b; ++l) {
    const float* blk = store.params(l + 1);
    if (prefetch && l + 1 < b) prefetch_layer(l + 1, store.params(l + 2));
    Layer& acts = opt_.recompute ? s.shared_layer[0] : sl.layers[l - a];
    const float* x = sl.resid[l - a].data();
    float* y = sl.resid[l - a + 1].data();
    if (opt_.sequence_parallel)
      sp_layer_forward(lib, l, blk, x, y, B, T, acts);
    else
      layer_forward(lib, l, blk, x, y, B, T, acts);
    store.release(l + 1);
  }
  if (!ch.head) return 0.0f;
  const float* F = store.params(L + 1);
  auto PF = [&](std::size_t off) { return F + (off - local_.lnf_w); };
  tensor_layernorm_forward(*att_comms_.tx, sl.lnf.data(), sl.lnf_mean.data(), sl.lnf_rstd.data(),
                           sl.resid.back().data(), PF(local_.lnf_w), PF(local_.lnf_b), n, cl, C,
                           s.row_stats.data());
  vocab_lm_head_forward(lib, vocab_, vocab_comms_, sl.lnf.data(), E + local_.wte, n, s.vocab_ws);
  store.release(L + 1);
  sl.have_targets = targets != nullptr;
  float loss = 0.0f;
  if (targets) {
    for (std::int64_t i = 0; i < N; ++i)
      if (targets[i] >= V)
        throw Error(fmt::format("target token id {} is outside the model's vocabulary of {}",
                                targets[i], V),
                    "the data was tokenized with a larger vocabulary than model.vocab_size");
    std::copy(targets + r0, targets + r0 + n, sl.targets.begin());
    vocab_cross_entropy(vocab_, vocab_comms_, sl.losses.data(), sl.targets.data(), n, opt.training,
                        opt.dloss, s.vocab_ws);
    loss =
        static_cast<float>(vocab_mean_loss(vocab_comms_, sl.losses.data(), sl.targets.data(), n));
  }
  // The slot keeps the (d)logits and the head input until its backward.
  std::swap(sl.logits, s.vocab_ws.logits);
  std::swap(sl.h_full, s.vocab_ws.h_full);
  return loss;
}

float TensorModel::forward(model::ParamStore& store, const std::int32_t* inputs,
                           const std::int32_t* targets, int B, int T,
                           const model::ForwardOptions& opt) {
  TESSERA_CHECK(opt_.chunks.size() == 1 && opt_.chunks[0].embedding && opt_.chunks[0].head,
                "forward() runs the whole model; a pipeline stage runs forward_chunk()");
  release_slot(0, 0);  // an evaluation forward leaves its slot
  begin_step(B, T);
  store.begin_forward();
  return forward_chunk(store, 0, 0, inputs, targets, opt);
}

// ---- backward ----

void TensorModel::backward_chunk(model::ParamStore& store, int chunk, int mb, const float* dy,
                                 kernels::GemmLibrary lib) {
  State& s = *st_;
  const auto& ch = opt_.chunks.at(chunk);
  Slot& sl = live_slot(chunk, mb);
  const int L = cfg_.n_layer, C = cfg_.n_embd, B = s.B, T = s.T;
  const std::int64_t N = static_cast<std::int64_t>(B) * T, n = s.n;
  const int cl = att_.c_local;
  auto progress = [&] { progress_all(store); };
  float* GE = nullptr;
  if (ch.embedding || ch.head) {
    store.params(0);
    GE = store.grads(0);
  }
  if (ch.head) {
    TESSERA_CHECK(sl.have_targets, "backward needs a training forward with targets");
    const float* F = store.params(L + 1);
    float* GFb = store.grads(L + 1);
    auto PF = [&](std::size_t off) { return F + (off - local_.lnf_w); };
    auto GF = [&](std::size_t off) { return GFb + (off - local_.lnf_w); };
    // LM head (the slot's logits hold the dlogits), then the final LayerNorm.
    std::swap(sl.logits, s.vocab_ws.logits);
    std::swap(sl.h_full, s.vocab_ws.h_full);
    vocab_lm_head_backward(lib, vocab_, vocab_comms_, s.d_ln.data(), GE + local_.wte, n,
                           s.vocab_ws);
    std::swap(sl.logits, s.vocab_ws.logits);
    std::swap(sl.h_full, s.vocab_ws.h_full);
    std::fill(s.d_res.begin(), s.d_res.end(), 0.0f);
    tensor_layernorm_backward(*att_comms_.tx, *att_comms_.tz, s.d_res.data(), GF(local_.lnf_w),
                              GF(local_.lnf_b), s.d_ln.data(), sl.resid.back().data(),
                              PF(local_.lnf_w), sl.lnf_mean.data(), sl.lnf_rstd.data(), n, cl, C,
                              s.row_stats.data(), s.ln_params.data());
    store.grads_done(L + 1);
    store.release(L + 1);
  } else {
    TESSERA_CHECK(dy != nullptr, "backward of a chunk without the head needs its output gradient");
    std::copy(dy, dy + boundary_numel(), s.d_res.begin());
  }

  const bool prefetch = opt_.prefetch && !opt_.sequence_parallel && s.sets.size() > 1;
  const bool defer = opt_.defer_dw && !opt_.sequence_parallel && s.sets.size() > 1;
  auto finish_layer = [&](int layer) {
    for (auto* lw : ws_of(layer).linears()) tensor_linear_finish(*lw);
  };
  const int a = ch.first_layer, b = ch.end_layer;
  for (int l = b - 1; l >= a; --l) {
    const float* blk = store.params(l + 1);
    float* gblk = store.grads(l + 1);
    if (prefetch && l > a) prefetch_layer(l - 1, store.params(l));
    Layer& acts = opt_.recompute ? s.shared_layer[0] : sl.layers[l - a];
    const float* x = sl.resid[l - a].data();
    if (opt_.sequence_parallel) {
      if (opt_.recompute) {
        sp_layer_forward(lib, l, blk, x, sl.resid[l - a + 1].data(), B, T, acts);
        progress();
      }
      sp_layer_backward(lib, l, blk, gblk, x, B, T, acts, store);
    } else {
      if (opt_.recompute) {
        // Re-issues the gathers and all-reduces; rewrites the (unchanged) layer output.
        layer_forward(lib, l, blk, x, sl.resid[l - a + 1].data(), B, T, acts);
        progress();
      }
      layer_backward(lib, l, blk, gblk, x, B, T, acts, store);
    }
    if (!defer) {
      store.grads_done(l + 1);
    } else if (l + 1 < b) {
      // Layer l+1's weight-gradient reductions ran during this layer's backward.
      finish_layer(l + 1);
      store.grads_done(l + 2);
    }
    store.release(l + 1);
  }
  if (defer && b > a) {
    finish_layer(a);
    store.grads_done(a + 1);
  }
  if (ch.embedding)
    vocab_embedding_backward(vocab_, vocab_comms_, GE + local_.wte, GE + local_.wpe, s.d_res.data(),
                             sl.ids.data(), N, T, s.vocab_ws);
  if (ch.embedding || ch.head) {
    store.grads_done(0);
    store.release(0);
  }
  release_slot(chunk, mb);
}

void TensorModel::backward(model::ParamStore& store, const std::int32_t* inputs, int B, int T,
                           kernels::GemmLibrary lib) {
  State& s = *st_;
  TESSERA_CHECK(s.B == B && s.T == T && st_->live.count({0, 0}) && live_slot(0, 0).have_targets,
                "backward() needs a training forward() of the same batch");
  (void)inputs;  // the forward kept this rank's rows
  store.begin_backward();
  backward_chunk(store, 0, 0, nullptr, lib);
}

}  // namespace tessera::parallel
