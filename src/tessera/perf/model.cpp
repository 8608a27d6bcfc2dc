#include "tessera/perf/model.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"

namespace tessera::perf {

using comm::Axis;
using parallel::ScheduleKind;

namespace {

// ---- the model's constants (one set for every cluster; see docs/performance-model.md) ----
// Elementwise traffic of one transformer layer's forward, in element reads + writes per element
// of the tensor it runs over (the backward moves k_bwd_traffic times as much):
constexpr double k_res_traffic = 15;     // residual stream (n, h): 2 LayerNorms, 2 residual adds,
                                         // 2 dropouts (read, write, mask)
constexpr double k_mlp_traffic = 2;      // MLP hidden (n, 4h): GeLU read + write (bias fused)
constexpr double k_qkv_traffic = 2;      // qkv (n, 3h): head split / transpose
constexpr double k_score_traffic = 4.5;  // attention scores (a, s, s) per sequence without flash
                                         // attention: scale-mask-softmax + dropout
constexpr double k_bwd_traffic = 2;
constexpr double k_loss_traffic = 6;       // cross-entropy over the (n, V) logits, fp32, fwd + bwd
constexpr double k_adam_bytes_mixed = 30;  // AdamW per parameter (grad, master, m, v in and out)
constexpr double k_adam_bytes_fp32 = 28;
constexpr double k_norm_bytes = 4;  // the global gradient norm reads the fp32 gradient once (the
                                    // clipping factor is applied inside the AdamW pass)

double elt_bytes(DType d) {
  return d == DType::FP32 ? 4 : 2;
}
// The dtype tensors are kept and sent in (the compute dtype's unless fp32_storage).
DType storage_dtype(const ModelOptions& o) {
  return o.fp32_storage ? DType::FP32 : o.dtype;
}

std::size_t ax(Axis a) {
  return static_cast<std::size_t>(a);
}

struct Strides {
  long s[comm::k_num_axes];
};
Strides strides_of(const comm::GridShape& g) {
  Strides st{};
  long acc = 1;
  for (Axis a : comm::Topology::k_default_order) {
    st.s[ax(a)] = acc;
    acc *= g.size(a);
  }
  return st;
}

struct Gemm {
  double M, N, K;
};

// Roofline of one GEMM: the slower of its FLOPs at the shape's efficiency and its operands'
// traffic (A, B read, C written once) at the memory bandwidth.
double gemm_time(const ClusterSpec& c, double peak, double e, const Gemm& g) {
  if (g.M <= 0 || g.N <= 0 || g.K <= 0) return 0;
  const double flops = 2 * g.M * g.N * g.K / (peak * gemm_efficiency(c, g.M, g.N, g.K));
  const double bytes = (g.M * g.K + g.K * g.N + g.M * g.N) * e / (c.memory_bw_gbps * 1e9);
  return std::max(flops, bytes);
}

// Cost of one transformer layer for one micro-batch on one device.
struct LayerCost {
  double fwd_compute = 0, bwd_compute = 0;  // bwd excludes recomputation
  double recompute = 0;                     // compute of the recomputed part
  // tensor-parallel communication per axis (tx, ty, tz), total and exposed, fwd and bwd
  double fwd_comm[3] = {0, 0, 0}, bwd_comm[3] = {0, 0, 0}, rec_comm[3] = {0, 0, 0};
  double fwd_exposed = 0, bwd_exposed = 0, rec_exposed = 0;
  double fwd_bytes[3] = {0, 0, 0}, bwd_bytes[3] = {0, 0, 0};  // message bytes per pass
};

// One linear's collectives over tx under sequence parallelism (parallel/tensor_model.hpp, 1D
// mode): a normal linear reduce-scatters its output rows (fb bytes whole) forward and all-gathers
// the output gradient backward; a transposed one all-gathers its input rows (bb bytes whole)
// forward, and backward reduce-scatters the input gradient (during the weight-gradient GEMM, as
// the all-reduce it replaces) and all-gathers the input again for the weight gradient.
struct SpComm {
  double fwd = 0, bwd_overlappable = 0, bwd_exposed = 0, fwd_bytes = 0, bwd_bytes = 0;
};
SpComm sp_linear_comm(const GroupLink& lx, long tx, bool transposed, double fb, double bb) {
  SpComm r;
  if (tx <= 1) return r;
  if (!transposed) {
    r.fwd = reduce_scatter_time(lx, tx, fb);
    r.bwd_exposed = all_gather_time(lx, tx, fb);
    r.fwd_bytes = r.bwd_bytes = fb;
  } else {
    r.fwd = all_gather_time(lx, tx, bb);
    r.bwd_overlappable = reduce_scatter_time(lx, tx, bb);
    r.bwd_exposed = all_gather_time(lx, tx, bb);
    r.fwd_bytes = bb;
    r.bwd_bytes = 2 * bb;
  }
  return r;
}

// What one layer's parts share: the plan, the rows this device holds (n), the bytes per element,
// the compute peak and memory bandwidth, and the links of the tensor axes.
struct LayerEnv {
  const Workload& w;
  const PlanPoint& p;
  const ClusterSpec& c;
  const ModelOptions& o;
  double n, e, peak, bw;
  GroupLink lx, ly, lz;
};

LayerEnv layer_env(const Workload& w, const PlanPoint& p, const ClusterSpec& c,
                   const ModelOptions& o) {
  const auto& g = p.grid;
  const Strides st = strides_of(g);
  return {w,
          p,
          c,
          o,
          static_cast<double>(p.micro_batch) * w.seq / g.tz,  // local rows
          elt_bytes(storage_dtype(o)),
          c.peak_tflops(o.dtype) * 1e12,
          c.memory_bw_gbps * 1e9,
          group_link(c, st.s[ax(Axis::TX)], g.tx),
          group_link(c, st.s[ax(Axis::TY)], g.ty),
          group_link(c, st.s[ax(Axis::TZ)], g.tz)};
}

// The layer's four linears together: their GEMMs forward and backward, their tensor-parallel
// collectives per axis (tx, ty, tz; total and the backward's exposed part), and tz's weight
// gathers and gradient reduce-scatters. Their message bytes go into lc.
struct LinearTotals {
  double fwd_gemm = 0, bwd_gemm = 0;
  double fwd_ar[3] = {0, 0, 0}, bwd_ar[3] = {0, 0, 0}, bwd_ar_exposed = 0;
  double z_ag = 0, z_rs = 0;
};

// One linear's activations on the wire: the forward output's and the backward input
// gradient's bytes, and the weight gradient's GEMM time the backward's collective can hide under.
struct LinearTraffic {
  double fwd_bytes, bwd_bytes, t_dw;
};

// One linear's tensor-parallel collectives: the all-reduces of its output (over the grid axis
// its input is split on) and of its input gradient (over the other), or with sequence
// parallelism the gathers and reduce-scatters along tx; the backward's exposed part.
void add_linear_comm(const LayerEnv& v, LayerCost& lc, LinearTotals& t, bool transposed,
                     const LinearTraffic& x) {
  const auto& g = v.p.grid;
  const double overlap = v.c.overlap;
  auto exposed = [&](double tb) {
    return v.o.tp_overlap ? tb - overlap * std::min(tb, x.t_dw) : tb;
  };
  if (v.p.sequence_parallel) {
    const SpComm sc = sp_linear_comm(v.lx, g.tx, transposed, x.fwd_bytes, x.bwd_bytes);
    t.fwd_ar[0] += sc.fwd;
    t.bwd_ar[0] += sc.bwd_overlappable + sc.bwd_exposed;
    lc.fwd_bytes[0] += sc.fwd_bytes;
    lc.bwd_bytes[0] += sc.bwd_bytes;
    t.bwd_ar_exposed += sc.bwd_exposed + exposed(sc.bwd_overlappable);
    return;
  }
  const int ai = transposed ? 1 : 0, ao = transposed ? 0 : 1;  // 0 = tx, 1 = ty
  const GroupLink& li = ai == 0 ? v.lx : v.ly;
  const GroupLink& lo = ao == 0 ? v.lx : v.ly;
  const long si = ai == 0 ? g.tx : g.ty, so = ao == 0 ? g.tx : g.ty;
  t.fwd_ar[ai] += all_reduce_time(li, si, x.fwd_bytes);
  lc.fwd_bytes[ai] += si > 1 ? x.fwd_bytes : 0;
  const double tb = all_reduce_time(lo, so, x.bwd_bytes);
  t.bwd_ar[ao] += tb;
  lc.bwd_bytes[ao] += so > 1 ? x.bwd_bytes : 0;
  t.bwd_ar_exposed += exposed(tb);
}

LinearTotals linear_totals(const LayerEnv& v, LayerCost& lc) {
  const auto& g = v.p.grid;
  const ClusterSpec& c = v.c;
  const ModelOptions& o = v.o;
  const double h = v.w.cfg.n_embd, n = v.n, e = v.e, tx = g.tx, ty = g.ty;
  struct Linear {
    double in, out;
    bool transposed;
  };
  // qkv (3h; llama: h + 2 kv heads), proj, fc (4h; llama: gate and up, 2 ffn), fcproj (ffn)
  const double qkv = v.w.cfg.qkv_rows(), fc = v.w.cfg.fc_rows(), ffn = v.w.cfg.ffn();
  const Linear lin[4] = {{h, qkv, false}, {h, h, true}, {h, fc, false}, {ffn, h, true}};
  LinearTotals t;
  for (const auto& L : lin) {
    const double pi = L.transposed ? ty : tx, po = L.transposed ? tx : ty;
    const double K = L.in / pi, N = L.out / po;
    const double tf = gemm_time(c, v.peak, e, {n, N, K});
    const double t_dx = gemm_time(c, v.peak, e, {n, K, N});
    const double t_dw = gemm_time(c, v.peak, e, {N, K, n});
    t.fwd_gemm += tf;
    t.bwd_gemm += t_dx + t_dw;
    const double ae = o.bf16_tensor ? 2 : e;  // the activations' bytes on the wire
    add_linear_comm(v, lc, t, L.transposed, {n * N * ae, n * K * ae, t_dw});
    const double block = L.in * L.out / (tx * ty) * e;
    t.z_ag += all_gather_time(v.lz, g.tz, block);
    t.z_rs += reduce_scatter_time(v.lz, g.tz, block);
    if (g.tz > 1) {
      lc.fwd_bytes[2] += block;
      lc.bwd_bytes[2] += 2 * block;
    }
  }
  // LayerNorm statistics over tx: forward 2 LayerNorms x 2 all-reduces of n floats, backward
  // 2 x 1 all-reduce of 2n floats.
  t.fwd_ar[0] += 4 * all_reduce_time(v.lx, g.tx, n * 4);
  t.bwd_ar[0] += 2 * all_reduce_time(v.lx, g.tx, 2 * n * 4);
  t.bwd_ar_exposed += 2 * all_reduce_time(v.lx, g.tx, 2 * n * 4);
  return t;
}

// The layer's attention core (a / ty heads, replicated over tx; with sequence parallelism split
// by sequences) and its elementwise traffic, forward; score_traffic is the (s x s) scores' share
// of that traffic (0 with flash attention), which selective recomputation repeats.
struct CoreCost {
  double attn_f = 0, score_traffic = 0, elem_f = 0;
};

CoreCost core_cost(const LayerEnv& v) {
  const auto& g = v.p.grid;
  const double h = v.w.cfg.n_embd, a = v.w.cfg.n_head, s = v.w.seq, d = h / a;
  const double qkv = v.w.cfg.qkv_rows(), ffn = v.w.cfg.ffn();
  const double tx = g.tx, ty = g.ty, tz = g.tz, n = v.n, e = v.e;
  const double sp_rows = v.p.sequence_parallel ? tx : 1;
  const double seqs = static_cast<double>(v.p.micro_batch) / (tz * sp_rows), heads = a / ty;
  const double per_head_qk = gemm_time(v.c, v.peak, e, {s, s, d}),
               per_head_av = gemm_time(v.c, v.peak, e, {s, d, s});
  CoreCost r;
  r.attn_f = seqs * heads * (per_head_qk + per_head_av);
  double traffic = k_res_traffic * n * h / tx +
                   (k_mlp_traffic * n * ffn / ty + k_qkv_traffic * n * qkv / ty) / sp_rows;
  r.score_traffic = v.o.flash_attention ? 0 : k_score_traffic * seqs * heads * s * s;
  r.elem_f = (traffic + r.score_traffic) * e / v.bw;
  return r;
}

LayerCost layer_cost(const Workload& w, const PlanPoint& p, const ClusterSpec& c,
                     const ModelOptions& o) {
  const LayerEnv env = layer_env(w, p, c, o);
  LayerCost lc;
  const LinearTotals lt = linear_totals(env, lc);
  const CoreCost core = core_cost(env);
  lc.fwd_compute = lt.fwd_gemm + core.attn_f + core.elem_f;
  lc.bwd_compute = lt.bwd_gemm + 2 * core.attn_f + k_bwd_traffic * core.elem_f;
  switch (p.recompute) {
    case Recompute::None:
      break;
    case Recompute::Selective:  // the attention core (and its softmax) again
      lc.recompute = core.attn_f + core.score_traffic * env.e / env.bw;
      break;
    case Recompute::Full:
      lc.recompute = lc.fwd_compute;
      break;
  }
  for (int i = 0; i < 2; ++i) {
    lc.fwd_comm[i] = lt.fwd_ar[i];
    lc.bwd_comm[i] = lt.bwd_ar[i];
    if (p.recompute == Recompute::Full) lc.rec_comm[i] = lt.fwd_ar[i];
  }
  // tz: weight all-gather forward and backward, gradient reduce-scatter backward
  const double z_ag = lt.z_ag, z_rs = lt.z_rs;
  lc.fwd_comm[2] = z_ag;
  lc.bwd_comm[2] = z_ag + z_rs;
  // (the prefetched gathers and deferred reduce-scatters are tested between the layer's
  // operations, parallel/tensor_model.cpp: the polled overlap)
  const double zf = o.tp_overlap ? z_ag - c.overlap_polled * std::min(z_ag, lc.fwd_compute) : z_ag;
  const double zb = o.tp_overlap
                        ? z_ag + z_rs - c.overlap_polled * std::min(z_ag + z_rs, lc.bwd_compute)
                        : z_ag + z_rs;
  lc.fwd_exposed = lt.fwd_ar[0] + lt.fwd_ar[1] + zf;
  lc.bwd_exposed = lt.bwd_ar_exposed + zb;
  lc.rec_exposed = lc.rec_comm[0] + lc.rec_comm[1];
  return lc;
}

}  // namespace

double step_flops(const model::ModelConfig& cfg, int seq, long B, Recompute r) {
  const double h = cfg.n_embd, l = cfg.n_layer, s = seq, V = cfg.padded_vocab();
  const double Bd = static_cast<double>(B);
  // 2 FLOPs per multiply-add of the four linear layers (GPT-2: 12 h^2) and of QK^T and PV
  const double linear = h * cfg.qkv_rows() + h * h + h * cfg.fc_rows() + cfg.ffn() * h;
  const double layer_fwd = 2 * Bd * s * l * linear + 4 * Bd * s * s * l * h;
  const double logits_fwd = 2 * Bd * s * h * V;
  double f = 3 * (layer_fwd + logits_fwd);
  if (r == Recompute::Full) f += layer_fwd;
  if (r == Recompute::Selective) f += 4 * Bd * s * s * l * h;
  return f;
}

double split_region_activations(const model::ModelConfig& cfg) {
  const double h = cfg.n_embd, kv = static_cast<double>(cfg.kv_heads()) / cfg.n_head;
  const double mlp = (cfg.llama() ? 6.0 : 4.0) * cfg.ffn() / h;
  return 4 + 4 * kv + mlp;
}

double layer_activation_bytes(const model::ModelConfig& cfg, int seq, int b,
                              const comm::GridShape& g, Recompute r, bool seq_parallel,
                              bool flash_attention, DType dt) {
  const double s = seq, h = cfg.n_embd, a = cfg.n_head;
  const double bl = static_cast<double>(b) / g.tz;
  // the regions split over ty by heads are replicated over tx, or split by sequences over tx
  const double rows = seq_parallel ? static_cast<double>(g.ty) * g.tx : g.ty;
  const double scale = elt_bytes(dt) / 2;
  if (r == Recompute::Full) return 2 * s * bl * h / g.tx * scale;
  double per = 10.0 / g.tx + split_region_activations(cfg) / rows;
  if (r == Recompute::None && !flash_attention) per += 5 * a * s / (h * rows);
  return s * bl * h * per * scale;
}

std::array<double, 3> model_state_bytes(double params, int dp, int zero, DType dt) {
  const bool mixed = dt != DType::FP32;
  const double pb = mixed ? 2 : 4, gb = mixed ? 2 : 4, ob = mixed ? 12 : 8;
  const double n = dp;
  return {params * pb / (zero >= 3 ? n : 1), params * gb / (zero >= 2 ? n : 1),
          params * ob / (zero >= 1 ? n : 1)};
}

PlanPoint with_micro_batches(const Workload& w, PlanPoint p) {
  const long per_step = static_cast<long>(p.grid.dp) * p.micro_batch;
  if (per_step > 0 && w.global_batch % per_step == 0)
    p.micro_batches = static_cast<int>(w.global_batch / per_step);
  return p;
}

std::string infeasible_reason(const Workload& w, const PlanPoint& p, const ClusterSpec& c) {
  const auto& g = p.grid;
  const long per_step = static_cast<long>(g.dp) * p.micro_batch;
  if (g.dp >= 1 && p.micro_batch >= 1 && (w.global_batch < 1 || w.global_batch % per_step != 0))
    return "global batch not divisible by dp x micro-batch";
  if (auto why = parallel::plan_infeasible_reason(w.cfg, with_micro_batches(w, p)))
    return why->reason;
  if (c.max_nodes > 0) {
    const long nodes = (g.world_size() + c.devices_per_node - 1) / c.devices_per_node;
    if (nodes > c.max_nodes) return "more nodes than the cluster has";
  }
  return {};
}

namespace {

// What every phase of predict() reads: the point, its cluster and the shapes derived from them.
struct PredictContext {
  const Workload& w;
  const PlanPoint& p;
  const ClusterSpec& c;
  const ModelOptions& o;
  const comm::GridShape& g;
  const model::ModelConfig& cfg;
  double h, s, V, e, peak, membw, tx, ty, tz, t;
  int v, m;  // chunks per stage, micro-batches per step
  double n;  // rows of a micro-batch per device (b*s/tz)
  Strides st;
  LayerCost lc;
  std::vector<int> split;  // layers per model chunk (chunk c*pp + s: stage s's local chunk c)
  int chunk_layers(int stage, int chunk) const { return split[chunk * g.pp + stage]; }
  int stage_layers(int stage) const { return parallel::stage_layers(split, g.pp, stage); }
};

PredictContext make_context(const Workload& w, const PlanPoint& p, const ClusterSpec& c,
                            const ModelOptions& o) {
  const auto& g = p.grid;
  const auto& cfg = w.cfg;
  const double peak = c.peak_tflops(o.dtype) * 1e12;
  if (!(peak > 0))
    throw Error(fmt::format("{} has no {} peak", c.name, dtype_name(o.dtype)),
                "add peak_tflops_" + std::string(dtype_name(o.dtype)) + " to the cluster file");
  const int v = p.chunks();
  return PredictContext{w,
                        p,
                        c,
                        o,
                        g,
                        cfg,
                        static_cast<double>(cfg.n_embd),
                        static_cast<double>(w.seq),
                        static_cast<double>(cfg.padded_vocab()),
                        elt_bytes(storage_dtype(o)),
                        peak,
                        c.memory_bw_gbps * 1e9,
                        static_cast<double>(g.tx),
                        static_cast<double>(g.ty),
                        static_cast<double>(g.tz),
                        static_cast<double>(g.tx) * g.ty,
                        v,
                        p.micro_batches,
                        static_cast<double>(p.micro_batch) * w.seq / g.tz,
                        strides_of(g),
                        layer_cost(w, p, c, o),
                        parallel::plan_layer_split(cfg, p)};
}

// The embedding (first chunk) and the LM head with the loss (last chunk), forward and backward.
struct EndCosts {
  double embed_f, embed_b, head_f, head_b;
};

EndCosts end_costs(const PredictContext& x) {
  const auto& g = x.g;
  const double n = x.n, h = x.h, e = x.e, tx = x.tx, t = x.t;
  // as parallel/vocab_parallel.hpp runs them: the rank's vocabulary block (V/t rows, all h
  // channels) is all-gathered over tz before each use and its gradient reduce-scattered over tz
  // after; the lookup's partial rows are reduce-scattered over tx and all-reduced over ty; the
  // head gathers its input over tx and reduce-scatters the input gradient back. Blocking calls:
  // exposed.
  const GroupLink lx = group_link(x.c, x.st.s[ax(Axis::TX)], g.tx);
  const GroupLink ly = group_link(x.c, x.st.s[ax(Axis::TY)], g.ty);
  const GroupLink lz = group_link(x.c, x.st.s[ax(Axis::TZ)], g.tz);
  const double vblock = x.V / t * h * e;  // bytes of the vocabulary block
  const double z_block = all_gather_time(lz, g.tz, vblock);
  const double z_block_rs = reduce_scatter_time(lz, g.tz, vblock);
  // the block's gradient is zeroed, filled, reduced and added to the shard: ~3 passes over it
  const double block_traffic = 3 * vblock / x.membw;
  EndCosts r;
  r.embed_f = 3 * n * h / tx * e / x.membw + z_block + reduce_scatter_time(lx, g.tx, n * h * e) +
              all_reduce_time(ly, g.ty, n * h / tx * e);
  r.embed_b = 2 * 3 * n * h / tx * e / x.membw + all_gather_time(lx, g.tx, n * h * e) + z_block_rs +
              block_traffic + all_reduce_time(lz, g.tz, x.s * h / tx * e);
  r.head_f = gemm_time(x.c, x.peak, e, {n, x.V / t, h}) + all_gather_time(lx, g.tx, n * h * e) +
             z_block + k_loss_traffic / 2 * n * x.V / t * 4 / x.membw;
  r.head_b = gemm_time(x.c, x.peak, e, {n, h, x.V / t}) +
             gemm_time(x.c, x.peak, e, {x.V / t, h, n}) + reduce_scatter_time(lx, g.tx, n * h * e) +
             z_block_rs + block_traffic + k_loss_traffic / 2 * n * x.V / t * 4 / x.membw;
  return r;
}

// Pipeline messages: one activation (n, h) per boundary, scatter-gathered over the tensor axes.
double p2p_message(const PredictContext& x, Prediction& r) {
  const auto& g = x.g;
  if (g.pp == 1) return 0;
  const GroupLink lp = group_link(x.c, x.st.s[ax(Axis::PP)], 2);
  const double e = x.o.bf16_pipeline ? 2 : x.e;
  const double bytes = x.n * x.h * e / (x.o.pp_scatter_gather ? x.t : x.tx);
  double p2p = p2p_time(lp, bytes);
  if (x.o.pp_scatter_gather) {
    const GroupLink lt = group_link(x.c, 1, static_cast<long>(x.t));
    p2p += all_gather_time(lt, static_cast<long>(x.t), x.n * x.h * e / x.tx);
  }
  r.comm[ax(Axis::PP)].bytes = 2.0 * x.m * x.v * bytes;
  return p2p;
}

// Each chunk's costs, the schedule's time with its fill and drain, and the busy time of the
// fullest stage. Returns that stage.
// One model chunk's costs per micro-batch: its layers, plus the embedding on the first global
// chunk and the head on the last.
ChunkCost chunk_cost(const PredictContext& x, const EndCosts& ends, int stg, int ch) {
  const LayerCost& lc = x.lc;
  const int gc = ch * x.g.pp + stg;
  const double layers = x.chunk_layers(stg, ch);
  ChunkCost cc;
  cc.fwd_compute = layers * lc.fwd_compute;
  cc.fwd_comm = layers * lc.fwd_exposed;
  cc.bwd_compute = layers * (lc.bwd_compute + lc.recompute);
  cc.bwd_comm = layers * (lc.bwd_exposed + lc.rec_exposed);
  if (gc == 0) {
    cc.fwd_compute += ends.embed_f;
    cc.bwd_compute += ends.embed_b;
  }
  if (gc == x.g.pp * x.v - 1) {
    cc.fwd_compute += ends.head_f;
    cc.bwd_compute += ends.head_b;
  }
  return cc;
}

int pipeline_time(const PredictContext& x, const EndCosts& ends, double p2p, Prediction& r) {
  const auto& g = x.g;
  const int v = x.v, m = x.m;
  r.chunk_cost.assign(g.pp, std::vector<ChunkCost>(v));
  std::vector<double> stage_T(g.pp, 0), stage_compute(g.pp, 0);
  for (int stg = 0; stg < g.pp; ++stg)
    for (int ch = 0; ch < v; ++ch) {
      const ChunkCost cc = r.chunk_cost[stg][ch] = chunk_cost(x, ends, stg, ch);
      const int gc = ch * g.pp + stg;
      const double msgs = (gc > 0 ? 1 : 0) + (gc < g.pp * v - 1 ? 1 : 0);
      stage_T[stg] += cc.fwd_compute + cc.fwd_comm + cc.bwd_compute + cc.bwd_comm + msgs * p2p;
      stage_compute[stg] += cc.fwd_compute + cc.bwd_compute;
    }
  double T_max = 0, T_sum = 0;
  int worst = 0;
  for (int stg = 0; stg < g.pp; ++stg) {
    if (stage_T[stg] > T_max) {
      T_max = stage_T[stg];
      worst = stg;
    }
    T_sum += stage_T[stg];
  }
  // Fill and drain: each stage's work passes once outside the steady state; interleaving cuts
  // the fill by v (GPipe and 1F1B have the same bubble; they differ in memory).
  r.pipeline_s = m * T_max + (T_sum - T_max) / v;
  // Devices sharing cores (compute_slots < the node's busy ranks): the stage costs above are at
  // the every-device-busy rate; a stage whose neighbours idle in the fill and drain takes their
  // cores. Then the step is the longer of the schedule at the full-speed rate and the node's
  // work over its cores (every stage holds the same number of ranks: the mean stage's work).
  r.compute_share = compute_share(x.c, g.world_size());
  if (const double share = r.compute_share; share < 1 && g.pp > 1) {
    const double work = m * T_sum / g.pp;
    r.pipeline_s = std::max(share * r.pipeline_s, work);
  }
  r.compute_s = m * stage_compute[worst];
  r.bubble_s = std::max(0.0, r.pipeline_s - m * T_max);
  return worst;
}

// Tensor-parallel communication totals per device and step, and their exposed share.
void tensor_comm_totals(const PredictContext& x, int worst, double p2p, Prediction& r) {
  const double mult = static_cast<double>(x.m) * x.stage_layers(worst);  // layer passes
  const LayerCost& lc = x.lc;
  for (int i = 0; i < 3; ++i) {
    const Axis a = i == 0 ? Axis::TX : i == 1 ? Axis::TY : Axis::TZ;
    r.comm[ax(a)].seconds = mult * (lc.fwd_comm[i] + lc.bwd_comm[i] + lc.rec_comm[i]);
    const double rec = i < 2 && x.p.recompute == Recompute::Full ? 2.0 : 1.0;
    r.comm[ax(a)].bytes = mult * (rec * lc.fwd_bytes[i] + lc.bwd_bytes[i]);
  }
  r.comm[ax(Axis::TX)].exposed = 0;  // TP exposure is reported together below
  {
    const double exposed = mult * (lc.fwd_exposed + lc.bwd_exposed + lc.rec_exposed);
    const double total =
        r.comm[ax(Axis::TX)].seconds + r.comm[ax(Axis::TY)].seconds + r.comm[ax(Axis::TZ)].seconds;
    for (Axis a : {Axis::TX, Axis::TY, Axis::TZ})
      r.comm[ax(a)].exposed = total > 0 ? exposed * r.comm[ax(a)].seconds / total : 0;
  }
  r.comm[ax(Axis::PP)].seconds = 2.0 * x.m * x.v * p2p;
  r.comm[ax(Axis::PP)].exposed = r.comm[ax(Axis::PP)].seconds;
}

// Parameters of one layer per device, and of a pipeline stage (worst of first and last stage;
// the LM head is tied to the embedding and held by both ends of the pipeline).
double layer_params(const PredictContext& x) {
  const auto& c = x.cfg;
  const double linear = x.h * c.qkv_rows() + x.h * x.h + x.h * c.fc_rows() + c.ffn() * x.h;
  const double vectors = c.llama() ? 2 * x.h    // two RMSNorm weights
                                   : 13 * x.h;  // biases and two LayerNorms (GPT-2)
  return linear / (x.t * x.tz) + vectors / x.tx;
}
double stage_params(const PredictContext& x, int stg) {
  const auto& g = x.g;
  double P = layer_params(x) * x.stage_layers(stg);
  if (stg == 0) P += x.V * x.h / (x.t * x.tz) + x.s * x.h / x.tx;
  if (stg == g.pp - 1 && g.pp > 1) P += x.V * x.h / (x.t * x.tz);
  if (stg == g.pp - 1) P += 2 * x.h / x.tx;  // final LayerNorm
  return P;
}

// One stage's data-parallel gradient reduction: its time, the part not hidden behind the backward
// and the bytes it moves.
struct StageDp {
  double seconds = 0, exposed = 0, bytes = 0;
};

StageDp dp_stage(const PredictContext& x, int stg, const GroupLink& ld, const Prediction& r) {
  const auto& g = x.g;
  const auto& p = x.p;
  const bool mixed = storage_dtype(x.o) != DType::FP32;
  const double gbytes = mixed || x.o.bf16_grad_reduce ? 2 : 4, pbytes = mixed ? 2 : 4;
  const double P = stage_params(x, stg);
  StageDp d;
  if (g.dp <= 1) return d;
  if (p.zero == 0) {
    d.seconds = all_reduce_time(ld, g.dp, P * gbytes);
    d.bytes = 2 * P * gbytes;
  } else {
    d.seconds = reduce_scatter_time(ld, g.dp, P * gbytes) + all_gather_time(ld, g.dp, P * pbytes);
    d.bytes = P * (gbytes + pbytes);
  }
  if (p.zero == 3) {  // parameters gathered forward and backward, every micro-batch
    d.seconds += 2.0 * x.m * all_gather_time(ld, g.dp, P * pbytes);
    d.bytes += 2.0 * x.m * P * pbytes;
  }
  // the gradient reduction can run during the last micro-batch's backward on this stage
  double hide = 0;
  if (x.o.dp_overlap) {
    double last_bwd = 0;
    for (const auto& cc : r.chunk_cost[stg]) last_bwd += cc.bwd_compute;
    hide = p.zero == 3 ? r.compute_s : last_bwd;
    if (p.zero == 1 || p.zero == 2)  // the parameter all-gather after the update is exposed
      hide = std::min(hide, reduce_scatter_time(ld, g.dp, P * gbytes));
  }
  // (the reduction's requests are tested at every layer boundary: the polled overlap)
  d.exposed = d.seconds - x.c.overlap_polled * std::min(d.seconds, hide);
  return d;
}

// AdamW over stage stg's optimizer shard and the gradient norm before it; a model-parallel rank
// also reads one owner byte per element (each element counted once over the replicas,
// parallel/tensor_model.hpp).
double optimizer_seconds(const PredictContext& x, int stg) {
  const bool mixed = storage_dtype(x.o) != DType::FP32;
  const double opt_params = stage_params(x, stg) / (x.p.zero >= 1 ? x.g.dp : 1);
  const double model_parallel = x.g.pp * x.t * x.tz > 1 ? 1 : 0;
  const double bf16_copy = x.o.fp32_storage && x.o.dtype != DType::FP32 ? 2 : 0;  // written
  return opt_params *
         ((mixed ? k_adam_bytes_mixed : k_adam_bytes_fp32) + bf16_copy + k_norm_bytes +
          model_parallel) /
         x.membw;
}

// The data-parallel gradient reduction (exposed part) and the optimizer, per stage; the step's
// are those of the stage where their sum is largest.
void dp_and_optimizer(const PredictContext& x, int worst, Prediction& r) {
  const auto& g = x.g;
  const GroupLink ld = group_link(x.c, x.st.s[ax(Axis::DP)], g.dp);
  r.dp_s.assign(g.pp, 0);
  double dp_exposed = 0, opt_s = 0;
  auto& comm = r.comm[ax(Axis::DP)];
  for (int stg = 0; stg < g.pp; ++stg) {
    const StageDp d = dp_stage(x, stg, ld, r);
    r.dp_s[stg] = d.exposed;
    const double t_opt = optimizer_seconds(x, stg);
    if (d.exposed + t_opt > dp_exposed + opt_s) {
      dp_exposed = d.exposed;
      opt_s = t_opt;
    }
    if (stg == worst || stg == 0) {
      comm.seconds = std::max(comm.seconds, d.seconds);
      comm.exposed = std::max(comm.exposed, d.exposed);
      comm.bytes = std::max(comm.bytes, d.bytes);
    }
  }
  r.dp_exposed_s = dp_exposed;
  r.optimizer_s = opt_s;
  // The tied embedding: the first and the last stage exchange their wte gradient shards before
  // the data-parallel reduction (parallel/pipeline.hpp), both directions at once.
  if (g.pp > 1) {
    const bool mixed = storage_dtype(x.o) != DType::FP32;
    const GroupLink le = group_link(x.c, x.st.s[ax(Axis::PP)] * (g.pp - 1), 2);
    r.tied_s = p2p_time(le, x.V * x.h / (x.t * x.tz) * (mixed ? 2 : 4));
    r.comm[ax(Axis::PP)].seconds += r.tied_s;
    r.comm[ax(Axis::PP)].exposed += r.tied_s;
  }
}

// fp32 storage with a bf16 GEMM, without sequence parallelism: a layer keeps its norms' outputs
// and the MLP's activation (GEMM inputs only) as the bf16 copies the GEMMs read, 2 bytes fewer
// each; the fp32 ones are computed into one set of buffers shared by the layers.
bool keeps_bf16_inputs(const PredictContext& x) {
  return x.o.fp32_storage && x.o.dtype != DType::FP32 && !x.p.sequence_parallel;
}

// Elements of a layer's GEMM inputs that keeps_bf16_inputs concerns: ln1, ln2 (n, h/tx); act.
double gemm_input_elems(const PredictContext& x) {
  return x.n * (2 * x.h / x.tx + x.cfg.ffn() / x.ty);
}

// Stage stg's buffers beside its model state and activations.
double stage_buffers(const PredictContext& x, int stg) {
  const auto& g = x.g;
  const auto& p = x.p;
  const double n = x.n, h = x.h, e = x.e, t = x.t, tx = x.tx, tz = x.tz;
  const bool mixed = storage_dtype(x.o) != DType::FP32;
  const double gbytes = mixed ? 2 : 4, pbytes = mixed ? 2 : 4;
  // backward scratch (residual, LayerNorm, attention-output, qkv and MLP gradients of one
  // layer), the embedding output / final LayerNorm, point-to-point staging
  double b = (10 / t + 2 / tx) * n * h * e + (g.pp > 1 ? 2 * n * h / tx * e : 0);
  // mixed precision: the fp32 copy of the gradient the optimizer updates from (Megatron's
  // main_grad; tessera accumulates gradients in fp32), over the optimizer's shard
  if (mixed) b += 4 * stage_params(x, stg) / (p.zero >= 1 ? g.dp : 1);
  // fp32 storage with a bf16 GEMM: the weights' bf16 copy (whole: made of gathered blocks under
  // ZeRO-3), the rounded GEMM operands of the widest linear (its input and output gradient)
  if (x.o.fp32_storage && x.o.dtype != DType::FP32) {
    b += 2 * stage_params(x, stg) + 2 * 2 * n * 4 * h / t;
    if (keeps_bf16_inputs(x)) b += 4 * gemm_input_elems(x);
  }
  if (g.tz > 1) b += 2 * 4 * h * h / t * e;  // gathered weight blocks (prefetch)
  // ZeRO-2/3 staging over dp (parallel/data_parallel.hpp): the embedding block whole, and a
  // pool of two layers, for gradients (2, 3) and gathered parameters (3)
  const double embed_block = stg == 0 ? x.V * h / (t * tz) + x.s * h / tx : 0;
  const double staged = embed_block + 2 * layer_params(x);
  if (p.zero >= 2) b += staged * gbytes;
  if (p.zero == 3) b += staged * pbytes;
  // the data-parallel reduction in flight: a staging copy of the largest reduction block (the
  // embedding on the first stage, a layer elsewhere; MPI's non-blocking collectives copy it)
  if (g.dp > 1) b += std::max(embed_block, layer_params(x)) * gbytes;
  // a bf16 reduction of fp32 gradients: each block's bf16 copy, all in flight at the end of
  // the backward
  if (g.dp > 1 && x.o.bf16_grad_reduce && !mixed) b += 2 * stage_params(x, stg);
  return b;
}

// Stage stg's memory per device; act_layer and act_full: a layer's activations as kept under the
// plan's recomputation and under none.
Memory stage_memory(const PredictContext& x, int stg, double act_layer, double act_full) {
  const auto& g = x.g;
  const auto& p = x.p;
  const double n = x.n, t = x.t;
  Memory mem;
  const auto ms = model_state_bytes(stage_params(x, stg), g.dp, p.zero, storage_dtype(x.o));
  mem.params = ms[0];
  mem.grads = ms[1];
  mem.optimizer = ms[2];
  const parallel::ScheduleSpec spec{p.schedule, g.pp, x.m, x.v};
  const int inflight = parallel::in_flight_formula(spec, stg);
  int layers = 0;  // the stage's largest chunk (the in-flight count is in chunk units)
  for (int ch = 0; ch < x.v; ++ch) layers = std::max(layers, x.chunk_layers(stg, ch));
  const double kept = keeps_bf16_inputs(x) ? 2 * gemm_input_elems(x) : 0;
  mem.activations = static_cast<double>(inflight) * layers *
                    (p.recompute == Recompute::Full ? act_layer : act_layer - kept);
  if (p.recompute == Recompute::Full) mem.activations += act_full - kept;  // the layer redone
  // logits of the rank's vocabulary range in fp32; the loss gradient overwrites them (and with a
  // bf16 GEMM over fp32 storage, their gradient rounded for the head's GEMMs)
  if (stg == g.pp - 1) {
    mem.logits = n * x.V / t * 4;
    if (x.o.fp32_storage && x.o.dtype != DType::FP32) mem.logits += 2 * n * x.V / t;
  }
  mem.buffers = stage_buffers(x, stg);
  mem.reserved = x.c.reserved_gib * 1073741824.0;
  return mem;
}

// Memory per device of the fullest stage (stage 0 holds the most in-flight micro-batches; the
// last stage holds the logits).
Memory step_memory(const PredictContext& x) {
  const auto& p = x.p;
  const double act_layer =
      layer_activation_bytes(x.cfg, x.w.seq, p.micro_batch, x.g, p.recompute, p.sequence_parallel,
                             x.o.flash_attention, storage_dtype(x.o));
  const double act_full =
      layer_activation_bytes(x.cfg, x.w.seq, p.micro_batch, x.g, Recompute::None,
                             p.sequence_parallel, x.o.flash_attention, storage_dtype(x.o));
  Memory best;
  for (int stg = 0; stg < x.g.pp; ++stg) {
    const Memory mem = stage_memory(x, stg, act_layer, act_full);
    if (mem.total() > best.total()) best = mem;
  }
  return best;
}

}  // namespace

Prediction predict(const Workload& w, const PlanPoint& point, const ClusterSpec& c,
                   const ModelOptions& o) {
  if (auto why = infeasible_reason(w, point, c); !why.empty())
    throw Error(fmt::format("configuration {} cannot run: {}", point.describe(), why));
  const PlanPoint p = with_micro_batches(w, point);
  const PredictContext x = make_context(w, p, c, o);
  Prediction r;
  r.point = p;
  r.micro_batches = x.m;
  const EndCosts ends = end_costs(x);
  r.p2p_s = p2p_message(x, r);
  const int worst = pipeline_time(x, ends, r.p2p_s, r);
  tensor_comm_totals(x, worst, r.p2p_s, r);
  dp_and_optimizer(x, worst, r);
  r.step_s = r.pipeline_s + r.dp_exposed_s + r.optimizer_s + r.tied_s;
  r.bubble_fraction = r.bubble_s / r.step_s;

  // FLOPs
  r.hw_flops = step_flops(w.cfg, w.seq, w.global_batch, p.recompute);
  r.model_flops = step_flops(w.cfg, w.seq, w.global_batch, Recompute::None);
  const double N = p.grid.world_size();
  r.tflops_per_device = r.hw_flops / (r.step_s * N) / 1e12;
  r.mfu = r.model_flops / (r.step_s * N) / x.peak;
  r.hfu = r.hw_flops / (r.step_s * N) / x.peak;

  r.memory = step_memory(x);
  r.capacity = c.memory_gib * 1073741824.0;
  r.fits = r.memory.total() <= r.capacity;
  return r;
}

StepEstimate predict_step(const model::ModelConfig& cfg, const PlanPoint& plan,
                          const ClusterSpec& cluster, int seq, ModelOptions o) {
  const Workload w{cfg, seq, plan.global_batch()};
  o.tp_overlap = plan.overlap_dx && plan.prefetch;
  o.dp_overlap = plan.overlap_dp && plan.grid.pp == 1;  // a pipeline reduces after its list
  StepEstimate est;
  est.reason = infeasible_reason(w, plan, cluster);
  if (!est.reason.empty()) return est;
  auto r = predict(w, plan, cluster, o);
  est.step_s = r.step_s;
  est.peak_bytes = r.memory.total();
  est.tflops_per_device = r.tflops_per_device;
  est.fits = r.fits;
  return est;
}

}  // namespace tessera::perf
