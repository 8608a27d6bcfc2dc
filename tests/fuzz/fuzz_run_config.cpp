// Fuzz target: a run config (TOML) and its --set overrides. The input is the TOML text, then
// NUL-separated "section.key=value" overrides. A config that parses must write back (to_toml)
// to text that parses to an equal config.
#include "fuzz_util.hpp"
#include "tessera/train/run_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera::train;
  auto parts = tessera::fuzz::split_nul(data, size);
  const std::string toml = parts.front();
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  return tessera::fuzz::judge([&] {
    const RunConfig cfg = parse_run_config(toml, "fuzz.toml", overrides);
    const RunConfig back = parse_run_config(to_toml(cfg), "fuzz.toml");
    tessera::fuzz::require(back.model == cfg.model && back.train == cfg.train &&
                               back.parallel == cfg.parallel && back.data == cfg.data,
                           "to_toml round trip");
  });
}
