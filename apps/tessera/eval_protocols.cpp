#include "eval_protocols.hpp"

#include "model_paths.hpp"

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/quant/study.hpp"

namespace tessera::app {

EvaluatedModel load_evaluated(const std::filesystem::path& path, const std::string& kernels,
                              bool on_cpu) {
  EvaluatedModel m;
  if (on_cpu && kernels == "packed")
    m.any = quant::load_packed_or_dequantized(path, m.packed, m.note);
  else
    m.any = quant::load_any_model(path);
  return m;
}

eval::LogitsFn model_logits(const EvaluatedModel& m, const model::ParamLayout& layout) {
  if (!m.note.empty())
    std::fprintf(stderr, "note: evaluating the dequantized weights: %s\n", m.note.c_str());
  const float* params = m.any.model.params.data();
  if (!m.packed.linears.empty()) return m.packed.logits_fn(layout, params, m.any.act);
  return quant::logits_fn(layout, params, m.any.act);
}

namespace {

// The --reference model, which must have the evaluated model's shape.
quant::AnyModel load_reference(const std::string& path, const model::ModelConfig& cfg) {
  quant::AnyModel ref = quant::load_any_model(resolve_model_path(path));
  if (!(ref.model.config == cfg))
    throw Error(fmt::format("the reference model {} is {} but the evaluated model is {}", path,
                            model::describe(ref.model.config), model::describe(cfg)),
                "compare a quantized model with the model it was quantized from");
  return ref;
}

// One protocol's perplexity, into `out` under `key` and (without --json) as a line.
void report_perplexity(const eval::PplResult& r, const char* key, bool json, nlohmann::json& out) {
  out[key] = {{"perplexity", r.perplexity}, {"nll", r.nll},
              {"stderr", r.stderr_ppl},     {"ci95", {r.ppl_ci95.lo, r.ppl_ci95.hi}},
              {"scored", r.scored},         {"protocol", r.label}};
  if (!json)
    std::printf("perplexity %.4f +- %.4f [95%% %.4f, %.4f]  loss %.4f  (%s; %lld tokens scored)\n",
                r.perplexity, r.stderr_ppl, r.ppl_ci95.lo, r.ppl_ci95.hi, r.nll, r.label.c_str(),
                static_cast<long long>(r.scored));
}

// The KL divergence from the reference, into `out` and (without --json) as a line.
void report_kl(const eval::KlResult& kl, int ctx, bool json, nlohmann::json& out) {
  out["kl"] = {{"mean", kl.mean},
               {"median", kl.median},
               {"p90", kl.p90},
               {"p99", kl.p99},
               {"max", kl.max},
               {"mean_ci95", {kl.mean_ci95.lo, kl.mean_ci95.hi}},
               {"top1_agreement", kl.top1_agreement},
               {"top1_ci95", {kl.top1_ci95.lo, kl.top1_ci95.hi}},
               {"positions", kl.positions}};
  if (!json)
    std::printf(
        "KL(reference || model) mean %.5f [95%% %.5f, %.5f]  median %.5f  p90 %.5f  p99 %.5f  "
        "max %.4f  top-1 agreement %.4f [95%% %.4f, %.4f]  (%lld positions, windows of %d; "
        "intervals: bootstrap over windows)\n",
        kl.mean, kl.mean_ci95.lo, kl.mean_ci95.hi, kl.median, kl.p90, kl.p99, kl.max,
        kl.top1_agreement, kl.top1_ci95.lo, kl.top1_ci95.hi, static_cast<long long>(kl.positions),
        ctx);
}

}  // namespace

void eval_protocols(const EvaluatedModel& em, const ProtocolEvalArgs& a) {
  const quant::AnyModel& m = em.any;
  const auto& cfg = m.model.config;
  const int ctx = a.seq > 0 ? a.seq : default_eval_window(cfg), V = cfg.vocab_size,
            Vp = cfg.padded_vocab();
  if (ctx > cfg.block_size)
    throw Error(fmt::format("--seq {} exceeds the model's block_size {}", ctx, cfg.block_size));
  std::string proto = a.protocol.empty() ? "both" : a.protocol;
  if (proto != "windows" && proto != "llama" && proto != "both")
    throw Error(fmt::format("unknown --protocol '{}'", proto), "use windows, llama or both");
  if (proto != "windows") eval::check_scores_something(eval::PplProtocol::SecondHalf, ctx);
  model::ParamLayout layout(cfg);
  auto toks =
      quant::read_tokens(a.data, a.windows > 0 ? static_cast<std::size_t>(a.windows) * ctx : 0, V);
  quant::AnyModel ref;
  if (!a.reference.empty()) ref = load_reference(a.reference, cfg);
  auto fn = model_logits(em, layout);
  nlohmann::json out{{"model", m.description.empty() ? "fp32" : m.description}};
  if (!a.json) std::printf("model: %s\n", m.description.empty() ? "fp32" : m.description.c_str());
  for (auto p : {eval::PplProtocol::Windows, eval::PplProtocol::SecondHalf}) {
    if (p == eval::PplProtocol::Windows && proto == "llama") continue;
    if (p == eval::PplProtocol::SecondHalf && proto == "windows") continue;
    auto r = eval::perplexity(fn, toks, ctx, V, Vp, p, a.windows, a.batch);
    report_perplexity(r, p == eval::PplProtocol::Windows ? "windows" : "llama", a.json, out);
  }
  if (!a.reference.empty()) {
    auto rf = quant::logits_fn(layout, ref.model.params.data(), ref.act);
    report_kl(eval::kl_divergence(rf, fn, toks, ctx, V, Vp, a.windows, a.batch), ctx, a.json, out);
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
}

}  // namespace tessera::app
