// The trainer with hardware.device = "cuda": the same run on the CPU and on the GPU (fp32 and
// bf16), and checkpoints that move between the two.
//
// Bounds: fp32 on the GPU reorders sums (and its embedding / LayerNorm gradients use atomics):
// 20 steps of AdamW stay within 1e-5 relative of the CPU losses (measured ~1e-7). bf16: within
// 8 u16 = 3.1e-2 relative per step, the bf16 forward's bound (tests/gpu/test_gpu_model.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "../scratch_dir.hpp"
#include "../unit/token_shards.hpp"
#include "gpu_test_util.hpp"
#include "tessera/comm/runtime.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/train/run_config.hpp"
#include "tessera/train/trainer.hpp"

namespace {

using namespace gpu_test;
using namespace tessera;
namespace fs = std::filesystem;

constexpr double k_u16 = 0x1p-8;

fs::path make_data(const std::string& name) {
  return tessera::test_data::write_structured_shards(tessera::test::scratch_path("gpu_train") /
                                                     name);
}

train::RunConfig config(const fs::path& data, const std::string& device,
                        const std::string& precision, const std::string& out) {
  const std::string toml =
      "[model]\nn_layer = 2\nn_head = 2\nn_embd = 64\nblock_size = 64\n"
      "vocab_size = 500\n"
      "[data]\ntrain = \"" +
      (data / "train.bin").string() + "\"\nval = \"" + (data / "val.bin").string() +
      "\"\n"
      "[train]\nbatch_size = 4\nseq_len = 64\ngrad_accum = 2\nsteps = 20\n"
      "lr = 1e-3\nwarmup_steps = 5\nval_every = 10\nval_batches = 4\n"
      "log_every = 100\nout_dir = \"" +
      out + "\"\nprecision = \"" + precision + "\"\n[sample]\ntokens = 0\n[hardware]\ndevice = \"" +
      device + "\"\npeak_tflops = 1\n";
  return train::parse_run_config(toml, "test", {});
}

train::TrainSummary train_run(const train::RunConfig& cfg, bool resume = false,
                              std::int64_t stop_at = 0) {
  auto rt = comm::Runtime::create();
  train::TrainOptions opt;
  opt.quiet = true;
  opt.overwrite = !resume;
  opt.resume = resume;
  opt.stop_at = stop_at;
  return train::run_training(cfg, opt, *rt);
}

TEST(GpuTrain, SameRunOnCpuAndGpu) {
  REQUIRE_GPU();
  const fs::path data = make_data("same");
  const auto cpu = train_run(config(data, "cpu", "fp32", (data / "cpu").string()));
  for (const std::string prec : {"fp32", "bf16"}) {
    const auto gpu = train_run(config(data, "cuda", prec, (data / ("gpu_" + prec)).string()));
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
    const double bound = prec == "fp32" ? 1e-5 : 8 * k_u16;
    double worst = 0;
    for (std::size_t i = 0; i < cpu.losses.size(); ++i) {
      const double e = std::fabs(gpu.losses[i] - cpu.losses[i]) / cpu.losses[i];
      worst = std::max(worst, e);
      EXPECT_LT(e, bound) << prec << " step " << i + 1;
    }
    ASSERT_EQ(gpu.val.size(), cpu.val.size());
    for (std::size_t i = 0; i < cpu.val.size(); ++i)
      EXPECT_LT(std::fabs(gpu.val[i].second - cpu.val[i].second) / cpu.val[i].second, bound)
          << prec << " validation at step " << cpu.val[i].first;
    std::printf("[ trainer %s ] loss %.4f -> %.4f (cpu %.4f -> %.4f), worst rel diff %.3g\n",
                prec.c_str(), gpu.losses.front(), gpu.losses.back(), cpu.losses.front(),
                cpu.losses.back(), worst);
  }
}

// A GPU run stopped at step 10 and resumed on the CPU (and the other way round) continues as the
// uninterrupted run on the device it resumes on: the checkpoint holds the fp32 masters and the
// AdamW moments, whichever device wrote it.
TEST(GpuTrain, CheckpointsMoveBetweenCpuAndGpu) {
  REQUIRE_GPU();
  const fs::path data = make_data("resume");
  const auto cpu_full = train_run(config(data, "cpu", "fp32", (data / "cpu").string()));
  const std::string a = (data / "gpu_then_cpu").string(), b = (data / "cpu_then_gpu").string();
  train_run(config(data, "cuda", "fp32", a), false, 10);
  const auto a2 = train_run(config(data, "cpu", "fp32", a), true);
  train_run(config(data, "cpu", "fp32", b), false, 10);
  const auto b2 = train_run(config(data, "cuda", "fp32", b), true);
  ASSERT_EQ(a2.losses.size(), 10u);
  ASSERT_EQ(b2.losses.size(), 10u);
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_LT(std::fabs(a2.losses[i] - cpu_full.losses[10 + i]) / cpu_full.losses[10 + i], 1e-5)
        << "gpu -> cpu, step " << 11 + i;
    EXPECT_LT(std::fabs(b2.losses[i] - cpu_full.losses[10 + i]) / cpu_full.losses[10 + i], 1e-5)
        << "cpu -> gpu, step " << 11 + i;
  }
}

}  // namespace
