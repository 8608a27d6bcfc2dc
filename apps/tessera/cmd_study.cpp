// tessera study calibration --model M [--quick | --full] [--methods ...] [--calib ...]
//                           [--seeds N] [--text NAME=PATH ...] [--windows N] [--long-windows N]
//                           [--long METHODS] [--plant L:C:F] [--kernels fp32|packed] [--out DIR]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <fmt/format.h>

#include "commands.hpp"
#include "model_paths.hpp"
#include "option_checks.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/io/pretrained.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/quant/quantize.hpp"
#include "tessera/quant/study.hpp"

namespace tessera::app {

namespace {
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}
struct StudyArgs {
  std::string model, methods, calibs, first_only, long_methods, out = "study", calib_data;
  std::vector<std::string> texts;
  std::string tokenizer, lang2_text, domain_text, plant;
  int seeds = 1, nsamples = 16, seqlen = 0, windows = 4, long_windows = 98, bits = 4, group = 128;
  int ctx = 0;
  double alpha = 0.5;
  bool quick = false, full = false, verbose = false;
  std::string kernels = "fp32";
};

const char* k_default_methods =
    "rtn,gptq,awq,smoothquant,w8a8,llm-int8,rtn:w3,gptq:w3,awq:w3,rtn:w4g32min";

// --quick and --full fill what was not given; then the defaults.
void apply_presets(StudyArgs& a) {
  if (a.quick && a.full) throw Error("--quick and --full exclude each other");
  auto unless = [](std::string& v, const char* d) {
    if (v.empty()) v = d;
  };
  if (a.quick) {
    unless(a.methods, "rtn,gptq,awq,smoothquant,w8a8,gptq:w3");
    unless(a.calibs, "corpus,random");
    unless(a.first_only, "awq,gptq:w3");
    a.windows = std::min(a.windows, 2);
    a.long_windows = 0;
    a.nsamples = std::min(a.nsamples, 8);
    if (a.seqlen == 0) a.seqlen = 128;
  }
  if (a.full) {
    unless(a.methods, k_default_methods);
    unless(a.long_methods, k_default_methods);
    unless(a.first_only, "-");
    a.seeds = std::max(a.seeds, 3);
  }
  unless(a.methods, k_default_methods);
  unless(a.calibs, "corpus,random,punct,lang2,code");
  unless(a.first_only, "gptq:w3,awq:w3");
  if (a.long_methods.empty()) {  // the default: those of gptq and smoothquant that run
    const auto methods = split_list(a.methods);
    for (const char* m : {"gptq", "smoothquant"})
      if (!a.quick && std::find(methods.begin(), methods.end(), m) != methods.end())
        a.long_methods += std::string(a.long_methods.empty() ? "" : ",") + m;
    unless(a.long_methods, "-");
  }
}

// The study's evaluation texts and calibration shard: given, or Brown's shards made with the
// model's tokenizer (data/brown for GPT-2 models) and the English manual pages.
void default_data(StudyArgs& a) {
  const auto shards = io::pretrained_brown_shards(a.model);
  const std::filesystem::path dir = shards.empty() ? "data/brown" : shards;
  if (a.calib_data.empty()) a.calib_data = (dir / "train.bin").string();
  if (a.texts.empty())
    a.texts = {"brown=" + (dir / "val.bin").string(), "manpages=data/eval/manpages-en.txt"};
}

quant::StudyOptions study_options(const StudyArgs& a) {
  quant::StudyOptions so;
  auto list = [](const std::string& s) {
    return s == "-" ? std::vector<std::string>{} : split_list(s);
  };
  so.methods = list(a.methods);
  so.calibs = list(a.calibs);
  so.first_calib_only = list(a.first_only);
  so.long_methods = list(a.long_methods);
  if (a.long_windows == 0) so.long_methods.clear();
  so.long_windows = so.long_methods.empty() ? 0 : a.long_windows;  // nothing to score long
  so.seeds = a.seeds;
  if (a.nsamples < 1) throw Error("--nsamples must be >= 1", "the calibration set is empty");
  so.nsamples = a.nsamples;
  so.seqlen = a.seqlen;
  so.windows = a.windows;
  if (a.ctx < 0) throw Error(fmt::format("--ctx must be >= 0, got {}", a.ctx));
  so.ctx = a.ctx;
  so.texts.clear();
  for (const auto& t : a.texts) so.texts.push_back(quant::parse_eval_text(t));
  so.base.wq = quant::WeightQuant{a.bits, a.group, false};
  quant::validate(so.base.wq);
  if (!(a.alpha >= 0 && a.alpha <= 1))  // NaN fails too
    throw Error(fmt::format("--alpha must be in [0, 1], got {}", a.alpha));
  so.base.alpha = static_cast<float>(a.alpha);
  so.sources.train_shard = a.calib_data;
  so.sources.tokenizer = resolve_tokenizer_path(a.tokenizer, a.model);
  if (!a.lang2_text.empty()) so.sources.lang2_text = a.lang2_text;
  if (!a.domain_text.empty()) so.sources.domain_text = a.domain_text;
  if (const auto bos = io::load_tokenizer(so.sources.tokenizer).bos_id())
    so.bos = static_cast<std::int32_t>(*bos);
  so.verbose = a.verbose;
  so.packed_kernels = a.kernels == "packed";
  return so;
}

// "L:C:F" -> plant_outlier(layer L, channel C, factor F)
void plant(const std::string& spec, const model::ParamLayout& layout, float* params) {
  int l = 0, c = 0;
  double f = 0;
  char tail = 0;
  if (std::sscanf(spec.c_str(), "%d:%d:%lf%c", &l, &c, &f, &tail) != 3)
    throw Error(fmt::format("--plant '{}' is not LAYER:CHANNEL:FACTOR", spec), "e.g. 1:37:100");
  quant::plant_outlier(layout, params, l, c, static_cast<float>(f));
}

void run_calibration_study(StudyArgs a) {
  namespace fs = std::filesystem;
  apply_presets(a);
  default_data(a);
  const auto so = study_options(a);
  prepare_output_dir(a.out, "--out");  // before the study's hours, not after them
  auto path = resolve_model_path(a.model);
  auto any = quant::load_any_model(path);
  if (any.quantized)
    throw Error(fmt::format("{} is already quantized", path.string()),
                "run the study on the fp32 model");
  model::ParamLayout layout(any.model.config);
  if (!a.plant.empty()) plant(a.plant, layout, any.model.params.data());
  auto res = quant::run_study(layout, any.model.params.data(), so);
  res.model_name = path.string() + " (" + model::describe(any.model.config) + ")" +
                   (a.plant.empty() ? "" : ", outlier planted at " + a.plant);
  const auto md = res.markdown();
  write_file_atomic(fs::path(a.out) / "study.md", md);
  write_file_atomic(fs::path(a.out) / "study.csv", res.csv());
  write_file_atomic(fs::path(a.out) / "outliers.json", res.outliers.dump(2) + "\n");
  const auto charts = quant::study_charts(res);
  if (!charts.empty())
    plot::draw(charts, fs::path(a.out) / "study.svg",
               {900, 450 * static_cast<int>(charts.size()), 1});
  std::fputs(md.c_str(), stdout);
  std::printf("wrote study.md, study.csv, study.svg and outliers.json in %s\n", a.out.c_str());
}

void add_calibration_options(CLI::App& cmd, StudyArgs& a) {
  cmd.add_option("--model,-m", a.model, "model directory, .safetensors, .gguf or short name")
      ->required();
  cmd.add_flag("--quick", a.quick,
               "a few minutes: 2 calibration sets, 1 seed, 2 windows per text, no long evaluation");
  cmd.add_flag("--full", a.full,
               "every method on the long windows, 3 seeds, W3 with every calibration set (hours)");
  cmd.add_option(
      "--methods", a.methods,
      std::string("comma-separated: rtn gptq awq smoothquant w8a8 llm-int8, each "
                  "optionally with its weight format (gptq:w3, rtn:w4g32min); default ") +
          k_default_methods);
  cmd.add_option("--calib", a.calibs,
                 "comma-separated: corpus corpus-concat random punct domain lang2 code (default "
                 "corpus,random,punct,lang2,code)");
  cmd.add_option("--first-calib-only", a.first_only,
                 "methods run with the first calibration set only, seed 0 (default gptq:w3,awq:w3; "
                 "- for none)");
  cmd.add_option("--seeds", a.seeds, "calibration seeds per set")->capture_default_str();
  cmd.add_option("--nsamples", a.nsamples, "calibration samples")->capture_default_str();
  cmd.add_option("--seqlen", a.seqlen, "tokens per sample (0 = min(block_size, 256))")
      ->check(at_least(0))
      ->capture_default_str();
  cmd.add_option("--text,--data,-d", a.texts,
                 "evaluation text NAME=PATH (a token shard .bin or a text file), repeatable "
                 "(default Brown's validation shard and data/eval/manpages-en.txt)");
  cmd.add_option("--windows", a.windows, "short windows per text: every run is scored on them")
      ->capture_default_str();
  cmd.add_option("--long-windows", a.long_windows,
                 "long windows per text (0 = none): fp32 and the --long methods")
      ->check(at_least(0))
      ->capture_default_str();
  cmd.add_option("--long", a.long_methods,
                 "methods whose first run is also scored on the long windows (default "
                 "gptq,smoothquant; - for none)");
  cmd.add_option("--ctx", a.ctx, "window length (0 = min(block_size, 512))")
      ->check(at_least(0))
      ->capture_default_str();
  cmd.add_option("--bits", a.bits, "weight bits of gptq/awq/rtn")->capture_default_str();
  cmd.add_option("--group", a.group, "group size of gptq/awq/rtn")->capture_default_str();
  cmd.add_option("--alpha", a.alpha, "SmoothQuant migration strength")->capture_default_str();
  cmd.add_option("--calib-data", a.calib_data,
                 "token shard for corpus sets (default: the train shard beside the Brown text)");
  cmd.add_option("--lang2-text", a.lang2_text, "non-English text (default data/lang2/de.txt)");
  cmd.add_option("--domain-text", a.domain_text, "other-domain text (default GPL-3 text)");
  cmd.add_option("--tokenizer", a.tokenizer,
                 "tokenizer of the texts: a .gguf, a tokenizer.json or a directory (default: the "
                 "model's own, else GPT-2's)");
  cmd.add_option("--plant", a.plant,
                 "LAYER:CHANNEL:FACTOR: first plant an outlier channel (function-preserving)");
  cmd.add_option("--out,-o", a.out, "folder for study.md, study.csv, study.svg and outliers.json")
      ->capture_default_str();
  cmd.add_option("--kernels", a.kernels,
                 "fp32: score the quantized models as their dequantized weights (fast); packed: "
                 "through the packed kernels (what sample and eval run), except per-tensor and "
                 "LLM.int8() activation quantization")
      ->check(CLI::IsMember({"fp32", "packed"}))
      ->capture_default_str();
  cmd.add_flag("--verbose,-v", a.verbose, "more detail");
}

}  // namespace

void add_study_command(CLI::App& root) {
  auto* study = root.add_subcommand(
      "study",
      "experiments: calibration sets x quantization methods; memorization and the Goldfish loss; "
      "weak and strong scaling");
  study->require_subcommand(1);
  add_study_memorization_command(*study);  // cmd_study_memorization.cpp
  add_study_scaling_command(*study);       // cmd_study_scaling.cpp
  auto* cmd = study->add_subcommand(
      "calibration",
      "quantization methods x calibration sets x seeds on a pretrained model: perplexity (two "
      "protocols), KL divergence and top-1 agreement with 95% intervals, and activation outliers "
      "per calibration set (Markdown, CSV, SVG)");
  auto a = std::make_shared<StudyArgs>();
  add_calibration_options(*cmd, *a);
  cmd->callback([a] { run_calibration_study(*a); });
}

}  // namespace tessera::app
