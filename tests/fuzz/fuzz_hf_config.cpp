// Fuzz target: a model's config.json (beside model.safetensors or embedded in its metadata).
#include "fuzz_util.hpp"
#include "tessera/io/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tessera::fuzz::judge([&] {
    auto cfg = tessera::io::parse_hf_config(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
    tessera::fuzz::require(cfg.n_layer > 0 && cfg.n_head > 0 && cfg.n_embd > 0, "positive shape");
  });
}
