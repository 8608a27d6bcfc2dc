// tessera study calibration --model M --methods gptq,awq,smoothquant,w8a8
//                           --calib corpus,random,punct,lang2 --seeds 3 [--out DIR]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <fmt/format.h>

#include "commands.hpp"
#include "model_paths.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
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
}  // namespace

void add_study_command(CLI::App& root) {
  auto* study = root.add_subcommand(
      "study",
      "experiments: calibration sets x quantization methods; memorization and the Goldfish loss; "
      "weak and strong scaling");
  study->require_subcommand(1);
  add_study_memorization_command(*study);  // cmd_study_memorization.cpp
  add_study_scaling_command(*study);       // cmd_study_scaling.cpp
  auto* cmd =
      study->add_subcommand("calibration",
                            "perplexity per quantization method x calibration set x seed, with the "
                            "spread per method and the outlier summary (Markdown + CSV)");
  struct Args {
    std::string model, methods = "gptq,awq,smoothquant,w8a8", calibs = "corpus,random,punct,lang2";
    std::string out = "study", data = "data/brown/val.bin", calib_data = "data/brown/train.bin";
    std::string tokenizer, lang2_text, domain_text;
    int seeds = 3, nsamples = 32, seqlen = 0, windows = 32, bits = 4, group = 128, ctx = 0;
    double alpha = 0.5;
    bool verbose = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model, "model directory or .safetensors")->required();
  cmd->add_option("--methods", a->methods,
                  "comma-separated: rtn gptq awq smoothquant w8a8 llm-int8, each optionally with "
                  "its weight format (gptq:w3, rtn:w4g32, awq:w4g128sym)")
      ->capture_default_str();
  cmd->add_option("--calib", a->calibs,
                  "comma-separated: corpus corpus-concat random punct domain lang2 code")
      ->capture_default_str();
  cmd->add_option("--seeds", a->seeds, "calibration seeds per set")->capture_default_str();
  cmd->add_option("--nsamples", a->nsamples, "calibration samples")->capture_default_str();
  cmd->add_option("--seqlen", a->seqlen, "tokens per sample (0 = min(block_size, 512))")
      ->capture_default_str();
  cmd->add_option("--data,-d", a->data, "evaluation token shard")->capture_default_str();
  cmd->add_option("--windows", a->windows, "evaluation windows of --ctx tokens")
      ->capture_default_str();
  cmd->add_option("--ctx", a->ctx, "evaluation context (0 = min(block_size, 1024))")
      ->capture_default_str();
  cmd->add_option("--bits", a->bits, "weight bits of gptq/awq/rtn")->capture_default_str();
  cmd->add_option("--group", a->group, "group size of gptq/awq/rtn")->capture_default_str();
  cmd->add_option("--alpha", a->alpha, "SmoothQuant migration strength")->capture_default_str();
  cmd->add_option("--calib-data", a->calib_data, "token shard for corpus sets")
      ->capture_default_str();
  cmd->add_option("--lang2-text", a->lang2_text, "non-English text (default data/lang2/de.txt)");
  cmd->add_option("--domain-text", a->domain_text, "other-domain text (default GPL-3 text)");
  cmd->add_option("--tokenizer", a->tokenizer,
                  "tokenizer of the calibration text: a .gguf, a tokenizer.json or a directory "
                  "(default: the model's own, else GPT-2's)");
  cmd->add_option("--out,-o", a->out, "folder for study.md, study.csv, study.svg and outliers.json")
      ->capture_default_str();
  cmd->add_flag("--verbose,-v", a->verbose, "a line per run");
  cmd->callback([a] {
    namespace fs = std::filesystem;
    quant::StudyOptions so;
    so.methods = split_list(a->methods);
    so.calibs = split_list(a->calibs);
    so.seeds = a->seeds;
    if (a->nsamples < 1) throw Error("--nsamples must be >= 1", "the calibration set is empty");
    if (a->windows < 1) throw Error("--windows must be >= 1");
    so.nsamples = a->nsamples;
    so.seqlen = a->seqlen;
    so.eval_windows = a->windows;
    if (a->ctx < 0) throw Error(fmt::format("--ctx must be >= 0, got {}", a->ctx));
    so.ctx = a->ctx;
    so.eval_shard = a->data;
    so.base.wq = quant::WeightQuant{a->bits, a->group, false};
    quant::validate(so.base.wq);
    if (!(a->alpha >= 0 && a->alpha <= 1))  // NaN fails too
      throw Error(fmt::format("--alpha must be in [0, 1], got {}", a->alpha));
    so.base.alpha = static_cast<float>(a->alpha);
    so.sources.train_shard = a->calib_data;
    so.sources.tokenizer = resolve_tokenizer_path(a->tokenizer, a->model);
    if (!a->lang2_text.empty()) so.sources.lang2_text = a->lang2_text;
    if (!a->domain_text.empty()) so.sources.domain_text = a->domain_text;
    so.verbose = a->verbose;
    auto path = resolve_model_path(a->model);
    auto any = quant::load_any_model(path);
    if (any.quantized)
      throw Error(fmt::format("{} is already quantized", path.string()),
                  "run the study on the fp32 model");
    model::ParamLayout layout(any.model.config);
    auto res = quant::run_study(layout, any.model.params.data(), so);
    auto md = res.markdown(path.string() + " (" + model::describe(any.model.config) + ")");
    fs::create_directories(a->out);
    write_file_atomic(fs::path(a->out) / "study.md", md);
    write_file_atomic(fs::path(a->out) / "study.csv", res.csv());
    write_file_atomic(fs::path(a->out) / "outliers.json", res.outliers.dump(2) + "\n");
    const auto charts = quant::study_charts(res);
    if (!charts.empty())
      plot::draw(charts, fs::path(a->out) / "study.svg",
                 {900, 450 * static_cast<int>(charts.size()), 1});
    std::fputs(md.c_str(), stdout);
    std::printf("wrote study.md, study.csv, study.svg and outliers.json in %s\n", a->out.c_str());
  });
}

}  // namespace tessera::app
