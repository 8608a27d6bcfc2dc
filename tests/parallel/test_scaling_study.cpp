// tessera study scaling, cut down to 1 and 2 ranks of data parallelism and one published cluster:
// every measured point has a measurement, a prediction and an efficiency in the report, the
// published cluster has its curves, and the figures are written.
#include <gtest/gtest.h>

#include <string>

#include "run_util.hpp"

using namespace tessera::test;

TEST(ScalingStudy, MeasuresPredictsAndSimulates) {
  if (!have_tokenizer()) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)";
  const auto data = data_dir();
  const auto out = scratch("scaling");
  const std::string launcher = std::string(k_env) + "'" TESSERA_MPIEXEC "' -n {ranks}";
  auto r = sh("'" TESSERA_BIN
              "' study scaling --ranks 1,2 --grids dp --steps 3 --clusters "
              "dgx-h100 --model gpt2-124m --max-devices 32 --data " +
              (data / "train.bin").string() + " --out " + out.string() + " --launcher \"" +
              launcher + "\"");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string md = slurp(out / "scaling.md");
  // weak and strong: the 1-rank baseline (efficiency 1) and dp at 2 ranks, each with a
  // prediction (the model error column is filled) and the published cluster's rows
  EXPECT_NE(md.find("| any | 1 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| dp | 2 | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| dp | 2 | 8 |"), std::string::npos) << md;
  EXPECT_EQ(md.find("| 0 |"), std::string::npos) << "a point without a prediction\n" << md;
  EXPECT_NE(md.find("| dgx-h100 | 32 |"), std::string::npos) << md;
  for (const char* f : {"measured.png", "measured.svg", "published.png", "published.svg"})
    EXPECT_GT(fs::file_size(out / f), 1000u) << f;
}
