#include "tessera/quant/study.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/quant/outliers.hpp"

namespace tessera::quant {

eval::LogitsFn logits_fn(const model::ParamLayout& layout, const float* params, ActQuant act) {
  auto run = std::make_shared<Runner>(layout);
  return [run, params, act](const std::int32_t* tokens, int B, int T, float* logits) {
    Hooks h;
    h.act = act;
    run->logits(params, tokens, B, T, logits, h);
  };
}

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

namespace {
// One capture of the calibration set `cname` (seed 0) through the unquantized model; its report
// goes into `all` under the set's name.
SetOutliers set_outliers(const model::ParamLayout& layout, const float* params,
                         const std::string& cname, const StudyOptions& opt, int seqlen,
                         nlohmann::json& all) {
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
  s.residual_max = rep.residual.maxabs;
  all[cname] = rep.to_json();
  all[cname]["calibration"] = calib.describe();
  return s;
}
}  // namespace

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

StudyResult run_study(const model::ParamLayout& layout, const float* params,
                      const StudyOptions& opt) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const auto& cfg = layout.config();
  const int ctx = opt.ctx > 0 ? opt.ctx : std::min(cfg.block_size, 1024);
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab();
  if (ctx > cfg.block_size)
    throw Error(fmt::format("--ctx {} exceeds the model's block_size {}", ctx, cfg.block_size));
  if (opt.seeds < 1) throw Error("--seeds must be >= 1");
  if (opt.methods.empty() || opt.calibs.empty())
    throw Error("the study needs at least one method and one calibration set");
  for (const auto& m : opt.methods) parse_method_spec(m, opt.base.wq);  // validates
  for (const auto& c : opt.calibs)
    if (std::find(calibration_names().begin(), calibration_names().end(), c) ==
        calibration_names().end())
      throw Error(fmt::format("unknown calibration set '{}'", c),
                  "use corpus, corpus-concat, random, punct, domain, lang2 or code");
  const int seqlen = opt.seqlen > 0 ? opt.seqlen : std::min(cfg.block_size, 512);
  auto tokens = read_tokens(opt.eval_shard, static_cast<std::size_t>(opt.eval_windows) * ctx, V);
  StudyResult res;
  auto fp = logits_fn(layout, params, {});
  auto w = eval::perplexity(fp, tokens, ctx, V, Vp, eval::PplProtocol::Windows, opt.eval_windows);
  auto h =
      eval::perplexity(fp, tokens, ctx, V, Vp, eval::PplProtocol::SecondHalf, opt.eval_windows);
  res.fp_ppl_windows = w.perplexity;
  res.fp_ppl_ci = w.ppl_ci95;
  res.fp_ppl_second_half = h.perplexity;
  res.windows_label = w.label;
  res.second_half_label = h.label;
  for (const auto& cname : opt.calibs)
    res.outliers_by_set.push_back(set_outliers(layout, params, cname, opt, seqlen, res.outliers));
  for (const auto& mname : opt.methods) {
    const MethodSpec spec = parse_method_spec(mname, opt.base.wq);
    const Method m = spec.method;
    // Methods without calibration give one row per calibration set and seed all the same; run
    // them once.
    const bool calib_free = !needs_calibration(m);
    for (const auto& cname : opt.calibs) {
      for (int seed = 0; seed < opt.seeds; ++seed) {
        if (calib_free && (seed > 0 || cname != opt.calibs.front())) continue;
        const auto r0 = clock::now();
        QuantizeOptions qo = opt.base;
        qo.method = m;
        qo.wq = spec.wq;
        CalibSet calib;
        if (!calib_free)
          calib = make_calibration(cname, opt.nsamples, seqlen, static_cast<std::uint64_t>(seed), V,
                                   opt.sources);
        auto qm = quantize_model(layout, params, qo, calib_free ? nullptr : &calib);
        auto qf = logits_fn(layout, qm.params.data(), qm.act);
        StudyRow row;
        row.method = mname;
        row.calib = calib_free ? "-" : cname;
        row.seed = static_cast<std::uint64_t>(seed);
        auto kl = eval::kl_divergence(fp, qf, tokens, ctx, V, Vp, opt.eval_windows);
        row.ppl_windows = kl.model_ppl.perplexity;  // same windows and logits as the KL
        row.ppl_second_half = eval::perplexity(qf, tokens, ctx, V, Vp,
                                               eval::PplProtocol::SecondHalf, opt.eval_windows)
                                  .perplexity;
        row.kl_mean = kl.mean;
        row.top1 = kl.top1_agreement;
        row.ppl_ratio_ci = eval::perplexity_ratio_interval(w.per_window, kl.model_ppl.per_window);
        row.kl_ci = kl.mean_ci95;
        row.top1_ci = kl.top1_ci95;
        row.seconds = std::chrono::duration<double>(clock::now() - r0).count();
        if (opt.verbose)
          std::fprintf(stderr, "study: %s calib %s seed %d: ppl %.3f / %.3f  KL %.4f  (%.1f s)\n",
                       mname.c_str(), row.calib.c_str(), seed, row.ppl_windows, row.ppl_second_half,
                       row.kl_mean, row.seconds);
        res.rows.push_back(row);
      }
    }
  }
  res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return res;
}

namespace {
struct Agg {
  double mean = 0, sd = 0, min = 0, max = 0;
  int n = 0;
};
Agg agg(const std::vector<double>& v) {
  Agg a;
  a.n = static_cast<int>(v.size());
  if (v.empty()) return a;
  a.min = *std::min_element(v.begin(), v.end());
  a.max = *std::max_element(v.begin(), v.end());
  for (double x : v) a.mean += x;
  a.mean /= v.size();
  for (double x : v) a.sd += (x - a.mean) * (x - a.mean);
  a.sd = v.size() > 1 ? std::sqrt(a.sd / (v.size() - 1)) : 0.0;
  return a;
}
}  // namespace

std::string StudyResult::markdown(const std::string& model_name) const {
  std::string s = fmt::format("# Calibration study: {}\n\n", model_name);
  s += fmt::format("Perplexity A: {}. Perplexity B: {}.\n\n", windows_label, second_half_label);
  s += fmt::format("fp32: A {:.3f} [95% {:.3f}, {:.3f}], B {:.3f}\n\n", fp_ppl_windows,
                   fp_ppl_ci.lo, fp_ppl_ci.hi, fp_ppl_second_half);
  s += "Intervals are 95% bootstrap intervals over the evaluation windows; the perplexity ratio's "
       "is paired (both models on the same resampled windows), so it is much narrower than the "
       "perplexities' own.\n\n";
  // method x calibration: mean +- sd over seeds (protocol A)
  std::vector<std::string> methods, calibs;
  for (const auto& r : rows) {
    if (std::find(methods.begin(), methods.end(), r.method) == methods.end())
      methods.push_back(r.method);
    if (std::find(calibs.begin(), calibs.end(), r.calib) == calibs.end()) calibs.push_back(r.calib);
  }
  s += "## Perplexity A (mean +- sd over seeds) per method x calibration set\n\n| method |";
  for (const auto& c : calibs) s += " " + c + " |";
  s += " spread (max-min over all) |\n|---|";
  for (std::size_t i = 0; i < calibs.size(); ++i) s += "---|";
  s += "---|\n";
  for (const auto& m : methods) {
    s += "| " + m + " |";
    std::vector<double> all;
    for (const auto& c : calibs) {
      std::vector<double> v;
      for (const auto& r : rows)
        if (r.method == m && r.calib == c) v.push_back(r.ppl_windows);
      all.insert(all.end(), v.begin(), v.end());
      if (v.empty()) {
        s += " |";
        continue;
      }
      auto a = agg(v);
      s += v.size() > 1 ? fmt::format(" {:.3f} +- {:.3f} |", a.mean, a.sd)
                        : fmt::format(" {:.3f} |", a.mean);
    }
    auto a = agg(all);
    s += fmt::format(" {:.3f} ({:+.2f}% vs fp32 at best, {:+.2f}% at worst) |\n", a.max - a.min,
                     100 * (a.min / fp_ppl_windows - 1), 100 * (a.max / fp_ppl_windows - 1));
  }
  s += "\n## Every run\n\n| method | calibration | seed | ppl A | ppl A / fp32 [95%] | ppl B | "
       "KL mean [95%] | top-1 agree [95%] | seconds |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows)
    s += fmt::format(
        "| {} | {} | {} | {:.3f} | {:.4f} [{:.4f}, {:.4f}] | {:.3f} | {:.5f} [{:.5f}, {:.5f}] | "
        "{:.4f} [{:.4f}, {:.4f}] | {:.1f} |\n",
        r.method, r.calib, r.seed, r.ppl_windows, r.ppl_windows / fp_ppl_windows, r.ppl_ratio_ci.lo,
        r.ppl_ratio_ci.hi, r.ppl_second_half, r.kl_mean, r.kl_ci.lo, r.kl_ci.hi, r.top1,
        r.top1_ci.lo, r.top1_ci.hi, r.seconds);
  s += "\n## Activation outliers per calibration set\n\n| calibration set | summary | largest "
       "channels (input of a linear) | largest block output |\n|---|---|---|---|\n";
  for (const auto& o : outliers_by_set) {
    const float rmax = o.residual_max.empty()
                           ? 0.0f
                           : *std::max_element(o.residual_max.begin(), o.residual_max.end());
    s += fmt::format("| {} | {} | {} | {:.1f} |\n", o.calib, o.summary, fmt::join(o.top, "; "),
                     rmax);
  }
  s += fmt::format("\nTotal time {:.1f} s.\n", seconds);
  return s;
}

std::string StudyResult::csv() const {
  std::string s =
      "method,calibration,seed,ppl_windows,ppl_second_half,kl_mean,top1_agreement,"
      "seconds,ppl_ratio_lo,ppl_ratio_hi,kl_lo,kl_hi,top1_lo,top1_hi\n";
  s +=
      fmt::format("fp32,-,-,{:.6f},{:.6f},0,1,0,1,1,0,0,1,1\n", fp_ppl_windows, fp_ppl_second_half);
  for (const auto& r : rows)
    s += fmt::format(
        "{},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.2f},{:.6f},{:.6f},{:.6g},{:.6g},"
        "{:.6f},{:.6f}\n",
        r.method, r.calib, r.seed, r.ppl_windows, r.ppl_second_half, r.kl_mean, r.top1, r.seconds,
        r.ppl_ratio_ci.lo, r.ppl_ratio_ci.hi, r.kl_ci.lo, r.kl_ci.hi, r.top1_ci.lo, r.top1_ci.hi);
  return s;
}

}  // namespace tessera::quant
