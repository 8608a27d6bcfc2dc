// tessera convert: a model in any form tessera reads (a checkpoint or run directory, a
// model.safetensors, a llama .gguf file, a short name) written as a Hugging Face checkpoint:
// config.json and model.safetensors (fp32, bf16 or fp16), ready for transformers'
// from_pretrained.
#include <filesystem>
#include <memory>
#include <string>

#include "commands.hpp"
#include "model_paths.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/io/checkpoint.hpp"

namespace tessera::app {

void add_convert_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "convert", "write a model (checkpoint, .gguf, short name) as a Hugging Face checkpoint");
  struct Args {
    std::string model, out, dtype = "fp32";
    bool overwrite = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model,-m", a->model,
                  "run directory, checkpoint directory, model.safetensors, a llama .gguf file, "
                  "or a pretrained model's short name (smollm2-135m)")
      ->required();
  cmd->add_option("--out,-o", a->out, "the folder to write config.json and model.safetensors to")
      ->required();
  cmd->add_option("--dtype", a->dtype, "the weights' type in the file: fp32, bf16 or fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_flag("--overwrite", a->overwrite, "replace a model already in --out");
  cmd->callback([a] {
    const std::filesystem::path out = a->out;
    if (std::filesystem::exists(out / "model.safetensors") && !a->overwrite)
      throw Error(fmt::format("{} already holds a model", out.string()),
                  "choose another --out, or add --overwrite");
    const auto loaded = io::load_model(resolve_model_path(a->model));
    const model::ParamLayout layout(loaded.config);
    const io::DType dtype = a->dtype == "bf16"   ? io::DType::BF16
                            : a->dtype == "fp16" ? io::DType::F16
                                                 : io::DType::F32;
    io::save_model(out, layout, loaded.params.data(), dtype);
    log_info("wrote {} ({}): config.json, model.safetensors ({})", out.string(),
             model::describe(loaded.config), a->dtype);
  });
}

}  // namespace tessera::app
