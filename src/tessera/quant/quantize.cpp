#include "tessera/quant/quantize.hpp"
#include "tessera/quant/gguf_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/quant/gguf_import.hpp"
#include "tessera/quant/methods.hpp"

namespace tessera::quant {

namespace fs = std::filesystem;
using nlohmann::json;

Method parse_method(const std::string& s) {
  if (s == "rtn") return Method::Rtn;
  if (s == "gptq") return Method::Gptq;
  if (s == "awq") return Method::Awq;
  if (s == "smoothquant" || s == "sq") return Method::SmoothQuant;
  if (s == "w8a8") return Method::W8A8;
  if (s == "llm-int8" || s == "int8") return Method::Int8;
  throw Error(fmt::format("unknown quantization method '{}'", s),
              "use rtn, gptq, awq, smoothquant, w8a8 or llm-int8");
}

const char* method_name(Method m) {
  switch (m) {
    case Method::Rtn:
      return "rtn";
    case Method::Gptq:
      return "gptq";
    case Method::Awq:
      return "awq";
    case Method::SmoothQuant:
      return "smoothquant";
    case Method::W8A8:
      return "w8a8";
    case Method::Int8:
      return "llm-int8";
  }
  return "?";
}

bool needs_calibration(Method m) {
  return m == Method::Gptq || m == Method::Awq || m == Method::SmoothQuant;
}

std::vector<float> QuantizedModel::effective_weight(std::size_t i) const {
  const auto& L = linears[i];
  std::vector<float> w(static_cast<std::size_t>(L.q.rows) * L.q.cols);
  L.q.dequantize(w.data());
  for (int r = 0; r < L.q.rows; ++r)
    for (int c = 0; c < L.q.cols; ++c) {
      float& v = w[static_cast<std::size_t>(r) * L.q.cols + c];
      if (!L.out_fold.empty()) v *= L.out_fold[r];
      if (!L.in_fold.empty()) v /= L.in_fold[c];
    }
  return w;
}

namespace {

// INT8 absmax per output row as a QuantizedLinear (codes q + 128, zero 128).
QuantizedLinear int8_rows(const float* W, int rows, int cols) {
  QuantizedLinear out;
  out.rows = rows;
  out.cols = cols;
  out.spec = WeightQuant{8, -1, true};
  out.q.resize(static_cast<std::size_t>(rows) * cols);
  out.scales.resize(rows);
  out.zeros.assign(rows, 128.0f);
  out.g_idx.assign(cols, 0);
  for (int r = 0; r < rows; ++r) {
    const float* wr = W + static_cast<std::size_t>(r) * cols;
    float m = 0;
    for (int c = 0; c < cols; ++c) m = std::max(m, std::fabs(wr[c]));
    float s = std::max(m, 1e-8f) / 127.0f;
    out.scales[r] = s;
    for (int c = 0; c < cols; ++c)
      out.q[static_cast<std::size_t>(r) * cols + c] =
          static_cast<std::uint8_t>(std::clamp(std::nearbyint(wr[c] / s), -127.0f, 127.0f) + 128);
  }
  return out;
}

void scale_cols(float* W, int rows, int cols, const std::vector<float>& s, bool divide) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      float& v = W[static_cast<std::size_t>(r) * cols + c];
      v = divide ? v / s[c] : v * s[c];
    }
}

// S' = diag(1/s) S diag(1/s): second moment of x / s.
std::vector<double> scale_moment(const std::vector<double>& S, const std::vector<float>& s) {
  const std::size_t n = s.size();
  std::vector<double> out(S.size());
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) out[i * n + j] = S[i * n + j] / (double(s[i]) * s[j]);
  return out;
}

QLinear make_qlinear(const model::ModelConfig& cfg, int layer, Lin kind) {
  QLinear q;
  q.name = linear_name(cfg, layer, kind);
  q.layer = layer;
  q.kind = kind;
  return q;
}

void log(const QuantizeOptions& opt, const std::string& msg) {
  if (opt.verbose) std::fprintf(stderr, "%s\n", msg.c_str());
}

}  // namespace

namespace {

// What each method's quantization reads and writes: the model being quantized (its parameters
// copied into qm.params, which the methods fold scales into and overwrite with the dequantized
// weights) and the options.
struct QuantContext {
  const model::ParamLayout& layout;
  const model::ModelConfig& cfg;
  const float* params;  // the original parameters (calibration captures run on these)
  float* P;             // qm.params
  QuantizedModel& qm;
  const QuantizeOptions& opt;
  const CalibSet* calib;
  int L, C;
  float* W(int l, Lin k) const { return P + lin_weight_offset(layout, l, k); }
  // Divides the norm in front of a Qkv or Fc site (its weight, and its bias where the family has
  // one) by s, per channel: the linear then sees x / s and its columns are multiplied by s.
  void fold_into_norm(int l, Lin k, const std::vector<float>& s) const {
    const auto& lw = layout.layers[l];
    const std::size_t w = k == Lin::Qkv ? lw.ln1_w : lw.ln2_w;
    const std::size_t b = k == Lin::Qkv ? lw.ln1_b : lw.ln2_b;
    for (int j = 0; j < C; ++j) {
      P[w + j] /= s[j];
      if (b != model::k_absent) P[b + j] /= s[j];
    }
  }
  // writes the dequantized weight (in the folded coordinates) into the parameters
  void finish(QLinear&& ql) const {
    ql.q.dequantize(W(ql.layer, ql.kind));
    qm.linears.push_back(std::move(ql));
  }
};

void quantize_rtn(const QuantContext& x) {
  const int L = x.L;
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      Lin kind = static_cast<Lin>(k);
      auto ql = make_qlinear(x.cfg, l, kind);
      ql.q = rtn(x.W(l, kind), lin_rows(x.cfg, kind), lin_cols(x.cfg, kind), x.opt.wq);
      x.finish(std::move(ql));
    }
}

void quantize_int8(const QuantContext& x) {
  const int L = x.L;
  x.qm.act.mode = x.opt.method == Method::Int8 ? ActMode::Int8Mixed : x.opt.act;
  x.qm.act.threshold = x.opt.int8_threshold;
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      Lin kind = static_cast<Lin>(k);
      auto ql = make_qlinear(x.cfg, l, kind);
      ql.q = int8_rows(x.W(l, kind), lin_rows(x.cfg, kind), lin_cols(x.cfg, kind));
      x.finish(std::move(ql));
    }
}

void quantize_smoothquant(const QuantContext& x) {
  const int L = x.L;
  x.qm.act.mode = x.opt.act;
  auto cap = capture(x.layout, x.params, *x.calib, false, x.opt.micro_batch);
  for (int l = 0; l < L; ++l) {
    for (int k = 0; k < k_num_lin; ++k) {
      Lin kind = static_cast<Lin>(k);
      auto ql = make_qlinear(x.cfg, l, kind);
      const int rows = lin_rows(x.cfg, kind), cols = lin_cols(x.cfg, kind);
      if (kind == Lin::Qkv || kind == Lin::Fc) {  // norm -> linear sites
        auto s =
            smooth_scales(cap.layers[l][k].stats.maxabs, x.W(l, kind), rows, cols, x.opt.alpha);
        x.fold_into_norm(l, kind, s);
        scale_cols(x.W(l, kind), rows, cols, s, false);
        ql.in_fold = s;
      }
      ql.q = int8_rows(x.W(l, kind), rows, cols);
      x.finish(std::move(ql));
    }
  }
  x.qm.info["alpha"] = fmt::format("{}", x.opt.alpha);
}

// Rows [r0, r0 + n) of a linear's output: the v projection of Qkv, llama's up projection of Fc.
struct RowRange {
  int r0 = 0, n = 0;
};
RowRange v_rows(const model::ModelConfig& cfg) {
  const int hs = cfg.head_dim(), KV = cfg.kv_heads();
  return {(cfg.n_head + KV) * hs, KV * hs};
}

// AWQ's scale for the input of o (AttnProj) must be absorbed by the v rows of Qkv, which holds
// only when every attention head has its own v head: with grouped kv heads the site is not scaled
// (as the AWQ reference does for such models).
bool awq_scales_site(const model::ModelConfig& cfg, Lin kind) {
  return kind != Lin::AttnProj || cfg.kv_heads() == cfg.n_head;
}

// Folds AWQ's scales s of site `kind`'s input into the op before it, so that the model computes
// the same function: the norm (Qkv, Fc); the v rows of Qkv (AttnProj: attention is linear in v);
// llama's up rows of Fc (FcProj: SwiGLU is linear in up); for gpt2's FcProj nothing after GELU
// can absorb them, so they stay a per-input-column divisor of the quantized weight (llm-awq's
// ScaledActivation).
void awq_fold(const QuantContext& x, int l, Lin kind, const std::vector<float>& s,
              std::array<QLinear, k_num_lin>& qls) {
  auto fold_rows = [&](Lin prev, RowRange rr) {
    float* w = x.W(l, prev);
    const std::size_t bias = prev == Lin::Qkv ? x.layout.layers[l].qkv_b : x.layout.layers[l].fc_b;
    auto& of = qls[static_cast<int>(prev)].out_fold;
    of.assign(lin_rows(x.cfg, prev), 1.0f);
    for (int r = 0; r < rr.n; ++r) {
      for (int c = 0; c < x.C; ++c) w[static_cast<std::size_t>(rr.r0 + r) * x.C + c] /= s[r];
      if (bias != model::k_absent) x.P[bias + rr.r0 + r] /= s[r];
      of[rr.r0 + r] = s[r];
    }
  };
  auto& q = qls[static_cast<int>(kind)];
  if (kind == Lin::Qkv || kind == Lin::Fc) {
    x.fold_into_norm(l, kind, s);
    q.in_fold = s;
  } else if (kind == Lin::AttnProj) {
    fold_rows(Lin::Qkv, v_rows(x.cfg));
    q.in_fold = s;
  } else if (x.cfg.llama()) {
    fold_rows(Lin::Fc, {x.cfg.ffn(), x.cfg.ffn()});
    q.in_fold = s;
  } else {
    q.q.in_scale = s;
  }
}

using LayerQLinears = std::array<QLinear, k_num_lin>;
using LayerMoments = std::array<std::vector<double>, k_num_lin>;

// AWQ's first step for layer l: each site's scales searched on the unscaled inputs (mean |x| per
// channel from the capture, second moments S), then folded into the weights and the moments.
void awq_scale_layer(const QuantContext& x, const Capture& cap, int l, LayerQLinears& qls,
                     LayerMoments& S) {
  for (int k = 0; k < k_num_lin; ++k) {
    const Lin kind = static_cast<Lin>(k);
    if (!awq_scales_site(x.cfg, kind)) {
      log(x.opt, fmt::format("awq {}: not scaled (grouped kv heads)", qls[k].name));
      continue;
    }
    const auto& st = cap.layers[l][k].stats;
    std::vector<double> mean_abs(st.cols);
    for (int j = 0; j < st.cols; ++j) mean_abs[j] = st.mean_abs(j);
    const int rows = lin_rows(x.cfg, kind), cols = lin_cols(x.cfg, kind);
    float alpha = 0;
    auto s = awq_search_scales(x.W(l, kind), rows, cols, mean_abs, S[k], x.opt.wq, x.opt.awq_grid,
                               &alpha);
    qls[k].alpha = alpha;
    scale_cols(x.W(l, kind), rows, cols, s, false);
    S[k] = scale_moment(S[k], s);
    awq_fold(x, l, kind, s, qls);
    log(x.opt, fmt::format("awq {}: alpha {:.2f}", qls[k].name, alpha));
  }
}

// AWQ's second and third steps for layer l: the clip search (not for q and k: only the v rows of
// Qkv), then each linear rounded to the grid and handed on.
void awq_clip_and_round(const QuantContext& x, int l, LayerQLinears& qls, const LayerMoments& S) {
  for (int k = 0; k < k_num_lin; ++k) {
    const Lin kind = static_cast<Lin>(k);
    const int rows = lin_rows(x.cfg, kind), cols = lin_cols(x.cfg, kind);
    if (x.opt.awq_clip) {
      if (kind == Lin::Qkv) {
        const RowRange v = v_rows(x.cfg);
        awq_clip(x.W(l, kind) + static_cast<std::size_t>(v.r0) * cols, v.n, cols, S[k], x.opt.wq);
      } else {
        awq_clip(x.W(l, kind), rows, cols, S[k], x.opt.wq);
      }
    }
    auto in_scale = std::move(qls[k].q.in_scale);
    qls[k].q = rtn(x.W(l, kind), rows, cols, x.opt.wq);
    qls[k].q.in_scale = std::move(in_scale);
    x.finish(std::move(qls[k]));
  }
}

void quantize_awq(const QuantContext& x) {
  const int L = x.L;
  auto cap = capture(x.layout, x.params, *x.calib, true, x.opt.micro_batch);
  Progress progress("awq", L, 2.0);
  for (int l = 0; l < L; ++l) {
    progress.update(l, fmt::format("layer {}", l));
    LayerQLinears qls;
    LayerMoments S;
    for (int k = 0; k < k_num_lin; ++k) {
      qls[k] = make_qlinear(x.cfg, l, static_cast<Lin>(k));
      S[k] = cap.layers[l][k].hessian.mean_xtx();
    }
    awq_scale_layer(x, cap, l, qls, S);
    awq_clip_and_round(x, l, qls, S);
  }
  progress.finish();
  x.qm.info["grid"] = std::to_string(x.opt.awq_grid);
}

GptqOptions gptq_options(const QuantizeOptions& opt) {
  GptqOptions go;
  go.spec = opt.wq;
  go.percdamp = opt.damp;
  go.blocksize = opt.blocksize;
  go.act_order = opt.act_order;
  go.static_groups = opt.static_groups;
  return go;
}

// GPTQ of one linear from its Hessian; writes the dequantized weight into the parameters.
void gptq_linear(const QuantContext& x, int l, Lin kind, const std::vector<double>& xtx) {
  const int rows = lin_rows(x.cfg, kind), cols = lin_cols(x.cfg, kind);
  auto r = gptq(x.W(l, kind), rows, cols, xtx, gptq_options(x.opt));
  auto ql = make_qlinear(x.cfg, l, kind);
  ql.q = std::move(r.q);
  ql.gptq_loss = r.loss;
  ql.damp = r.damp;
  log(x.opt, fmt::format("gptq {}: loss {:.4g} damp {:.2f}", ql.name, r.loss, r.damp));
  x.finish(std::move(ql));
}

// Whether one block's activations for all n x T calibration tokens fit the one-pass GPTQ's
// budget (the block's buffers, its attention scores and the Hessian inputs: about 1 GiB).
bool gptq_one_pass_fits(const model::ModelConfig& cfg, std::int64_t tokens, int T) {
  const std::int64_t per_token = 6LL * cfg.n_embd + cfg.qkv_rows() + cfg.fc_rows() + cfg.ffn() +
                                 2LL * cfg.n_head + static_cast<std::int64_t>(cfg.n_head) * T;
  return tokens * per_token * 4 <= (1LL << 30);
}

// The Hessian inputs (X^T X) of linear `kind` of block l over the calibration set, its inputs xs
// (n, T, C) run through the block in micro-batches of mb (copied into scratch, mb x T x C), each
// stopped after that linear.
std::vector<double> gptq_hessian(const QuantContext& x, Runner& run, const std::vector<float>& xs,
                                 std::vector<float>& scratch, int l, Lin kind, int mb) {
  const int C = x.C, T = x.calib->seqlen, n = x.calib->n();
  Hessian H;
  H.init(lin_cols(x.cfg, kind));
  Hooks hooks;
  hooks.stop_after = static_cast<int>(kind);
  hooks.capture = [&](int, Lin kk, const float* in, std::int64_t N, int) {
    if (kk == kind) H.add(in, N, kernels::GemmLibrary::OneDnn);
  };
  for (int s = 0; s < n; s += mb) {
    const int B = std::min(mb, n - s);
    std::memcpy(scratch.data(), xs.data() + static_cast<std::size_t>(s) * T * C,
                sizeof(float) * B * T * C);
    run.block(x.P, l, scratch.data(), B, T, hooks);
  }
  return std::move(H.xtx);
}

void quantize_gptq(const QuantContext& x) {
  const int L = x.L, C = x.C;
  const int T = x.calib->seqlen, n = x.calib->n();
  // One pass per block (all samples in one call) when they fit: each linear is quantized inside
  // the capture hook, before the block's GEMM reads its weight, so the later linears of the block
  // see the quantized earlier ones (true-sequential) at the cost of one block forward. Otherwise
  // micro-batches, the block re-run up to each linear.
  const bool one_pass =
      x.opt.gptq_one_pass && gptq_one_pass_fits(x.cfg, static_cast<std::int64_t>(n) * T, T);
  const int mb = one_pass ? n : std::min(x.opt.micro_batch, n);
  Runner run(x.layout);
  std::vector<float> xs(static_cast<std::size_t>(n) * T * C);  // residual stream (n, T, C)
  std::vector<float> scratch(one_pass ? 0 : static_cast<std::size_t>(mb) * T * C);
  for (int s = 0; s < n; s += mb) {
    const int B = std::min(mb, n - s);
    run.embed(x.P, x.calib->tokens.data() + static_cast<std::size_t>(s) * T, B, T,
              xs.data() + static_cast<std::size_t>(s) * T * C);
  }
  Progress progress("gptq", static_cast<std::int64_t>(L) * k_num_lin, 2.0);
  auto quantize_site = [&](int l, Lin kind, const std::vector<double>& xtx) {
    progress.update(static_cast<std::int64_t>(l) * k_num_lin + static_cast<int>(kind),
                    linear_name(x.cfg, l, kind));
    gptq_linear(x, l, kind, xtx);
  };
  for (int l = 0; l < L; ++l) {
    if (one_pass) {
      Hooks hooks;
      hooks.capture = [&](int, Lin kind, const float* in, std::int64_t N, int cols) {
        Hessian H;
        H.init(cols);
        H.add(in, N, kernels::GemmLibrary::OneDnn);
        quantize_site(l, kind, H.xtx);
      };
      run.block(x.P, l, xs.data(), n, T, hooks);
      continue;
    }
    for (int k = 0; k < k_num_lin; ++k) {
      const Lin kind = static_cast<Lin>(k);
      quantize_site(l, kind, gptq_hessian(x, run, xs, scratch, l, kind, mb));
    }
    // the next block's inputs: this block's outputs with its quantized weights
    for (int s = 0; s < n; s += mb)
      run.block(x.P, l, xs.data() + static_cast<std::size_t>(s) * T * C, std::min(mb, n - s), T,
                Hooks{});
  }
  progress.finish();
  x.qm.info["damp"] = fmt::format("{}", x.opt.damp);
  x.qm.info["act_order"] = x.opt.act_order ? "true" : "false";
}

// The embedding and an untied head, when opt.vocab_bits: RTN per row, symmetric, over the
// vocab_size rows the files hold (the padding rows stay zero).
void quantize_vocab(const QuantContext& x) {
  if (x.opt.vocab_bits == 0) return;
  if (x.opt.vocab_bits != 8)
    throw Error(fmt::format("vocabulary bits {} are not supported", x.opt.vocab_bits),
                "use 8 (or 0: keep the embedding and head fp32)");
  const WeightQuant spec{x.opt.vocab_bits, -1, true};
  for (const auto& t : x.layout.tensors()) {
    if (!t.vocab_rows) continue;
    QLinear ql;
    ql.name = t.name.substr(0, t.name.rfind(".weight"));
    ql.layer = -1;
    ql.q = rtn(x.P + t.offset, x.cfg.vocab_size, x.C, spec);
    ql.q.dequantize(x.P + t.offset);
    x.qm.vocab.push_back(std::move(ql));
  }
}

}  // namespace

QuantizedModel quantize_model(const model::ParamLayout& layout, const float* params,
                              const QuantizeOptions& opt, const CalibSet* calib) {
  const auto& cfg = layout.config();
  const int L = cfg.n_layer, C = cfg.n_embd;
  QuantizedModel qm;
  qm.config = cfg;
  qm.method = method_name(opt.method);
  qm.params.resize(layout.total());
  std::copy(params, params + layout.total(), qm.params.data());
  const bool weight_only =
      opt.method == Method::Rtn || opt.method == Method::Gptq || opt.method == Method::Awq;
  if (weight_only) validate(opt.wq);
  if (needs_calibration(opt.method)) {
    if (!calib || calib->n() < 1)
      throw Error(fmt::format("{} needs a calibration set and it is empty", qm.method),
                  "use --nsamples >= 1");
    if (calib->seqlen > cfg.block_size)
      throw Error(fmt::format("calibration --seqlen {} exceeds the model's block_size {}",
                              calib->seqlen, cfg.block_size));
    qm.info["calibration"] = calib->describe();
  }
  const QuantContext x{layout, cfg, params, qm.params.data(), qm, opt, calib, L, C};
  switch (opt.method) {
    case Method::Rtn:
      quantize_rtn(x);
      break;
    case Method::W8A8:
    case Method::Int8:
      quantize_int8(x);
      break;
    case Method::SmoothQuant:
      quantize_smoothquant(x);
      break;
    case Method::Awq:
      quantize_awq(x);
      break;
    case Method::Gptq:
      quantize_gptq(x);
      break;
  }
  quantize_vocab(x);
  return qm;
}

// ---------------------------------------------------------------- files
namespace {

constexpr const char* k_format = "tessera-quant-1";

// Bytes per row of a file's qweight: 2-3 bit codes densely (code c at bit 3c, little-endian
// bit order: the low bits first), 4 bits two per byte (low nibble = even column), 5-8 bits one
// per byte.
int packed_cols(int cols, int bits) {
  if (bits <= 3) return (3 * cols + 7) / 8;
  return bits == 4 ? (cols + 1) / 2 : cols;
}

// The code of column c from a row of qweight bytes (any integer type).
template <typename T>
int file_code(const T* row, int bits, int c) {
  if (bits > 4) return static_cast<int>(row[c]);
  if (bits == 4) return (c % 2) ? (static_cast<int>(row[c / 2]) >> 4) & 15 : row[c / 2] & 15;
  int v = 0;
  for (int k = 0; k < 3; ++k) {
    const int bit = 3 * c + k;
    v |= ((static_cast<int>(row[bit / 8]) >> (bit % 8)) & 1) << k;
  }
  return v;
}

std::vector<std::uint8_t> pack(const QuantizedLinear& q) {
  if (q.spec.bits > 4) return q.q;
  const int pc = packed_cols(q.cols, q.spec.bits);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(q.rows) * pc, 0);
  for (int r = 0; r < q.rows; ++r)
    for (int c = 0; c < q.cols; ++c) {
      const int v = q.q[static_cast<std::size_t>(r) * q.cols + c];
      std::uint8_t* row = out.data() + static_cast<std::size_t>(r) * pc;
      if (q.spec.bits == 4) {
        row[c / 2] |= static_cast<std::uint8_t>((c % 2) ? (v << 4) : v);
      } else {
        for (int k = 0; k < 3; ++k)
          row[(3 * c + k) / 8] |= static_cast<std::uint8_t>(((v >> k) & 1) << ((3 * c + k) % 8));
      }
    }
  return out;
}

// q's codes from qweight stored with the layout of `layout_bits` codes.
template <typename T>
void unpack(const T* packed, int layout_bits, QuantizedLinear& q) {
  const int pc = packed_cols(q.cols, layout_bits);
  q.q.resize(static_cast<std::size_t>(q.rows) * q.cols);
  for (int r = 0; r < q.rows; ++r)
    for (int c = 0; c < q.cols; ++c)
      q.q[static_cast<std::size_t>(r) * q.cols + c] = static_cast<std::uint8_t>(
          file_code(packed + static_cast<std::size_t>(r) * pc, layout_bits, c));
}

// Writes one quantized matrix's tensors (NAME.qweight, .scales, .zeros, .g_idx, .in_scale) and
// returns its metadata entry.
json write_qlinear(io::SafetensorsWriter& w, const std::string& name, const QuantizedLinear& q) {
  auto packed = pack(q);
  w.add_copy(name + ".qweight", io::DType::U8, {q.rows, packed_cols(q.cols, q.spec.bits)},
             packed.data(), packed.size());
  w.add_copy(name + ".scales", io::DType::F32, {q.rows, q.ngroups()}, q.scales.data(),
             q.scales.size() * 4);
  if (q.spec.min_offset) {  // zero points that are not codes
    w.add_copy(name + ".zeros", io::DType::F32, {q.rows, q.ngroups()}, q.zeros.data(),
               q.zeros.size() * 4);
  } else {
    std::vector<std::uint8_t> z(q.zeros.size());
    for (std::size_t i = 0; i < z.size(); ++i) z[i] = static_cast<std::uint8_t>(q.zeros[i]);
    w.add_copy(name + ".zeros", io::DType::U8, {q.rows, q.ngroups()}, z.data(), z.size());
  }
  w.add_copy(name + ".g_idx", io::DType::I32, {q.cols}, q.g_idx.data(), q.g_idx.size() * 4);
  if (!q.in_scale.empty())
    w.add_copy(name + ".in_scale", io::DType::F32, {q.cols}, q.in_scale.data(),
               q.in_scale.size() * 4);
  return {{"name", name},
          {"bits", q.spec.bits},
          {"group", q.spec.group},
          {"sym", q.spec.sym},
          {"min_offset", q.spec.min_offset}};
}

}  // namespace

void save_quantized(const fs::path& dir, const QuantizedModel& qm) {
  fs::create_directories(dir);
  model::ParamLayout layout(qm.config);
  io::SafetensorsWriter w;
  const float* P = qm.params.data();
  json lin = json::array(), vocab = json::array();
  for (const auto& V : qm.vocab) vocab.push_back(write_qlinear(w, V.name, V.q));
  for (const auto& t : layout.tensors()) {
    if (is_linear_weight(t) || (t.vocab_rows && !qm.vocab.empty())) continue;  // stored quantized
    std::vector<std::int64_t> shape = t.shape;
    if (t.vocab_rows) shape = {qm.config.vocab_size, qm.config.n_embd};
    w.add_f32(t.name, shape, P + t.offset);
  }
  for (const auto& L : qm.linears) lin.push_back(write_qlinear(w, L.name, L.q));
  json meta{{"format", k_format},
            {"method", qm.method},
            {"activations", act_mode_name(qm.act.mode)},
            {"int8_threshold", qm.act.threshold},
            {"linears", lin},
            {"vocab", vocab},
            {"info", qm.info},
            {"layout",
             "qweight (out_features, bytes): 2-3 bit codes dense (code c at bit 3c, low bit "
             "first), 4 bits two per byte (low nibble first), 5-8 bits one per byte; "
             "w = scales[r, g_idx[c]] * (q - zeros[r, g_idx[c]]) / in_scale[c]; zeros U8 codes, "
             "or F32 for a linear with min_offset"}};
  w.set_metadata("format", "pt");
  w.set_metadata("tessera_config", io::hf_config_text(qm.config));
  w.set_metadata("quantization", meta.dump());
  w.write(dir / "model.safetensors");
  write_file_atomic(dir / "config.json", io::hf_config_text(qm.config, 2) + "\n");
}

namespace {
AnyModel read_any_model(const fs::path& path, bool dequantize, const QuantizedSink* sink);
}  // namespace

// read_any_model does the work; a JSON value of the wrong type anywhere in the quantization
// metadata becomes one clear error instead of an escaping library exception.
AnyModel load_any_model(const fs::path& path, bool dequantize, const QuantizedSink* sink) {
  try {
    return read_any_model(path, dequantize, sink);
  } catch (const json::exception& e) {
    throw Error(fmt::format("quantized model {}: damaged quantization metadata: {}", path.string(),
                            library_message(e)),
                "re-create it with 'tessera quantize'");
  }
}

namespace {

// The error for a damaged quantized file, with the remedy.
Error bad_file(const fs::path& file, const std::string& what) {
  return Error(fmt::format("quantized model {}: {}", file.string(), what),
               "re-create it with 'tessera quantize'");
}

// The quantization of matrix NAME as its metadata entry `spec` gives it, checked.
WeightQuant read_spec(const json& spec, const fs::path& file, const std::string& name) {
  WeightQuant w;
  w.bits = spec.value("bits", 0);
  w.group = spec.value("group", 0);
  w.sym = spec.value("sym", false);
  w.min_offset = spec.value("min_offset", false);
  if (w.bits < 2 || w.bits > 8) throw bad_file(file, name + ": bad bit width");
  if (w.group == 0 || w.group < -1)
    throw bad_file(file, fmt::format("{}: bad group size {}", name, w.group));
  if (w.sym && w.min_offset) throw bad_file(file, name + ": both sym and min_offset");
  return w;
}

// Every scale and zero of q finite, a symmetric matrix's zeros at the middle code, and every
// code within its bits.
void check_values(const QuantizedLinear& q, const fs::path& file, const std::string& name) {
  for (float v : q.scales)
    if (!std::isfinite(v)) throw bad_file(file, name + ".scales holds a NaN or infinity");
  for (float v : q.zeros)
    if (!std::isfinite(v)) throw bad_file(file, name + ".zeros holds a NaN or infinity");
  const float middle = static_cast<float>((q.spec.maxq() + 1) / 2);
  if (q.spec.sym)
    for (float v : q.zeros)
      if (v != middle)
        throw bad_file(
            file, fmt::format("{} is symmetric but has a zero point {}, not {}", name, v, middle));
  for (auto c : q.q)
    if (c > q.spec.maxq())
      throw bad_file(file, fmt::format("{}: code {} exceeds {} bits", name, c, q.spec.bits));
}

// Reads the quantized matrix NAME (rows, cols) that write_qlinear wrote, every size and code
// checked against its metadata entry `spec`.
QuantizedLinear read_qlinear(const io::SafetensorsFile& st, const fs::path& file,
                             const model::ModelConfig& cfg, const std::string& name, int rows,
                             int cols, const json& spec) {
  QuantizedLinear q;
  q.rows = rows;
  q.cols = cols;
  q.spec = read_spec(spec, file, name);
  const int ng = q.spec.groups(q.cols);
  auto expect = [&](const std::string& tn, std::vector<std::int64_t> shape) {
    const auto* ti = st.find(tn);
    if (!ti) throw bad_file(file, fmt::format("tensor {} is missing", tn));
    if (ti->shape != shape)
      throw Error(fmt::format("quantized model {} does not match its config: {} has shape {}, "
                              "the model {} expects {}",
                              file.string(), tn, io::shape_str(ti->shape), model::describe(cfg),
                              io::shape_str(shape)),
                  "use the config.json written with the quantized file");
  };
  // 2-3 bit codes are dense; files written before that hold them as 4-bit nibbles
  int layout_bits = q.spec.bits;
  const auto* qw = st.find(name + ".qweight");
  if (q.spec.bits <= 3 && qw &&
      qw->shape == std::vector<std::int64_t>{q.rows, packed_cols(q.cols, 4)})
    layout_bits = 4;
  expect(name + ".qweight", {q.rows, packed_cols(q.cols, layout_bits)});
  expect(name + ".scales", {q.rows, ng});
  expect(name + ".zeros", {q.rows, ng});
  expect(name + ".g_idx", {q.cols});
  // the codes from the file's bytes where they are bytes (as write_qlinear writes them): widened
  // to int64 first, an 8-bit embedding's codes took eight times their size
  const io::TensorInfo& qt = *st.find(name + ".qweight");
  if (qt.dtype == io::DType::U8)
    unpack(reinterpret_cast<const std::uint8_t*>(st.bytes(qt).data()), layout_bits, q);
  else
    unpack(st.read_i64(name + ".qweight").data(), layout_bits, q);
  q.scales = st.read_f32(name + ".scales");
  if (q.spec.min_offset) {
    q.zeros = st.read_f32(name + ".zeros");
  } else {
    for (auto z : st.read_i64(name + ".zeros")) q.zeros.push_back(static_cast<float>(z));
  }
  for (auto g : st.read_i64(name + ".g_idx")) {
    if (g < 0 || g >= ng)
      throw bad_file(file, fmt::format("{}.g_idx holds group {} of {}", name, g, ng));
    q.g_idx.push_back(static_cast<std::int32_t>(g));
  }
  check_values(q, file, name);
  if (st.contains(name + ".in_scale")) {
    expect(name + ".in_scale", {q.cols});
    q.in_scale = st.read_f32(name + ".in_scale");
  }
  return q;
}

// name -> metadata entry of the list meta[key] (absent: empty).
std::map<std::string, json> spec_list(const json& meta, const char* key, const fs::path& file) {
  std::map<std::string, json> specs;
  if (!meta.contains(key)) return specs;
  if (!meta[key].is_array()) throw bad_file(file, fmt::format("'{}' is not a list", key));
  for (const auto& l : meta[key]) {
    if (!l.is_object() || !l.contains("name") || !l["name"].is_string())
      throw bad_file(file, fmt::format("bad '{}' entry", key));
    if (!specs.emplace(l["name"].get<std::string>(), l).second)
      throw bad_file(file, fmt::format("'{}' names {} twice", key, l["name"].dump()));
  }
  return specs;
}

// A tessera-quantized file's metadata: its config, layout, and the linears' and vocabulary
// matrices' entries by name.
struct QuantizedHeader {
  json meta;
  model::ModelConfig cfg;
  model::ParamLayout layout;
  std::map<std::string, json> specs, vocab_specs;

  static std::string vocab_name(const model::ParamTensor& t) {
    return t.name.substr(0, t.name.rfind(".weight"));
  }
  // Whether the file holds t quantized (a block linear's weight, or a vocabulary matrix it lists).
  bool quantized(const model::ParamTensor& t) const {
    return is_linear_weight(t) || (t.vocab_rows && vocab_specs.count(vocab_name(t)));
  }
};

QuantizedHeader read_quantized_header(const io::SafetensorsFile& st, const std::string& text,
                                      const fs::path& file, const fs::path& config) {
  json meta = json::parse(text, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("format") ||
      meta["format"] != k_format)
    throw bad_file(file, "unknown quantization metadata");
  const model::ModelConfig cfg = io::model_config_of(st, config);
  if (!meta.contains("linears")) throw bad_file(file, "no 'linears' list");
  if (const json& t = meta.value("int8_threshold", json(6.0));
      !t.is_number() || !(t.get<double>() > 0 && std::isfinite(t.get<double>())))
    throw bad_file(file, fmt::format("int8_threshold {} is not a positive number", t.dump()));
  QuantizedHeader h{meta, cfg, model::ParamLayout(cfg), spec_list(meta, "linears", file),
                    spec_list(meta, "vocab", file)};
  // The file must hold this model before its memory is allocated.
  try {
    io::check_model_tensors(st, h.layout, "", [&](const auto& t) { return h.quantized(t); });
  } catch (const Error& e) {
    throw Error(
        fmt::format("quantized model {} does not match its config: {}", file.string(), e.what()),
        "use the config.json written with the quantized file");
  }
  io::check_model_fits(h.layout, file);
  return h;
}

// Every tensor but the block linears into P: the fp32 ones read, the quantized vocabulary
// matrices dequantized into P if `dequantize` and handed to the sink (else kept in out).
// Returns the vocabulary matrices' bits (0: none quantized).
int read_vocab_and_fp32(const io::SafetensorsFile& st, const fs::path& file,
                        const QuantizedHeader& h, bool dequantize, const QuantizedSink* sink,
                        float* P, AnyModel& out) {
  const model::ModelConfig& cfg = h.cfg;
  int vocab_bits = 0;
  for (const auto& t : h.layout.tensors()) {
    if (!h.quantized(t)) {
      std::vector<std::int64_t> shape = t.shape;
      if (t.vocab_rows) shape = {cfg.vocab_size, cfg.n_embd};
      st.read_f32(t.name, shape, P + t.offset);
      continue;
    }
    if (!t.vocab_rows) continue;  // a block linear: read_linears
    const std::string name = QuantizedHeader::vocab_name(t);
    AnyModel::VocabMatrix v{t.offset, read_qlinear(st, file, cfg, name, cfg.vocab_size, cfg.n_embd,
                                                   h.vocab_specs.at(name))};
    if (dequantize) v.q.dequantize(P + t.offset);
    vocab_bits = v.q.spec.bits;
    if (sink)
      sink->vocab(v.offset, std::move(v.q));
    else
      out.vocab.push_back(std::move(v));
  }
  return vocab_bits;
}

// The block linears, layer-major in Lin order: dequantized into P if `dequantize`, handed to the
// sink (else kept in out).
void read_linears(const io::SafetensorsFile& st, const fs::path& file, const QuantizedHeader& h,
                  bool dequantize, const QuantizedSink* sink, float* P, AnyModel& out) {
  const model::ModelConfig& cfg = h.cfg;
  for (int l = 0; l < cfg.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      const Lin kind = static_cast<Lin>(k);
      const std::string name = linear_name(cfg, l, kind);
      auto sp = h.specs.find(name);
      if (sp == h.specs.end()) throw bad_file(file, fmt::format("linear {} is missing", name));
      QuantizedLinear q =
          read_qlinear(st, file, cfg, name, lin_rows(cfg, kind), lin_cols(cfg, kind), sp->second);
      if (dequantize) q.dequantize(P + lin_weight_offset(h.layout, l, kind));
      if (sink)
        sink->linear(static_cast<std::size_t>(l) * k_num_lin + k, std::move(q));
      else
        out.linears.push_back(std::move(q));
    }
}

// The method, activations, description and info of a quantized file's metadata.
void describe_quantized(const json& meta, int vocab_bits, AnyModel& out) {
  out.quantized = true;
  out.act.mode = parse_act_mode(meta.value("activations", "none"));
  out.act.threshold = meta.value("int8_threshold", 6.0f);
  const auto& l0 = meta["linears"].empty() ? json::object() : meta["linears"][0];
  WeightQuant wq{l0.value("bits", 0), l0.value("group", 0), l0.value("sym", false)};
  out.description = fmt::format(
      "{} {} act {}{}", meta.value("method", "?"), describe(wq), act_mode_name(out.act.mode),
      vocab_bits == 0 ? std::string() : fmt::format(", embedding {}-bit", vocab_bits));
  if (meta.contains("info") && meta["info"].is_object())
    for (auto& [k, v] : meta["info"].items())
      if (v.is_string()) out.info[k] = v.get<std::string>();
}

AnyModel read_any_model(const fs::path& path, bool dequantize, const QuantizedSink* sink) {
  const bool is_dir = input_kind(path, "model") == InputKind::Directory;
  fs::path file = is_dir ? path / "model.safetensors" : path;
  AnyModel out;
  if (input_kind(file, "model file") == InputKind::Missing) {  // load_model's standard message
    out.model = io::load_model(path);
    return out;
  }
  if (!is_dir && file.extension() == ".gguf") {
    // A llama.cpp file: its quantized blocks as they are for the packed loader (sink), where
    // every block linear has a type gguf_import reads, else dequantized on load.
    std::string why;
    if (sink && !dequantize && read_gguf_quantized(io::GgufFile::open(path), *sink, out, why))
      return out;
    out.model = io::load_model(path);
    out.description = why.empty() ? "GGUF, dequantized to fp32"
                                  : fmt::format("GGUF, dequantized to fp32 ({})", why);
    return out;
  }
  auto st = io::SafetensorsFile::open(file);
  auto it = st.metadata().find("quantization");
  if (it == st.metadata().end()) {
    out.model = io::load_model(path);
    out.description = "fp32";
    return out;
  }
  const QuantizedHeader h = read_quantized_header(
      st, it->second, file, (is_dir ? path : path.parent_path()) / "config.json");
  out.model.config = h.cfg;
  out.model.params = Buffer<float>(h.layout.total());
  float* P = out.model.params.data();  // zeros
  const int vocab_bits = read_vocab_and_fp32(st, file, h, dequantize, sink, P, out);
  read_linears(st, file, h, dequantize, sink, P, out);
  if (dequantize)
    io::check_finite(h.layout, P, file.string() + " (dequantized)");
  else  // the quantized matrices' scales were checked by read_qlinear
    io::check_finite(h.layout, P, file.string(), [&](const auto& t) { return h.quantized(t); });
  describe_quantized(h.meta, vocab_bits, out);
  return out;
}
}  // namespace

void dequantize_weights(AnyModel& any) {
  const model::ParamLayout layout(any.model.config);
  float* P = any.model.params.data();
  for (int l = 0; l < any.model.config.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k)
      any.linears[static_cast<std::size_t>(l) * k_num_lin + k].dequantize(
          P + lin_weight_offset(layout, l, static_cast<Lin>(k)));
  for (const auto& v : any.vocab) v.q.dequantize(P + v.offset);
}

std::vector<double> relative_reconstruction_error(const model::ParamLayout& layout,
                                                  const float* params, const QuantizedModel& qm,
                                                  const Capture& cap) {
  std::vector<double> out;
  for (std::size_t i = 0; i < qm.linears.size(); ++i) {
    const auto& L = qm.linears[i];
    const int rows = L.q.rows, cols = L.q.cols;
    const float* W = params + lin_weight_offset(layout, L.layer, L.kind);
    auto S = cap.layers[L.layer][static_cast<int>(L.kind)].hessian.mean_xtx();
    auto We = qm.effective_weight(i);
    std::vector<float> zero(static_cast<std::size_t>(rows) * cols, 0.0f);
    double err = output_mse(We.data(), W, rows, cols, S);
    double ref = output_mse(zero.data(), W, rows, cols, S);
    out.push_back(ref > 0 ? err / ref : err);
  }
  return out;
}

}  // namespace tessera::quant
