// tessera eval --model DIR --data SHARD [--batch B] [--seq T] [--batches N]
#include <cstdio>

#include "commands.hpp"
#include "tessera/core/error.hpp"
#include "tessera/eval/evaluate.hpp"
#include "tessera/io/checkpoint.hpp"

namespace tessera::app {

std::filesystem::path resolve_model_path(const std::filesystem::path& p);

void add_eval_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("eval", "loss and perplexity of a model on a token shard");
  struct Args {
    std::string model;
    std::string data = "data/brown/val.bin";
    int batch = 4;
    int seq = 0;
    int batches = 0;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model,
                  "run directory, checkpoint directory, or model.safetensors")
      ->required();
  cmd->add_option("--data,-d", a->data, "token shard (from tessera prepare)")
      ->capture_default_str();
  cmd->add_option("--batch,-b", a->batch, "sequences per forward pass")->capture_default_str();
  cmd->add_option("--seq", a->seq, "tokens per sequence (0 = the model's block_size)")
      ->capture_default_str();
  cmd->add_option("--batches", a->batches, "windows to score (0 = the whole shard)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "print the result as JSON");
  cmd->callback([a] {
    if (a->batch <= 0) throw Error("--batch must be positive");
    if (a->seq < 0 || a->batches < 0) throw Error("--seq and --batches must be >= 0");
    auto loaded = io::load_model(resolve_model_path(a->model));
    model::ParamLayout layout(loaded.config);
    int T = a->seq > 0 ? a->seq : loaded.config.block_size;
    if (T > loaded.config.block_size)
      throw Error(
          fmt::format("--seq {} exceeds the model's block_size {}", T, loaded.config.block_size));
    model::Activations acts;
    auto r = eval::evaluate_shard(layout, loaded.params.data(), acts, a->data, a->batch, T,
                                  a->batches, kernels::GemmLibrary::OneDnn, true);
    if (a->json)
      std::printf(
          "{\"loss\": %.6f, \"perplexity\": %.4f, \"tokens\": %lld, \"protocol\": "
          "\"non-overlapping windows of %d, every token scored\"}\n",
          r.loss, r.perplexity, static_cast<long long>(r.tokens), T);
    else
      std::printf(
          "loss %.4f  perplexity %.2f  (%lld tokens; non-overlapping windows of %d, every token "
          "scored)\n",
          r.loss, r.perplexity, static_cast<long long>(r.tokens), T);
  });
}

}  // namespace tessera::app
