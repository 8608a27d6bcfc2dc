// The strict TOML reader (core/toml_reader.hpp) that run configs, cluster files and model files
// are read with: syntax errors with a position, typed getters that say where a value is wrong,
// unknown keys with the closest valid one as a hint.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/toml_reader.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/perf/model_spec.hpp"

using tessera::Error;
using tessera::TomlReader;

namespace {

// The error `f` throws (message and hint); fails the test when it throws none.
template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a tessera::Error";
  return Error("");
}

const std::vector<std::string> k_device_keys = {"name", "memory_gib", "memory_bw_gbps"};

}  // namespace

TEST(TomlReader, UnknownKeyNamesTheLineAndTheClosestKey) {
  TomlReader r("[device]\nname = \"d\"\nmemory_gb = 16\n", "c.toml", "see the docs");
  const toml::table* dev = r.table("device", true);
  Error e = error_of([&] { r.only_keys(dev, "device", k_device_keys); });
  EXPECT_STREQ(e.what(), "unknown key 'device.memory_gb' in c.toml (line 3)");
  EXPECT_EQ(e.hint(),
            "did you mean 'device.memory_gib'? valid keys in [device]: name, memory_gib, "
            "memory_bw_gbps");
  // At the root, and a key too far from every valid one lists them without a guess.
  TomlReader root("name = \"x\"\nxyzzy_plugh = 1\n", "m.toml", "");
  e = error_of([&] { root.only_keys(root.table("", true), "", {"name", "n_layer"}); });
  EXPECT_STREQ(e.what(), "unknown key 'xyzzy_plugh' in m.toml (line 2)");
  EXPECT_EQ(e.hint(), "valid keys: name, n_layer");
  EXPECT_NO_THROW(r.only_keys(r.table("gemm", false), "gemm", {}));  // absent optional table
}

TEST(TomlReader, WrongTypesSayWhatWasExpectedAndWhatWasThere) {
  TomlReader r("[device]\nmemory_gib = \"lots\"\nn = 1.5\nbig = 3000000000\nflag = 1\nbw = 900\n",
               "c.toml", "see the docs");
  const toml::table* dev = r.table("device", true);
  Error e = error_of([&] { r.number(dev, "device", "memory_gib", true); });
  EXPECT_STREQ(e.what(),
               "wrong type for 'device.memory_gib' in c.toml (line 2): must be a number, got "
               "string \"lots\"");
  EXPECT_EQ(e.hint(), "see the docs");
  EXPECT_NE(std::string(error_of([&] { r.integer(dev, "device", "n", true); }).what())
                .find("'device.n' in c.toml (line 3): must be an integer, got float 1.5"),
            std::string::npos);
  EXPECT_NE(std::string(error_of([&] { r.integer(dev, "device", "big", true); }).what())
                .find("value 3000000000 for 'device.big' in c.toml (line 4) is out of range"),
            std::string::npos);
  EXPECT_NE(std::string(error_of([&] { r.boolean(dev, "device", "flag", true); }).what())
                .find("must be true or false, got integer 1"),
            std::string::npos);
  EXPECT_NE(std::string(error_of([&] { r.string(dev, "device", "bw", true); }).what())
                .find("must be a string, got integer 900"),
            std::string::npos);
  EXPECT_EQ(r.number(dev, "device", "bw", true), 900.0);  // an integer is a number
  EXPECT_EQ(r.number(dev, "device", "absent", false, 2.5), 2.5);
  // inf and nan are TOML floats, but no number a file gives may be either
  TomlReader odd("[device]\npeak = inf\nbw = -inf\nlat = nan\n", "c.toml", "see the docs");
  const toml::table* odd_dev = odd.table("device", true);
  e = error_of([&] { odd.number(odd_dev, "device", "peak", true); });
  EXPECT_STREQ(e.what(), "'device.peak' in c.toml (line 2) must be a finite number, got float inf");
  EXPECT_EQ(e.hint(), "see the docs");
  EXPECT_NE(std::string(error_of([&] { odd.number(odd_dev, "device", "bw", true); }).what())
                .find("got float -inf"),
            std::string::npos);
  EXPECT_NE(std::string(error_of([&] { odd.number(odd_dev, "device", "lat", true); }).what())
                .find("must be a finite number, got float nan"),
            std::string::npos);
  EXPECT_STREQ(error_of([&] { r.string(dev, "device", "name", true); }).what(),
               "missing key 'device.name' in c.toml");
  EXPECT_STREQ(error_of([&] { r.table("node", true); }).what(), "c.toml: [node]: section missing");
  TomlReader flat("device = 3\n", "c.toml", "");
  EXPECT_NE(std::string(error_of([&] { flat.table("device", true); }).what())
                .find("wrong type for 'device' in c.toml (line 1): must be a table ([device])"),
            std::string::npos);
}

TEST(TomlReader, SyntaxErrorNamesFileLineAndColumn) {
  Error e = error_of([] { TomlReader("a = 1\nb = = 2\n", "x.toml", "the hint"); });
  EXPECT_TRUE(std::regex_search(e.what(), std::regex("^x\\.toml:2:[0-9]+: TOML syntax error: ")))
      << e.what();
  EXPECT_EQ(e.hint(), "the hint");
}

TEST(TomlReader, ClusterAndModelFilesSuggestTheClosestKey) {
  Error e = error_of([] {
    tessera::perf::parse_model_spec("name = 'x'\nn_layers = 2\nn_head = 2\nn_embd = 64\n", "m");
  });
  EXPECT_STREQ(e.what(), "unknown key 'n_layers' in m (line 2)");
  EXPECT_NE(e.hint().find("did you mean 'n_layer'?"), std::string::npos) << e.hint();
  e = error_of([] {
    tessera::perf::parse_cluster(
        "name = 'c'\n[device]\nname = 'd'\nmemory_gib = 1.0\nmemory_bw_gbps = 1.0\n"
        "peak_tflop_bf16 = 1.0\n[node]\ndevices = 1\n",
        "c.toml");
  });
  EXPECT_STREQ(e.what(), "unknown key 'device.peak_tflop_bf16' in c.toml (line 6)");
  EXPECT_NE(e.hint().find("did you mean 'device.peak_tflops_bf16'?"), std::string::npos)
      << e.hint();
}
