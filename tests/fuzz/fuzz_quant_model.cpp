// Fuzz target: a quantized model file from `tessera quantize` (safetensors with integer codes and
// quantization metadata). Any bytes: the file is loaded as `tessera eval` and `tessera sample`
// load it (every linear's and the embedding's codes, scales, zeros and groups checked against
// the metadata and the model's shape), then packed for the decoder, or refused with one error.
// Only models of modest size are loaded (the fuzzer's memory limit); the model's shape comes from
// the file's own metadata.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_util.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/quantize.hpp"
#include "tessera/quant/runner.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fs = std::filesystem;
  using namespace tessera;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  return fuzz::judge([&] {
    const auto st = io::SafetensorsFile::from_bytes(bytes, "fuzz.safetensors");
    const fs::path dir =
        fs::temp_directory_path() / ("tessera_fuzz_quant_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    struct Remove {  // the file goes whatever the outcome
      fs::path dir;
      ~Remove() {
        std::error_code ec;
        fs::remove_all(dir, ec);
      }
    } remove{dir};
    const auto cfg = io::model_config_of(st, dir / "config.json");  // none there: the metadata's
    if (model::param_count(cfg) > 1e6) return;
    {
      std::ofstream out(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    const quant::AnyModel any = quant::load_any_model(dir / "model.safetensors");
    if (!any.quantized) return;
    fuzz::require(any.model.config == cfg, "the loaded model has the file's configuration");
    fuzz::require(any.linears.size() == static_cast<std::size_t>(cfg.n_layer) * quant::k_num_lin,
                  "every block linear loaded");
    const quant::PackedModel pm = quant::pack_model(any);  // packs, or refuses with an Error
    fuzz::require(pm.linears.size() == any.linears.size(), "every linear packed");
  });
}
