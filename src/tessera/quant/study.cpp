#include "tessera/quant/study.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/quant/methods.hpp"
#include "tessera/quant/outliers.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/study_eval.hpp"

namespace tessera::quant {

eval::LogitsFn logits_fn(const model::ParamLayout& layout, const float* params, ActQuant act) {
  auto run = std::make_shared<Runner>(layout);
  return [run, params, act](const std::int32_t* tokens, int B, int T, float* logits) {
    Hooks h;
    h.act = act;
    run->logits(params, tokens, B, T, logits, h);
  };
}

namespace {
// A quantized model's logits: its dequantized weights through the fp32 forward, or with `packed`
// the packed kernels where they reproduce its activation quantization (the PackedModel lives as
// long as the function).
eval::LogitsFn model_logits(const model::ParamLayout& layout, const QuantizedModel& qm,
                            bool packed) {
  if (!packed || !packable(qm.act)) return logits_fn(layout, qm.params.data(), qm.act);
  auto pm = std::make_shared<const PackedModel>(pack_model(qm));
  auto fn = pm->logits_fn(layout, qm.params.data(), qm.act);
  return [pm, fn](const std::int32_t* tokens, int B, int T, float* logits) {
    fn(tokens, B, T, logits);
  };
}
}  // namespace

std::vector<std::int32_t> read_tokens(const std::filesystem::path& shard, std::size_t max_tokens,
                                      int vocab_size) {
  if (input_kind(shard, "evaluation shard") == InputKind::Missing)
    throw Error(fmt::format("evaluation shard not found: {}", shard.string()),
                "run 'tessera prepare' or pass --data SHARD");
  data::ShardReader rd(shard);
  std::size_t n = max_tokens ? std::min(max_tokens, rd.size()) : rd.size();
  std::vector<std::uint32_t> ids(n);
  if (n) rd.read(0, n, ids.data());
  for (std::size_t i = 0; i < n; ++i)
    if (ids[i] >= static_cast<std::uint32_t>(vocab_size))
      throw Error(fmt::format("token shard {} holds the token id {} at position {}, outside the "
                              "model's vocabulary of {}",
                              shard.string(), ids[i], i, vocab_size),
                  "the shard was made with another tokenizer or is damaged");
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

MethodSpec parse_method_spec(const std::string& spec, const WeightQuant& base) {
  MethodSpec m;
  m.label = spec;
  m.wq = base;
  const auto colon = spec.find(':');
  m.method = parse_method(spec.substr(0, colon));
  if (colon == std::string::npos) return m;
  const std::string fmt_s = spec.substr(colon + 1);
  auto bad = [&] {
    return Error(
        fmt::format("weight format '{}' of '{}' is not wBITS[gGROUP][sym|min]", fmt_s, spec),
        "e.g. gptq:w3, rtn:w4g32, awq:w4g128sym, rtn:w4g32min (llama.cpp's Q4_1 form)");
  };
  std::size_t i = 0;
  auto number = [&] {
    std::size_t j = i;
    while (j < fmt_s.size() && std::isdigit(static_cast<unsigned char>(fmt_s[j]))) ++j;
    if (j == i || j - i > 6) throw bad();
    int v = std::stoi(fmt_s.substr(i, j - i));
    i = j;
    return v;
  };
  if (fmt_s.empty() || fmt_s[i++] != 'w') throw bad();
  m.wq.bits = number();
  if (i < fmt_s.size() && fmt_s[i] == 'g') {
    ++i;
    m.wq.group = number();
  }
  if (fmt_s.compare(i, std::string::npos, "sym") == 0) {
    m.wq.sym = true;
    i = fmt_s.size();
  } else if (fmt_s.compare(i, std::string::npos, "min") == 0) {
    m.wq.min_offset = true;
    i = fmt_s.size();
  }
  if (i != fmt_s.size()) throw bad();
  validate(m.wq);
  return m;
}

EvalText parse_eval_text(const std::string& spec) {
  const auto eq = spec.find('=');
  EvalText t;
  t.path = eq == std::string::npos ? spec : spec.substr(eq + 1);
  if (eq != std::string::npos) {
    t.name = spec.substr(0, eq);
  } else {
    const auto stem = t.path.stem().string();
    t.name = (stem == "val" || stem == "train") && t.path.has_parent_path()
                 ? t.path.parent_path().filename().string()
                 : stem;
  }
  if (t.name.empty() || t.path.empty())
    throw Error(fmt::format("evaluation text '{}' is not NAME=PATH or PATH", spec));
  return t;
}

void plant_outlier(const model::ParamLayout& layout, float* params, int layer, int channel,
                   float factor) {
  const auto& cfg = layout.config();
  if (layer < 0 || layer >= cfg.n_layer || channel < 0 || channel >= cfg.n_embd)
    throw Error(
        fmt::format("planted outlier at layer {} channel {} is outside the model ({} "
                    "layers of {} channels)",
                    layer, channel, cfg.n_layer, cfg.n_embd));
  if (!(factor > 0) || !std::isfinite(factor))
    throw Error(fmt::format("planted outlier factor must be a positive number, got {}", factor));
  const auto& lw = layout.layers[layer];
  params[lw.ln2_w + channel] *= factor;
  if (lw.ln2_b != model::k_absent) params[lw.ln2_b + channel] *= factor;
  const int C = cfg.n_embd;
  for (int r = 0; r < cfg.fc_rows(); ++r)
    params[lw.fc_w + static_cast<std::size_t>(r) * C + channel] /= factor;
}

namespace {

using clock = std::chrono::steady_clock;
double since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

std::vector<std::int32_t> text_tokens(const EvalText& t, const std::filesystem::path& tokenizer,
                                      int V) {
  if (t.path.extension() == ".bin") return read_tokens(t.path, 0, V);
  if (input_kind(t.path, "evaluation text") == InputKind::Missing)
    throw Error(fmt::format("evaluation text '{}' not found: {}", t.name, t.path.string()),
                "run scripts/setup (it extracts the default texts) or pass --text NAME=PATH");
  auto ids = tokenize_text(read_file(t.path, "evaluation text"), tokenizer);
  for (const auto id : ids)
    if (id >= V)
      throw Error(fmt::format("the tokenizer {} gives token id {}, outside the model's "
                              "vocabulary of {}",
                              tokenizer.string(), id, V),
                  "pass the model's own tokenizer (--tokenizer)");
  return ids;
}

// "token 'x' at position P, channel D: value (R x median)" of a block output's activation.
std::string activation_line(const MassiveActivation& m, const CalibSet& calib,
                            const data::Tokenizer* tok) {
  const auto id = static_cast<std::uint32_t>(
      calib.tokens[static_cast<std::size_t>(m.sample) * calib.seqlen + m.position]);
  std::string text = tok ? tok->decode(std::span<const std::uint32_t>(&id, 1)) : "";
  for (auto& c : text)
    if (c == '\n' || c == '|' || c == '\r') c = ' ';
  return fmt::format("position {} (token {} '{}'), channel {}: {:.0f} ({:.0f}x median)", m.position,
                     id, text, m.dim, m.value, m.median > 0 ? std::fabs(m.value) / m.median : 0.0);
}

// The block outputs' largest activations: the four largest over the layers, and every layer's.
void residual_lines(const ResidualStats& rs, const CalibSet& calib, const data::Tokenizer* tok,
                    SetOutliers& s) {
  auto ms = rs.largest;
  std::sort(ms.begin(), ms.end(), [](const MassiveActivation& a, const MassiveActivation& b) {
    return std::fabs(a.value) > std::fabs(b.value);
  });
  for (std::size_t i = 0; i < ms.size() && i < 4; ++i)
    s.massive.push_back(
        fmt::format("layer {}, {}", ms[i].layer, activation_line(ms[i], calib, tok)));
  for (const auto& m : rs.largest)
    s.residual_where.push_back(fmt::format("pos {} ch {}", m.position, m.dim));
}

// Per layer: the largest |x| of any linear input and its max/median ratio, and SmoothQuant's
// largest migration scale at the norm -> linear sites.
void layer_profile(const model::ParamLayout& layout, const float* params, const Capture& cap,
                   float alpha, SetOutliers& s) {
  const auto& cfg = layout.config();
  for (int l = 0; l < cfg.n_layer; ++l) {
    float mx = 0;
    double ratio = 0, smax = 0;
    for (int k = 0; k < k_num_lin; ++k) {
      const auto& st = cap.layers[l][k].stats;
      std::vector<float> m = st.maxabs;
      const float top = *std::max_element(m.begin(), m.end());
      std::nth_element(m.begin(), m.begin() + m.size() / 2, m.end());
      mx = std::max(mx, top);
      ratio = std::max(ratio, m[m.size() / 2] > 0 ? top / m[m.size() / 2] : 0.0);
      const Lin kind = static_cast<Lin>(k);
      if (kind != Lin::Qkv && kind != Lin::Fc) continue;
      const auto sc = smooth_scales(st.maxabs, params + lin_weight_offset(layout, l, kind),
                                    lin_rows(cfg, kind), lin_cols(cfg, kind), alpha);
      smax = std::max(smax, static_cast<double>(*std::max_element(sc.begin(), sc.end())));
    }
    s.input_max.push_back(mx);
    s.input_ratio.push_back(ratio);
    s.smooth_max.push_back(smax);
  }
}

// One capture of the calibration set `cname` (seed 0) through the unquantized model; its report
// goes into `all` under the set's name.
SetOutliers set_outliers(const model::ParamLayout& layout, const float* params,
                         const std::string& cname, const StudyOptions& opt, int seqlen,
                         const data::Tokenizer* tok, nlohmann::json& all) {
  const int V = layout.config().vocab_size;
  auto calib = make_calibration(cname, opt.nsamples, seqlen, 0, V, opt.sources);
  auto cap = capture(layout, params, calib, false);
  auto rep = analyze_outliers(cap);
  SetOutliers s;
  s.calib = cname;
  s.summary = rep.summary_line();
  for (std::size_t i = 0; i < rep.channels.size() && i < 3; ++i) {
    const auto& c = rep.channels[i];
    s.top.push_back(
        fmt::format("{} ch {}: {:.1f} ({:.0f}x median)", c.linear, c.channel, c.maxabs, c.ratio));
  }
  residual_lines(cap.residual, calib, tok, s);
  s.residual_max = rep.residual.maxabs;
  layer_profile(layout, params, cap, opt.base.alpha, s);
  all[cname] = rep.to_json();
  all[cname]["calibration"] = calib.describe();
  return s;
}

// One quantization of the study: a method with its calibration set and seed ("-" and 0 for the
// methods without calibration).
struct Job {
  MethodSpec spec;
  std::string calib;
  int seed = 0;
  bool long_row = false;
};

std::vector<Job> list_jobs(const StudyOptions& opt) {
  std::vector<Job> jobs;
  for (const auto& mname : opt.methods) {
    const MethodSpec spec = parse_method_spec(mname, opt.base.wq);
    const bool is_long = std::find(opt.long_methods.begin(), opt.long_methods.end(), mname) !=
                         opt.long_methods.end();
    if (!needs_calibration(spec.method)) {
      jobs.push_back({spec, "-", 0, is_long});
      continue;
    }
    const bool first_only = std::find(opt.first_calib_only.begin(), opt.first_calib_only.end(),
                                      mname) != opt.first_calib_only.end();
    for (const auto& cname : opt.calibs) {
      for (int seed = 0; seed < opt.seeds; ++seed)
        jobs.push_back({spec, cname, seed, is_long && seed == 0 && cname == opt.calibs.front()});
      if (first_only) break;
    }
  }
  return jobs;
}

QuantizedModel quantize_job(const model::ParamLayout& layout, const float* params, const Job& j,
                            const StudyOptions& opt, int seqlen) {
  QuantizeOptions qo = opt.base;
  qo.method = j.spec.method;
  qo.wq = j.spec.wq;
  if (j.calib == "-") return quantize_model(layout, params, qo, nullptr);
  const auto calib =
      make_calibration(j.calib, opt.nsamples, seqlen, static_cast<std::uint64_t>(j.seed),
                       layout.config().vocab_size, opt.sources);
  return quantize_model(layout, params, qo, &calib);
}

// A row's place in the tables: its method's, then its calibration set's, then its seed.
std::tuple<std::ptrdiff_t, std::ptrdiff_t, std::uint64_t> order_of(const StudyOptions& opt,
                                                                   const StudyRow& r) {
  const auto m = std::find(opt.methods.begin(), opt.methods.end(), r.method) - opt.methods.begin();
  const auto c = std::find(opt.calibs.begin(), opt.calibs.end(), r.calib) - opt.calibs.begin();
  return {m, c, r.seed};
}

StudyRow row_of(const Job& j, int n_windows) {
  StudyRow row;
  row.method = j.spec.label;
  row.calib = j.calib;
  row.seed = static_cast<std::uint64_t>(j.seed);
  row.long_row = j.long_row;
  row.scores.resize(n_windows);
  return row;
}

// What a pass over windows needs: the layout, the windows, the short windows' reference (filled by
// the first pass), batch size.
struct EvalState {
  const model::ParamLayout& layout;
  const study_eval::Windows& win;
  study_eval::Reference short_ref;  // the unquantized model on the short windows
  std::vector<int> short_slot;      // window -> its slot in short_ref (-1: not short)
  int batch = 2;
  bool packed = false;  // the quantized models through the packed kernels
};

// The first pass: the unquantized model on every window (its scores into res.fp, its short
// windows' distributions kept) and the long rows' models beside it on the same logits.
void reference_pass(EvalState& st, const float* params, std::vector<QuantizedModel>& long_models,
                    std::vector<StudyRow*>& long_rows, StudyResult& res) {
  const auto& cfg = st.layout.config();
  const int ctx = st.win.ctx, V = cfg.vocab_size, Vp = cfg.padded_vocab(), n = st.win.n();
  const std::size_t per = static_cast<std::size_t>(ctx) * Vp;
  auto fp = logits_fn(st.layout, params, {});
  std::vector<eval::LogitsFn> fns;
  for (const auto& qm : long_models) fns.push_back(model_logits(st.layout, qm, st.packed));
  res.fp.resize(n);
  std::vector<float> logits(st.batch * per);
  Progress progress("study: reference pass", n, 0.0);
  for (int w0 = 0; w0 < n; w0 += st.batch) {
    progress.update(w0, fmt::format("windows ({} models)", 1 + fns.size()));
    const int B = std::min(st.batch, n - w0);
    study_eval::Reference ref{V, Vp, ctx, {}, {}, {}};
    std::vector<float> fl(B * per);
    fp(st.win.window(w0), B, ctx, fl.data());
    auto own = ref.set(std::move(fl), B, st.win.window(w0));
    for (int b = 0; b < B; ++b) {
      res.fp[w0 + b] = own[b];
      const int slot = st.short_slot[w0 + b];
      if (slot < 0) continue;
      std::copy(ref.at(b, 0), ref.at(b, 0) + per, st.short_ref.p.data() + slot * per);
      for (int t = 0; t < ctx; ++t) {
        st.short_ref.neg_entropy[slot * ctx + t] = ref.neg_entropy[b * ctx + t];
        st.short_ref.argmax[slot * ctx + t] = ref.argmax[b * ctx + t];
      }
    }
    for (std::size_t m = 0; m < fns.size(); ++m) {
      fns[m](st.win.window(w0), B, ctx, logits.data());
      for (int b = 0; b < B; ++b)
        long_rows[m]->scores[w0 + b] =
            study_eval::score_window(ref, b, logits.data() + b * per, st.win.window(w0 + b));
    }
  }
  progress.finish();
}

// A row's scores on the short windows against the kept reference.
void score_short(const EvalState& st, const QuantizedModel& qm, StudyRow& row) {
  const auto& cfg = st.layout.config();
  const int ctx = st.win.ctx;
  const std::size_t per = static_cast<std::size_t>(ctx) * cfg.padded_vocab();
  auto fn = model_logits(st.layout, qm, st.packed);
  std::vector<int> todo;
  for (int w = 0; w < st.win.n(); ++w)
    if (st.short_slot[w] >= 0) todo.push_back(w);
  std::vector<float> logits(st.batch * per);
  std::vector<std::int32_t> in(static_cast<std::size_t>(st.batch) * ctx);
  for (std::size_t i = 0; i < todo.size(); i += st.batch) {
    const int B = static_cast<int>(std::min<std::size_t>(st.batch, todo.size() - i));
    for (int b = 0; b < B; ++b)
      std::copy(st.win.window(todo[i + b]), st.win.window(todo[i + b]) + ctx, in.begin() + b * ctx);
    fn(in.data(), B, ctx, logits.data());
    for (int b = 0; b < B; ++b) {
      const int w = todo[i + b];
      row.scores[w] = study_eval::score_window(st.short_ref, st.short_slot[w],
                                               logits.data() + b * per, st.win.window(w));
    }
  }
}

void report_row(const StudyResult& res, const StudyRow& row, std::size_t k, std::size_t n,
                double eta_s) {
  const auto m = res.measures(row.scores, false), fp = res.measures(res.fp, false);
  std::fprintf(stderr,
               "study [%zu/%zu] %s, calibration %s, seed %llu: KL %.3g, ppl A x%.4f (quantize %.0f "
               "s, total %.0f s)%s\n",
               k, n, row.method.c_str(), row.calib.c_str(),
               static_cast<unsigned long long>(row.seed), m.kl,
               fp.ppl_a > 0 ? m.ppl_a / fp.ppl_a : 0.0, row.quantize_seconds, row.seconds,
               eta_s > 0 ? fmt::format("; about {:.0f} min left", eta_s / 60).c_str() : "");
}

void check_options(const model::ModelConfig& cfg, const StudyOptions& opt, int ctx) {
  if (ctx > cfg.block_size)
    throw Error(fmt::format("--ctx {} exceeds the model's block_size {}", ctx, cfg.block_size));
  if (opt.seeds < 1) throw Error("--seeds must be >= 1");
  if (opt.windows < 1) throw Error("--windows must be >= 1");
  if (opt.long_windows < 0) throw Error("--long-windows must be >= 0");
  if (opt.texts.empty()) throw Error("the study needs at least one evaluation text");
  if (opt.methods.empty() || opt.calibs.empty())
    throw Error("the study needs at least one method and one calibration set");
  for (const auto& m : opt.methods) parse_method_spec(m, opt.base.wq);  // validates
  for (const auto& m : opt.long_methods)
    if (std::find(opt.methods.begin(), opt.methods.end(), m) == opt.methods.end())
      throw Error(fmt::format("--long method '{}' is not one of --methods", m));
  for (const auto& c : opt.calibs) {
    if (std::find(calibration_names().begin(), calibration_names().end(), c) ==
        calibration_names().end())
      throw Error(fmt::format("unknown calibration set '{}'", c),
                  "use corpus, corpus-concat, random, punct, domain, lang2 or code");
    check_calibration_source(c, opt.sources);
  }
}

study_eval::Windows study_windows(const model::ModelConfig& cfg, const StudyOptions& opt, int ctx,
                                  StudyResult& res) {
  std::vector<std::vector<std::int32_t>> toks;
  for (const auto& t : opt.texts)
    toks.push_back(text_tokens(t, opt.sources.tokenizer, cfg.vocab_size));
  const std::int32_t bos = opt.bos >= 0 && opt.bos < cfg.vocab_size ? opt.bos : cfg.vocab_size - 1;
  res.texts = opt.texts;
  auto win = study_eval::make_windows(toks, opt.texts, ctx, opt.windows, opt.long_windows, bos);
  res.windows = win.info;
  res.ctx = ctx;
  return win;
}

// The activation outliers of each calibration set (res.outliers, res.outliers_by_set).
void outliers_of_sets(const model::ParamLayout& layout, const float* params,
                      const StudyOptions& opt, int seqlen, StudyResult& res) {
  std::unique_ptr<data::Tokenizer> tok;
  try {
    tok = std::make_unique<data::Tokenizer>(io::load_tokenizer(opt.sources.tokenizer));
  } catch (const Error&) {  // the massive activations are then listed without their text
  }
  for (const auto& cname : opt.calibs) {
    std::fprintf(stderr, "study: activation outliers of calibration set %s\n", cname.c_str());
    res.outliers_by_set.push_back(
        set_outliers(layout, params, cname, opt, seqlen, tok.get(), res.outliers));
  }
}

// The evaluation's state before the reference pass: each short window's slot, its reference
// distributions' storage.
EvalState eval_state(const model::ParamLayout& layout, const study_eval::Windows& win,
                     const StudyOptions& opt) {
  const auto& cfg = layout.config();
  const int ctx = win.ctx;
  EvalState st{layout, win, {cfg.vocab_size, cfg.padded_vocab(), ctx, {}, {}, {}},
               {},     2,   opt.packed_kernels};
  int n_short = 0;
  for (const auto& w : win.info) st.short_slot.push_back(w.short_ ? n_short++ : -1);
  st.short_ref.p.resize(static_cast<std::size_t>(n_short) * ctx * cfg.padded_vocab());
  st.short_ref.neg_entropy.resize(static_cast<std::size_t>(n_short) * ctx);
  st.short_ref.argmax.resize(static_cast<std::size_t>(n_short) * ctx);
  return st;
}

// The rows scored on the long windows too: their models quantized first, then scored beside the
// unquantized model in the reference pass (which also fills st's short references).
void long_rows(EvalState& st, const model::ParamLayout& layout, const float* params,
               const std::vector<Job>& jobs, const StudyOptions& opt, int seqlen,
               StudyResult& res) {
  std::vector<QuantizedModel> models;
  std::vector<StudyRow*> rows;
  for (const auto& j : jobs) {
    if (!j.long_row) continue;
    const auto r0 = clock::now();
    std::fprintf(stderr, "study: quantizing %s (%s) for the long windows\n", j.spec.label.c_str(),
                 j.calib.c_str());
    models.push_back(quantize_job(layout, params, j, opt, seqlen));
    res.rows.push_back(row_of(j, st.win.n()));
    res.rows.back().quantize_seconds = since(r0);
    rows.push_back(&res.rows.back());
  }
  const auto p0 = clock::now();
  reference_pass(st, params, models, rows, res);
  for (auto* r : rows)
    r->seconds = r->quantize_seconds + since(p0) / static_cast<double>(1 + rows.size());
}

// The other rows, each quantized and scored on the short windows, with progress.
void grid_rows(const EvalState& st, const model::ParamLayout& layout, const float* params,
               const std::vector<Job>& jobs, const StudyOptions& opt, int seqlen,
               StudyResult& res) {
  const auto n_grid = static_cast<std::size_t>(
      std::count_if(jobs.begin(), jobs.end(), [](const Job& j) { return !j.long_row; }));
  std::size_t done = 0;
  const auto g0 = clock::now();
  for (const auto& j : jobs) {
    if (j.long_row) continue;
    const auto r0 = clock::now();
    auto qm = quantize_job(layout, params, j, opt, seqlen);
    StudyRow row = row_of(j, st.win.n());
    row.quantize_seconds = since(r0);
    score_short(st, qm, row);
    row.seconds = since(r0);
    res.rows.push_back(std::move(row));
    ++done;
    const double eta = since(g0) / static_cast<double>(done) * static_cast<double>(n_grid - done);
    report_row(res, res.rows.back(), done, n_grid, eta);
  }
}

}  // namespace

StudyResult run_study(const model::ParamLayout& layout, const float* params,
                      const StudyOptions& opt) {
  const auto t0 = clock::now();
  const auto& cfg = layout.config();
  const int ctx = opt.ctx > 0 ? opt.ctx : std::min(cfg.block_size, 512);
  check_options(cfg, opt, ctx);
  const int seqlen = opt.seqlen > 0 ? opt.seqlen : std::min(cfg.block_size, 256);
  StudyResult res;
  const auto win = study_windows(cfg, opt, ctx, res);
  outliers_of_sets(layout, params, opt, seqlen, res);
  EvalState st = eval_state(layout, win, opt);
  res.packed_kernels = opt.packed_kernels;
  const auto jobs = list_jobs(opt);
  res.rows.reserve(jobs.size());  // the long rows are scored through pointers to their rows
  long_rows(st, layout, params, jobs, opt, seqlen, res);
  grid_rows(st, layout, params, jobs, opt, seqlen, res);
  // the tables list the methods and sets in the order given, the long rows among the others
  std::stable_sort(res.rows.begin(), res.rows.end(), [&](const StudyRow& a, const StudyRow& b) {
    return order_of(opt, a) < order_of(opt, b);
  });
  res.seconds = since(t0);
  return res;
}

}  // namespace tessera::quant
