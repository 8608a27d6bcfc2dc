// Fuzz target: a model shape file of the planner (configs/models/*.toml).
#include "fuzz_util.hpp"
#include "tessera/perf/model_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tessera::fuzz::judge([&] {
    auto spec = tessera::perf::parse_model_spec(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.toml");
    tessera::fuzz::require(tessera::perf::parameter_count(spec.cfg) > 0, "positive size");
  });
}
