// Fuzz target: a cluster file of the planner (configs/clusters/*.toml, `tessera probe` output).
// A file that parses must write back (to_toml) to text that parses again.
#include "fuzz_util.hpp"
#include "tessera/perf/cluster.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tessera::fuzz::judge([&] {
    auto c = tessera::perf::parse_cluster(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.toml");
    tessera::perf::validate(c);
    (void)tessera::perf::parse_cluster(tessera::perf::to_toml(c), "fuzz.toml");
  });
}
