#include "tessera/parallel/tensor_model.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <string_view>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/model/cpu_ops.hpp"
#include "tessera/model/gpt_block.hpp"
#include "tessera/parallel/tensor_layernorm.hpp"

namespace tessera::parallel {

using comm::Axis;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Which layer tensor a global tensor is (by its Hugging Face name, GPT-2's or llama's). llama's
// q, k, v (and gate, up) are one fused matrix from q_proj (gate_proj): the rank's block of the
// fused matrix is stored at q_proj (gate_proj); k_proj, v_proj and up_proj hold no local elements.
enum class Kind {
  Wte,
  Wpe,
  Head,
  Norm,
  QkvW,
  QkvB,
  ProjW,
  ProjB,
  FcW,
  FcB,
  FcProjW,
  FcProjB,
  Fused
};

Kind kind_of(const model::ParamTensor& t) {
  const std::string& n = t.name;
  if (n == "wte.weight" || n == "model.embed_tokens.weight") return Kind::Wte;
  if (n == "wpe.weight") return Kind::Wpe;
  if (n == "lm_head.weight") return Kind::Head;
  if (ends_with(n, "attn.c_attn.weight") || ends_with(n, "self_attn.q_proj.weight"))
    return Kind::QkvW;
  if (ends_with(n, "attn.c_attn.bias")) return Kind::QkvB;
  if (ends_with(n, "attn.c_proj.weight") || ends_with(n, "self_attn.o_proj.weight"))
    return Kind::ProjW;
  if (ends_with(n, "attn.c_proj.bias")) return Kind::ProjB;
  if (ends_with(n, "mlp.c_fc.weight") || ends_with(n, "mlp.gate_proj.weight")) return Kind::FcW;
  if (ends_with(n, "mlp.c_fc.bias")) return Kind::FcB;
  if (ends_with(n, "mlp.c_proj.weight") || ends_with(n, "mlp.down_proj.weight"))
    return Kind::FcProjW;
  if (ends_with(n, "mlp.c_proj.bias")) return Kind::FcProjB;
  if (ends_with(n, "self_attn.k_proj.weight") || ends_with(n, "self_attn.v_proj.weight") ||
      ends_with(n, "mlp.up_proj.weight"))
    return Kind::Fused;
  if (ends_with(n, "ln_1.weight") || ends_with(n, "ln_1.bias") || ends_with(n, "ln_2.weight") ||
      ends_with(n, "ln_2.bias") || ends_with(n, "ln_f.weight") || ends_with(n, "ln_f.bias") ||
      ends_with(n, "input_layernorm.weight") || ends_with(n, "post_attention_layernorm.weight") ||
      n == "model.norm.weight")
    return Kind::Norm;
  TESSERA_CHECK(false, "tensor parallelism does not know the parameter {}", n);
  return Kind::Norm;
}

bool is_bias(Kind k) {
  return k == Kind::QkvB || k == Kind::ProjB || k == Kind::FcB || k == Kind::FcProjB;
}

// The tensor-parallel layout of a block linear's weight or bias; nullptr for other kinds.
const TensorLinearLayout* linear_of(const TensorBlockGrid& g, Kind k) {
  if (k == Kind::QkvW || k == Kind::QkvB) return &g.qkv;
  if (k == Kind::ProjW || k == Kind::ProjB) return &g.proj;
  if (k == Kind::FcW || k == Kind::FcB) return &g.fc;
  if (k == Kind::FcProjW || k == Kind::FcProjB) return &g.fcproj;
  return nullptr;
}

// The block's linears on the grid. Throws (with a hint) unless the heads, the kv heads and the
// hidden sizes split.
TensorBlockGrid make_block_grid(const model::ModelConfig& cfg, const comm::Topology& topo) {
  const auto& s = topo.shape();
  const int C = cfg.n_embd, NH = cfg.n_head, KV = cfg.kv_heads(), F = cfg.ffn();
  if (NH % s.ty != 0)
    throw Error(fmt::format("n_head={} is not divisible by ty={}", NH, s.ty),
                "attention heads are split over ty: choose ty dividing the number of heads");
  if (KV % s.ty != 0)
    throw Error(fmt::format("n_kv_head={} is not divisible by ty={}", KV, s.ty),
                "key-value heads are split over ty with their query heads: choose ty dividing "
                "n_kv_head");
  if (F % s.ty != 0)
    throw Error(fmt::format("the MLP width {} is not divisible by ty={}", F, s.ty),
                "choose ty dividing the model's intermediate size");
  if (C % s.tx != 0)
    throw Error(fmt::format("n_embd={} is not divisible by tx={}", C, s.tx),
                "choose tx dividing the model's hidden size");
  TensorBlockGrid g;
  g.qkv = make_tensor_linear_layout(topo, C, cfg.qkv_rows(), false);
  g.proj = make_tensor_linear_layout(topo, NH * cfg.head_dim(), C, true);
  g.fc = make_tensor_linear_layout(topo, C, cfg.fc_rows(), false);
  g.fcproj = make_tensor_linear_layout(topo, F, C, true);
  g.C = C;
  g.c_local = C / s.tx;
  return g;
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

// One layer's activations (model::BlockActs; the output is the slot's next residual). n_att rows
// in the region between a normal and a transposed linear: n, or n/tx with sequence parallelism.
// bf16 (without sequence parallelism) keeps the three activations that only GEMMs read -- the
// norms' outputs and the MLP's activation, inputs of qkv, fc and fcproj -- as the bf16 copies
// those GEMMs round them to anyway (ln1_16, ln2_16, act16): the backward's weight-gradient GEMMs
// read the same bits, and the fp32 ones live only from their op to the GEMM (State::transient).
struct TensorModel::Layer {
  std::vector<float> ln1, ln1_mean, ln1_rstd;  // (n, cl), (n), (n)
  std::vector<float> qkv, atty, lse;           // (n_att, qkv/ty), (n_att, C/ty), (b_att, NH/ty, T)
  std::vector<float> res2;                     // (n, cl) residual after attention
  std::vector<float> ln2, ln2_mean, ln2_rstd;  // (n, cl), (n), (n)
  std::vector<float> fch, fch_gelu;            // (n_att, fc_rows/ty), (n_att, F/ty)
  std::vector<std::uint16_t> ln1_16, ln2_16, act16;  // bf16: instead of ln1, ln2, fch_gelu
  std::size_t bytes() const {
    std::size_t f = 0;
    for (const auto* v : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &atty, &lse, &res2, &ln2, &ln2_mean,
                          &ln2_rstd, &fch, &fch_gelu})
      f += v->size() * sizeof(float);
    for (const auto* v : {&ln1_16, &ln2_16, &act16}) f += v->size() * sizeof(std::uint16_t);
    return f;
  }
  bool keeps_bf16() const { return !ln1_16.empty(); }
  TensorOps::KeptInputs kept() {  // BlockLinear's order: qkv, proj (none), fc, fcproj
    if (!keeps_bf16()) return {};
    return {ln1_16.data(), nullptr, ln2_16.data(), act16.data()};
  }
};

// One micro-batch's activations through one chunk of nl layers.
struct TensorModel::Slot {
  std::vector<std::int32_t> ids, targets;  // (n) this rank's rows (embedding / head chunk)
  std::vector<std::vector<float>> resid;   // nl+1 x (n, cl): the input, then each layer's output
  std::vector<Layer> layers;               // nl (none with recomputation)
  std::vector<float> lnf, lnf_mean, lnf_rstd, losses;  // head chunk: (n, cl), (n), (n), (n)
  // Head chunk: the vocabulary workspace's logits (dlogits after training) and LM head input,
  // kept here between the forward and the backward: the forward hands its buffers to the slot
  // and the backward hands them back, so one micro-batch in flight needs one set.
  std::vector<float> logits, h_full;
  std::size_t head_numel = 0;  // what logits and h_full hold while the slot is in flight
  bool have_targets = false;
  std::size_t bytes() const {
    std::size_t f = ids.size() + targets.size() + lnf.size() + lnf_mean.size() + lnf_rstd.size() +
                    losses.size() + head_numel;
    for (const auto& r : resid) f += r.size();
    f *= sizeof(float);
    for (const auto& a : layers) f += a.bytes();
    return f;
  }
};

struct TensorModel::State {
  int B = 0, T = 0;
  std::int64_t n = 0;               // local rows
  std::vector<Layer> shared_layer;  // recomputation: the one layer's activations, rebuilt
  // bf16: the fp32 ln1, ln2 and fch_gelu of the layer being computed (Layer: kept in bf16)
  std::vector<float> ln1_tmp, ln2_tmp, act_tmp;
  // 1, or 2 alternating by layer parity (overlap); bf16 without tz: one per layer (each keeps
  // its layer's bf16 weights for the step)
  std::vector<TensorBlockWorkspace> sets;
  TensorOpsScratch ops;
  kernels::cpu::Bf16Scratch bf16;  // bf16: the GEMM operands of every linear and the head
  VocabParallelWorkspace vocab_ws;
  std::size_t logits_numel = 0, h_full_numel = 0;  // vocab_ws's, handed to the head's slots
  // Backward scratch (model::BlockScratch): (n, cl) x2, then the replicated region's.
  std::vector<float> d_res, d_ln, d_atty, d_qkv, d_fch, d_act;
  std::vector<std::vector<std::unique_ptr<Slot>>> pool;       // per chunk: free slots
  std::map<std::pair<int, int>, std::unique_ptr<Slot>> live;  // (chunk, mb) in flight
  ActivationStats stats;
};

TensorModel::TensorModel(const model::ModelConfig& cfg, const comm::Topology& topo,
                         comm::Runtime& rt, const TensorModelOptions& opt)
    : cfg_(cfg),
      opt_(with_chunks(cfg, opt)),
      global_(cfg),
      grid_(make_block_grid(cfg, topo)),
      vocab_(make_vocab_parallel_layout(topo, cfg.vocab_size, cfg.padded_vocab(), cfg.n_embd)),
      local_(cfg, [this](const model::ParamTensor& t) { return local_numel(t); }),
      st_(std::make_unique<State>()) {
  const auto& s = topo.shape();
  tensor_size_ = s.tx * s.ty * s.tz;
  tx_ = s.tx;
  ty_ = s.ty;
  tz_ = s.tz;
  ty_index_ = topo.coord(Axis::TY);
  tz_index_ = topo.coord(Axis::TZ);
  c_offset_ = topo.coord(Axis::TX) * grid_.c_local;
  if (opt.sequence_parallel && (s.ty != 1 || s.tz != 1))
    throw Error(fmt::format("sequence parallelism is implemented for 1D tensor parallelism over "
                            "tx; the grid has ty={} tz={}",
                            s.ty, s.tz),
                "set parallel.sequence_parallel = false, or use tx alone");
  // Communicators: every rank asks for the same groups in the same order.
  grid_.qkv_c = tensor_linear_comms(rt, topo, false);
  grid_.proj_c = tensor_linear_comms(rt, topo, true);
  grid_.fc_c = tensor_linear_comms(rt, topo, false);
  grid_.fcproj_c = tensor_linear_comms(rt, topo, true);
  grid_.tx = &rt.group(topo, comm::AxisSet{Axis::TX});
  grid_.tz = &rt.group(topo, comm::AxisSet{Axis::TZ});
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
  identity_ = model_group_->size() == 1 && local_.total() == global_.total();
  for (std::size_t i = 0; identity_ && i < index.size(); ++i)
    identity_ = index[i] == static_cast<std::int64_t>(i) || index[i] == -1;  // -1: padding
  if (identity_) std::vector<std::uint8_t>().swap(owner_);  // every element is this rank's
}

// Elements of tensor t that this rank holds (0: another stage's, or fused into another).
std::size_t TensorModel::local_numel(const model::ParamTensor& t) const {
  if (!holds(t)) return 0;
  const Kind k = kind_of(t);
  auto z = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  if (const TensorLinearLayout* L = linear_of(grid_, k))
    return z(is_bias(k) ? L->out_local : L->shard_numel);
  if (k == Kind::Wte || k == Kind::Head) return z(vocab_.shard_numel);
  if (k == Kind::Wpe) return z(cfg_.block_size) * z(grid_.c_local);
  if (k == Kind::Norm) return z(grid_.c_local);
  return 0;  // Kind::Fused
}

namespace {
// One local tensor's entries of the maps (TensorModel::build_maps): each local element's index
// in the global layout (`go`: the tensor's global offset) and whether this rank owns it.
struct TensorMap {
  std::int64_t go;
  std::int64_t* idx;
  std::uint8_t* own;
  int ty;

  // Global row of a local row: through a fused matrix's ty-grouped row order (seg), if any.
  std::int64_t source(const std::vector<int>* seg, std::int64_t row) const {
    return seg ? grouped_source_row(*seg, ty, static_cast<int>(row)) : row;
  }
  void weight(const TensorLinearLayout& L, const std::vector<int>* seg) const {
    for (std::int64_t s = 0; s < L.shard_numel; ++s) {
      const std::int64_t e = L.shard_offset + s;
      const std::int64_t row = source(seg, L.out_offset + e / L.in_local);
      idx[s] = go + row * L.in + L.in_offset + e % L.in_local;
      own[s] = 1;
    }
  }
  void bias(const TensorLinearLayout& L, const std::vector<int>* seg) const {
    const bool o = L.in_index == 0 && L.tz_index == 0;
    for (int j = 0; j < L.out_local; ++j) {
      idx[j] = go + source(seg, L.out_offset + j);
      own[j] = o;
    }
  }
  // The embedding's or the head's rows of this rank's vocabulary shard.
  void vocab_rows(const VocabParallelLayout& v, int C, bool owned) const {
    for (std::int64_t s = 0; s < v.shard_numel; ++s) {
      const std::int64_t e = v.shard_offset + s;
      idx[s] = go + (v.vocab_offset + e / C) * C + e % C;
      own[s] = owned;
    }
  }
  // `rows` rows of C channels (position embeddings; a norm's one row), of which this rank holds
  // the columns [c_offset, c_offset + cl).
  void channels(std::int64_t rows, int C, int cl, int c_offset, bool owned) const {
    for (std::int64_t t = 0; t < rows; ++t)
      for (int j = 0; j < cl; ++j) {
        idx[t * cl + j] = go + t * C + c_offset + j;
        own[t * cl + j] = owned;
      }
  }
};
}  // namespace

void TensorModel::build_maps(std::vector<std::int64_t>& index,
                             std::vector<std::uint8_t>& owner) const {
  const model::ModelConfig& cfg = cfg_;
  const int C = cfg.n_embd, cl = grid_.c_local, hs = cfg.head_dim();
  const bool norm_owner = ty_index_ == 0 && tz_index_ == 0;
  const bool embedding_here = opt_.chunks.front().embedding;  // (the head's copy is not counted)
  index.assign(local_.total(), -1);
  owner.assign(local_.total(), 0);
  const auto& gt = global_.tensors();
  const auto& lt = local_.tensors();
  TESSERA_CHECK(gt.size() == lt.size(), "local and global layouts differ");
  // The ty-grouped row orders of the fused matrices (tensor_attention.hpp).
  const std::vector<int> qkv = {cfg.n_head * hs, cfg.kv_heads() * hs, cfg.kv_heads() * hs};
  const std::vector<int> fc =
      cfg.llama() ? std::vector<int>{cfg.ffn(), cfg.ffn()} : std::vector<int>{cfg.ffn()};
  for (std::size_t ti = 0; ti < gt.size(); ++ti) {
    if (lt[ti].numel == 0) continue;  // a tensor of another pipeline stage (or fused into one)
    const TensorMap m{static_cast<std::int64_t>(gt[ti].offset), index.data() + lt[ti].offset,
                      owner.data() + lt[ti].offset, ty_};
    const Kind k = kind_of(gt[ti]);
    if (const TensorLinearLayout* L = linear_of(grid_, k)) {
      const bool q = k == Kind::QkvW || k == Kind::QkvB, f = k == Kind::FcW || k == Kind::FcB;
      const std::vector<int>* rows = q ? &qkv : f ? &fc : nullptr;  // fused: ty-grouped rows
      if (is_bias(k))
        m.bias(*L, rows);
      else
        m.weight(*L, rows);
    } else if (k == Kind::Wte || k == Kind::Head) {
      m.vocab_rows(vocab_, C, k == Kind::Head || embedding_here);
    } else if (k == Kind::Wpe || k == Kind::Norm) {
      m.channels(k == Kind::Wpe ? cfg.block_size : 1, C, cl, c_offset_, norm_owner);
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
    case Kind::Wte:  // tied: the LM head's weight too
      return ch.front().embedding || (ch.back().head && cfg_.tie_embeddings);
    case Kind::Wpe:
      return ch.front().embedding;
    default:  // ln_f, an untied LM head
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
  if (identity_) {  // padding is zero in both
    std::copy(global, global + global_.total(), local);
    return;
  }
  const auto index = global_index();
  const std::size_t n = index.size();
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) local[i] = index[i] < 0 ? 0.0f : global[index[i]];
}

void TensorModel::gather_full(const float* local, float* global) {
  if (identity_) {  // padding is zero in both
    std::copy(local, local + local_.total(), global);
    return;
  }
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
  add(s.vocab_ws.logits), add(s.vocab_ws.h_full), add(s.ln1_tmp), add(s.ln2_tmp), add(s.act_tmp);
  f *= sizeof(float);
  for (const auto& a : s.shared_layer) f += a.bytes();
  return f + s.stats.live_bytes;
}

const TensorModel::ActivationStats& TensorModel::activation_stats() const {
  return st_->stats;
}

void TensorModel::reset_activation_stats() {
  auto& st = st_->stats;
  st.peak_live = st.live;
  st.peak_bytes = st.live_bytes;
}

int TensorModel::min_batch() const {
  return opt_.sequence_parallel ? std::lcm(tz_, tx_) : tz_;
}

void TensorModel::logits_row(std::int64_t row, float* out) {
  const State& s = *st_;
  TESSERA_CHECK(opt_.chunks.back().head && s.live.empty() && !s.vocab_ws.logits.empty(),
                "logits_row() reads the head's logits after an evaluation forward has ended");
  const std::int64_t N = static_cast<std::int64_t>(s.B) * s.T, r0 = vocab_.row_offset(N);
  TESSERA_CHECK(row >= 0 && row < N, "row {} of a micro-batch of {} rows", row, N);
  std::fill(out, out + cfg_.vocab_size, 0.0f);
  if (row >= r0 && row < r0 + s.n) {
    const float* z = s.vocab_ws.logits.data() + (row - r0) * vocab_.vocab_local;
    std::copy(z, z + vocab_.real_local, out + vocab_.vocab_offset);
  }
  tensor_group_->all_reduce_sum(out, static_cast<std::size_t>(cfg_.vocab_size));
}

std::size_t TensorModel::boundary_numel() const {
  return static_cast<std::size_t>(st_->n) * static_cast<std::size_t>(grid_.c_local);
}

// ---- overlap helpers ----

TensorBlockWorkspace& TensorModel::ws_of(int layer) {
  auto& sets = st_->sets;
  return sets[static_cast<std::size_t>(layer) % sets.size()];
}

void TensorModel::prefetch_layer(int layer, const float* blk) {
  const auto& w = local_.layers[layer];
  auto PL = [&](std::size_t off) { return blk + (off - w.begin); };
  TensorBlockWorkspace& ws = ws_of(layer);
  const TensorBlockGrid& g = grid_;
  // The order of consumption (the same on every rank: tz collectives start in one order).
  tensor_linear_prefetch_weight(g.qkv, g.qkv_c, PL(w.qkv_w), ws.qkv, layer);
  tensor_linear_prefetch_weight(g.proj, g.proj_c, PL(w.attproj_w), ws.proj, layer);
  tensor_linear_prefetch_weight(g.fc, g.fc_c, PL(w.fc_w), ws.fc, layer);
  tensor_linear_prefetch_weight(g.fcproj, g.fcproj_c, PL(w.fcproj_w), ws.fcproj, layer);
}

void TensorModel::progress_all(model::ParamStore& store) {
  store.progress();
  for (auto& set : st_->sets)
    for (auto* lw : set.linears()) tensor_linear_progress(*lw);
}

// ---- one layer: the one block (model/gpt_block.hpp) through the grid's op table ----

model::BlockShape TensorModel::local_shape(int B, int T) const {
  // The shape the block passes to the ops on the rank's heads and columns: the sequences of the
  // replicated region (B/tz, or B/tz/tx with sequence parallelism), NH/ty heads, KV/ty kv heads,
  // F/ty. The ops take the rows and channels of the norms and linears from the grid.
  const int b_att = B / tz_ / (opt_.sequence_parallel ? tx_ : 1);
  model::BlockShape sh = model::block_shape(cfg_, b_att, T);
  sh.NH /= ty_;
  sh.KV /= ty_;
  sh.F /= ty_;
  return sh;
}

model::BlockActs<float> TensorModel::block_acts(Layer& a, float* y) {
  State& s = *st_;
  const bool k = a.keeps_bf16();
  return {k ? s.ln1_tmp.data() : a.ln1.data(),
          a.ln1_mean.data(),
          a.ln1_rstd.data(),
          a.qkv.data(),
          a.atty.data(),
          a.lse.data(),
          a.res2.data(),
          k ? s.ln2_tmp.data() : a.ln2.data(),
          a.ln2_mean.data(),
          a.ln2_rstd.data(),
          a.fch.data(),
          k ? s.act_tmp.data() : a.fch_gelu.data(),
          y};
}

void TensorModel::layer_forward(kernels::GemmLibrary lib, int l, const float* blk, const float* x,
                                float* y, int B, int T, Layer& a) {
  State& s = *st_;
  const auto w = model::block_weights(local_.layers[l], blk);
  TensorOps ops(grid_, ws_of(l), s.ops, lib, s.n, opt_.sequence_parallel, w, l, {}, a.kept());
  model::block_forward(ops, w, block_acts(a, y), x, local_shape(B, T));
}

void TensorModel::layer_backward(kernels::GemmLibrary lib, int l, const float* blk, float* gblk,
                                 const float* x, int B, int T, Layer& a, model::ParamStore& store) {
  State& s = *st_;
  const auto& lw = local_.layers[l];
  const auto w = model::block_weights(lw, blk);
  TensorBlockWorkspace& ws = ws_of(l);
  if (!opt_.sequence_parallel) {
    // The blocks: still in the workspace (from the forward, a recompute or a prefetch) or
    // gathered again now; always acquired in the forward's order (qkv, proj, fc, fcproj) on
    // every rank.
    const TensorBlockGrid& g = grid_;
    tensor_linear_acquire_weight(g.qkv, g.qkv_c, w.qkv_w, ws.qkv, l);
    tensor_linear_acquire_weight(g.proj, g.proj_c, w.attproj_w, ws.proj, l);
    tensor_linear_acquire_weight(g.fc, g.fc_c, w.fc_w, ws.fc, l);
    tensor_linear_acquire_weight(g.fcproj, g.fcproj_c, w.fcproj_w, ws.fcproj, l);
  }
  TensorOps ops(
      grid_, ws, s.ops, lib, s.n, opt_.sequence_parallel, w, l,
      [this, &store] { progress_all(store); }, a.kept());
  const model::BlockScratch<float> d{s.d_res.data(),
                                     s.d_res.data(),
                                     s.d_ln.data(),
                                     s.d_atty.data(),
                                     s.d_qkv.data(),
                                     s.d_fch.data(),
                                     cfg_.llama() ? s.d_act.data() : nullptr};
  // The layer's output is not read by the backward.
  model::block_backward(ops, w, model::block_grads(lw, gblk), block_acts(a, nullptr), d, x,
                        local_shape(B, T));
}

// ---- buffers and slots ----

void TensorModel::init_layer(Layer& a, int B, int T) const {
  const std::int64_t n = st_->n, cl = grid_.c_local;
  const model::BlockShape sh = local_shape(B, T);
  const std::int64_t n_att = sh.N();  // rows of the replicated region
  const bool ln = !cfg_.llama();      // RMSNorm keeps no mean
  const bool bf16 = keeps_bf16();
  auto fp32_or_bf16 = [bf16](std::vector<float>& f, std::vector<std::uint16_t>& h, std::int64_t k) {
    if (bf16)
      h.resize(k);
    else
      f.resize(k);
  };
  fp32_or_bf16(a.ln1, a.ln1_16, n * cl);
  a.ln1_mean.resize(ln ? n : 0);
  a.ln1_rstd.resize(n);
  a.qkv.resize(n_att * grid_.qkv.out_local);
  a.atty.resize(n_att * grid_.proj.in_local);
  a.lse.resize(static_cast<std::size_t>(sh.B) * sh.NH * T);
  a.res2.resize(n * cl);
  fp32_or_bf16(a.ln2, a.ln2_16, n * cl);
  a.ln2_mean.resize(ln ? n : 0);
  a.ln2_rstd.resize(n);
  a.fch.resize(n_att * grid_.fc.out_local);
  fp32_or_bf16(a.fch_gelu, a.act16, n_att * grid_.fcproj.in_local);
}

// A micro-batch of B sequences of T tokens is one this grid can split.
void TensorModel::check_batch(int B, int T) const {
  if (T > cfg_.block_size)
    throw Error(
        fmt::format("sequence length {} exceeds the model's block_size {}", T, cfg_.block_size));
  if (B <= 0 || B % tz_ != 0)
    throw Error(fmt::format("a batch of {} sequences cannot be split over tz={}", B, tz_),
                "attention needs whole sequences per rank: use a micro-batch divisible by tz");
  if (opt_.sequence_parallel && B % tx_ != 0)
    throw Error(fmt::format("sequence parallelism splits the micro-batch of {} sequences over "
                            "tx={}: it is not divisible",
                            B, tx_),
                "choose a micro-batch divisible by parallel.tx");
}

// The block workspaces: two sets (by layer parity) when a chunk has layers to overlap across,
// one per layer for bf16 without gathers to overlap (sets.size() is then free), else one.
void TensorModel::make_workspace_sets(State& s) {
  const int L = cfg_.n_layer;
  int max_nl = 0;
  for (const auto& ch : opt_.chunks) max_nl = std::max(max_nl, ch.end_layer - ch.first_layer);
  const bool two =
      !opt_.sequence_parallel && (opt_.prefetch || opt_.defer_dw) && L > 1 && max_nl > 1;
  const bool per_layer = opt_.bf16 && tz_ == 1;
  s.sets.resize(per_layer ? std::max(L, 1) : two ? 2 : 1);
  for (auto& w : s.sets) {
    w = TensorBlockWorkspace(grid_);
    for (auto* lw : w.linears()) {
      lw->tuner = opt_.bf16 ? nullptr : tuner_.get();
      lw->overlap_dx = opt_.overlap_dx;
      lw->defer_reduce = opt_.defer_dw && two;
      lw->bf16 = opt_.bf16 ? &s.bf16 : nullptr;
      lw->bf16_wire = opt_.bf16_tensor_wire;
    }
  }
}

void TensorModel::prepare(int B, int T) {
  check_batch(B, T);
  State& s = *st_;
  if (s.B == B && s.T == T) return;
  TESSERA_CHECK(s.live.empty(), "the micro-batch shape changed with {} slots in flight",
                s.live.size());
  s = State{};
  s.B = B;
  s.T = T;
  s.n = static_cast<std::int64_t>(B) * T / tz_;
  const std::int64_t n = s.n, cl = grid_.c_local;
  if (keeps_bf16()) {  // without sequence parallelism the replicated region has the n rows too
    s.ln1_tmp.resize(n * cl);
    s.ln2_tmp.resize(n * cl);
    s.act_tmp.resize(n * grid_.fcproj.in_local);
  }
  if (opt_.recompute) {
    s.shared_layer.resize(1);
    init_layer(s.shared_layer[0], B, T);
  }
  make_workspace_sets(s);
  s.ops.resize(grid_, n, opt_.sequence_parallel);
  s.ops.bf16_wire = opt_.bf16_tensor_wire;
  s.vocab_ws = VocabParallelWorkspace(vocab_, n, T);
  s.vocab_ws.bf16 = opt_.bf16 ? &s.bf16 : nullptr;
  s.logits_numel = s.vocab_ws.logits.size();
  s.h_full_numel = s.vocab_ws.h_full.size();
  const std::int64_t n_att = local_shape(B, T).N();
  s.d_res.resize(n * cl);
  s.d_ln.resize(n * cl);
  s.d_atty.resize(n_att * grid_.proj.in_local);
  s.d_qkv.resize(n_att * grid_.qkv.out_local);
  s.d_fch.resize(n_att * grid_.fc.out_local);
  if (cfg_.llama()) s.d_act.resize(n_att * grid_.fcproj.in_local);
  s.pool.resize(opt_.chunks.size());
}

void TensorModel::invalidate_weights() {
  for (auto& set : st_->sets)
    for (auto* lw : set.linears()) {
      tensor_linear_finish(*lw);
      tensor_linear_invalidate(*lw);
    }
  st_->vocab_ws.w16_valid = false;
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
      slot->head_numel = s.logits_numel + s.h_full_numel;
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
  Slot& sl = *it->second;
  // (d)logits still held (an evaluation forward has no backward): back to the workspace.
  if (s.vocab_ws.logits.empty()) std::swap(sl.logits, s.vocab_ws.logits);
  if (s.vocab_ws.h_full.empty()) std::swap(sl.h_full, s.vocab_ws.h_full);
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

void TensorModel::final_norm_forward(Slot& sl, const float* w, const float* b) {
  State& s = *st_;
  const int cl = grid_.c_local, C = cfg_.n_embd;
  if (cfg_.llama())
    tensor_rmsnorm_forward(*grid_.tx, sl.lnf.data(), sl.lnf_rstd.data(), sl.resid.back().data(), w,
                           s.n, cl, C, static_cast<float>(cfg_.norm_eps), s.ops.row_stats.data());
  else
    tensor_layernorm_forward(*grid_.tx, sl.lnf.data(), sl.lnf_mean.data(), sl.lnf_rstd.data(),
                             sl.resid.back().data(), w, b, s.n, cl, C, s.ops.row_stats.data());
}

void TensorModel::final_norm_backward(Slot& sl, const float* w, float* dw, float* db) {
  State& s = *st_;
  const int cl = grid_.c_local, C = cfg_.n_embd;
  std::fill(s.d_res.begin(), s.d_res.end(), 0.0f);
  if (cfg_.llama())
    tensor_rmsnorm_backward(*grid_.tx, *grid_.tz, s.d_res.data(), dw, s.d_ln.data(),
                            sl.resid.back().data(), w, sl.lnf_rstd.data(), s.n, cl, C,
                            s.ops.row_stats.data(), s.ops.norm_params.data());
  else
    tensor_layernorm_backward(*grid_.tx, *grid_.tz, s.d_res.data(), dw, db, s.d_ln.data(),
                              sl.resid.back().data(), w, sl.lnf_mean.data(), sl.lnf_rstd.data(),
                              s.n, cl, C, s.ops.row_stats.data(), s.ops.norm_params.data());
}

// The first chunk: the tokens' embeddings into the slot's first residual (inputs: all B x T).
void TensorModel::embed_forward(Slot& sl, const float* E, const std::int32_t* inputs) {
  State& s = *st_;
  const int V = cfg_.vocab_size;
  const std::int64_t N = static_cast<std::int64_t>(s.B) * s.T, r0 = vocab_.row_offset(N);
  for (std::int64_t i = 0; i < N; ++i)
    if (inputs[i] < 0 || inputs[i] >= V)
      throw Error(
          fmt::format("input token id {} is outside the model's vocabulary of {}", inputs[i], V),
          "the data was tokenized with a larger vocabulary than model.vocab_size");
  std::copy(inputs + r0, inputs + r0 + s.n, sl.ids.begin());
  const float* wpe = local_.wpe == model::k_absent ? nullptr : E + local_.wpe;
  vocab_embedding_forward(vocab_, vocab_comms_, sl.resid[0].data(), sl.ids.data(), E + local_.wte,
                          wpe, N, s.T, s.vocab_ws);
}

// The last chunk: the final norm, the head and (with targets) the loss, whose (d)logits and head
// input the slot keeps until its backward.
float TensorModel::head_forward(model::ParamStore& store, Slot& sl, const float* E,
                                const std::int32_t* targets, const model::ForwardOptions& opt) {
  State& s = *st_;
  const int L = cfg_.n_layer, V = cfg_.vocab_size;
  const std::int64_t N = static_cast<std::int64_t>(s.B) * s.T, n = s.n, r0 = vocab_.row_offset(N);
  const float* F = store.params(L + 1);
  auto PF = [&](std::size_t off) { return F + (off - local_.lnf_w); };
  final_norm_forward(sl, PF(local_.lnf_w),
                     local_.lnf_b == model::k_absent ? nullptr : PF(local_.lnf_b));
  // A slot in flight may hold the workspace's buffers (several micro-batches in flight).
  s.vocab_ws.logits.resize(s.logits_numel);
  s.vocab_ws.h_full.resize(s.h_full_numel);
  const bool tied = local_.head == local_.wte;
  vocab_lm_head_forward(opt.gemm, vocab_, vocab_comms_, sl.lnf.data(),
                        tied ? E + local_.wte : PF(local_.head), n, s.vocab_ws);
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
  std::swap(sl.logits, s.vocab_ws.logits);
  std::swap(sl.h_full, s.vocab_ws.h_full);
  return loss;
}

float TensorModel::forward_chunk(model::ParamStore& store, int chunk, int mb,
                                 const std::int32_t* inputs, const std::int32_t* targets,
                                 const model::ForwardOptions& opt) {
  State& s = *st_;
  const auto& ch = opt_.chunks.at(chunk);
  Slot& sl = acquire(chunk, mb);
  const bool prefetch = opt_.prefetch && !opt_.sequence_parallel && s.sets.size() > 1;
  const bool tied = local_.head == local_.wte;
  const float* E = (ch.embedding || (ch.head && tied)) ? store.params(0) : nullptr;
  if (ch.embedding) embed_forward(sl, E, inputs);
  const int a = ch.first_layer, b = ch.end_layer;
  for (int l = a; l < b; ++l) {
    const float* blk = store.params(l + 1);
    if (prefetch && l + 1 < b) prefetch_layer(l + 1, store.params(l + 2));
    Layer& acts = opt_.recompute ? s.shared_layer[0] : sl.layers[l - a];
    layer_forward(opt.gemm, l, blk, sl.resid[l - a].data(), sl.resid[l - a + 1].data(), s.B, s.T,
                  acts);
    store.release(l + 1);
  }
  return ch.head ? head_forward(store, sl, E, targets, opt) : 0.0f;
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

// The LM head's backward (the slot's logits hold the dlogits; they stay with the workspace
// after), then the final norm's, into s.d_res; GE: block 0's gradients (the tied head's).
void TensorModel::head_backward(model::ParamStore& store, Slot& sl, float* GE,
                                kernels::GemmLibrary lib) {
  State& s = *st_;
  const int L = cfg_.n_layer;
  TESSERA_CHECK(sl.have_targets, "backward needs a training forward with targets");
  const float* F = store.params(L + 1);
  float* GFb = store.grads(L + 1);
  auto PF = [&](std::size_t off) { return F + (off - local_.lnf_w); };
  auto GF = [&](std::size_t off) { return GFb + (off - local_.lnf_w); };
  const bool tied = local_.head == local_.wte;
  std::swap(sl.logits, s.vocab_ws.logits);
  std::swap(sl.h_full, s.vocab_ws.h_full);
  vocab_lm_head_backward(lib, vocab_, vocab_comms_, s.d_ln.data(),
                         tied ? GE + local_.wte : GF(local_.head), s.n, s.vocab_ws);
  final_norm_backward(sl, PF(local_.lnf_w), GF(local_.lnf_w),
                      local_.lnf_b == model::k_absent ? nullptr : GF(local_.lnf_b));
  store.grads_done(L + 1);
  store.release(L + 1);
}

// The chunk's layers, last to first, from the output gradient in s.d_res: each layer's
// parameters gathered (the next one's prefetched), recomputed when the activations were not
// kept, its gradients handed to the store when final (a layer later when its weight-gradient
// reductions are deferred).
void TensorModel::layers_backward(model::ParamStore& store, const ModelChunk& ch, Slot& sl,
                                  kernels::GemmLibrary lib) {
  State& s = *st_;
  const int B = s.B, T = s.T;
  auto progress = [&] { progress_all(store); };
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
    if (opt_.recompute) {
      // Re-issues the gathers and all-reduces; rewrites the (unchanged) layer output.
      layer_forward(lib, l, blk, x, sl.resid[l - a + 1].data(), B, T, acts);
      progress();
    }
    layer_backward(lib, l, blk, gblk, x, B, T, acts, store);
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
}

void TensorModel::backward_chunk(model::ParamStore& store, int chunk, int mb, const float* dy,
                                 kernels::GemmLibrary lib) {
  State& s = *st_;
  const auto& ch = opt_.chunks.at(chunk);
  Slot& sl = live_slot(chunk, mb);
  const int T = s.T;
  const std::int64_t N = static_cast<std::int64_t>(s.B) * T;
  const bool tied = local_.head == local_.wte;
  const bool block0 = ch.embedding || (ch.head && tied);
  float* GE = nullptr;
  if (block0) {
    store.params(0);
    GE = store.grads(0);
  }
  if (ch.head) {
    head_backward(store, sl, GE, lib);
  } else {
    TESSERA_CHECK(dy != nullptr, "backward of a chunk without the head needs its output gradient");
    std::copy(dy, dy + boundary_numel(), s.d_res.begin());
  }
  layers_backward(store, ch, sl, lib);
  if (ch.embedding) {
    float* gwpe = local_.wpe == model::k_absent ? nullptr : GE + local_.wpe;
    vocab_embedding_backward(vocab_, vocab_comms_, GE + local_.wte, gwpe, s.d_res.data(),
                             sl.ids.data(), N, T, s.vocab_ws);
  }
  if (block0) {
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
