// Helpers of the end-to-end parallel tests (tests/parallel): run the tessera binary (under
// mpirun), read its metrics and checkpoints, and compare runs.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../scratch_dir.hpp"
#include "tessera/io/checkpoint.hpp"

namespace tessera::test {

namespace fs = std::filesystem;

struct Run {
  int code = -1;
  std::string output;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// This process's scratch root, removed at exit.
inline const fs::path& scratch_root() {
  static const ScratchDir root("tessera_par_");
  return root.path();
}

inline fs::path scratch(const std::string& name) {
  auto d = scratch_root() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

inline const char* k_env =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
    "OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE ";

inline Run sh(const std::string& cmd) {
  auto out = scratch_root() / "out.txt";
  std::string full = "cd '" TESSERA_SOURCE_DIR "' && " + cmd + " >'" + out.string() + "' 2>&1";
  int st = std::system(full.c_str());
  Run r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  r.output = slurp(out);
  return r;
}

// The launcher found at configure time, or $TESSERA_MPIEXEC (e.g. a relocated Open MPI on a
// machine that has none installed).
inline std::string mpirun(int n) {
  const char* env = std::getenv("TESSERA_MPIEXEC");
  const std::string exe = env && *env ? env : TESSERA_MPIEXEC;
  return std::string(k_env) + "'" + exe + "' -n " + std::to_string(n) + " ";
}

// tiny.toml with the test corpus; B is the per-rank micro-batch.
inline std::string train_args(const fs::path& data, const fs::path& out, int B, int accum,
                              int steps) {
  return std::string("'" TESSERA_BIN "' train configs/runs/tiny.toml --quiet --set") +
         " 'data.train=\"" + (data / "train.bin").string() + "\"' 'data.val=\"" +
         (data / "val.bin").string() + "\"' 'train.out_dir=\"" + out.string() +
         "\"' sample.tokens=0 train.val_every=0" + " train.batch_size=" + std::to_string(B) +
         " train.grad_accum=" + std::to_string(accum) + " train.steps=" + std::to_string(steps);
}

inline std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::istringstream in(slurp(metrics));
  for (std::string l; std::getline(in, l);) {
    auto a = l.find("\"loss\":");
    if (a != std::string::npos) out.push_back(std::stod(l.substr(a + 7)));
  }
  return out;
}

inline fs::path data_dir() {
  static fs::path d = [] {
    auto dir = scratch("data");
    std::ofstream f(dir / "corpus.txt");
    const char* s[] = {
        "The quick brown fox jumps over the lazy dog. ", "It was the best of times. ",
        "A stitch in time saves nine, said the tailor. ", "Numbers like 1234 appear. "};
    for (int i = 0; i < 600; ++i) f << s[(i * 7) % 4] << (i % 11 == 0 ? "\n\n" : "");
    f.close();
    auto r = sh(std::string("'" TESSERA_BIN "' prepare --corpus text --input ") +
                (dir / "corpus.txt").string() + " --val-every 0 --out " + dir.string());
    EXPECT_EQ(r.code, 0) << r.output;
    // a val shard for the config (unused: val_every=0)
    fs::copy_file(dir / "train.bin", dir / "val.bin", fs::copy_options::overwrite_existing);
    return dir;
  }();
  return d;
}

// |parameter differences| between two runs' last checkpoints, in increasing order.
inline std::vector<double> sorted_param_diffs(const fs::path& ref, const fs::path& got) {
  auto ma = tessera::io::load_model(*tessera::io::latest_checkpoint(ref / "checkpoints"));
  auto mb = tessera::io::load_model(*tessera::io::latest_checkpoint(got / "checkpoints"));
  tessera::model::ParamLayout layout(ma.config);
  std::vector<double> diff(layout.total());
  for (std::size_t i = 0; i < layout.total(); ++i)
    diff[i] = std::fabs(double(ma.params[i]) - mb.params[i]);
  std::sort(diff.begin(), diff.end());
  return diff;
}

inline void expect_same_run(const fs::path& ref, const fs::path& got, const std::string& what) {
  auto a = losses(ref / "metrics.jsonl"), b = losses(got / "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::fabs(a[i] - b[i]), 1e-5 * std::fabs(a[i])) << what << " step " << i + 1;
  const auto diff = sorted_param_diffs(ref, got);
  EXPECT_LE(diff[diff.size() * 999 / 1000], 1e-5) << what << " (99.9th percentile of |param diff|)";
  EXPECT_LE(diff.back(), 2e-2) << what << " (max |param diff|)";
}

// A run stopped at step `stop` on one grid (`first`, under mpirun(first_ranks)) and resumed on
// another (`second`, under mpirun(second_ranks), or one process): the losses after `stop` are
// the uninterrupted reference's within 1e-5 relative.
inline void expect_resume_matches(const std::vector<double>& ref, const fs::path& out,
                                  int first_ranks, const std::string& first, int second_ranks,
                                  const std::string& second, int stop, const std::string& what) {
  auto launch = [](int n) { return n > 1 ? mpirun(n) : std::string(); };
  auto a = sh(launch(first_ranks) + first + " --stop-at " + std::to_string(stop));
  ASSERT_EQ(a.code, 0) << what << "\n" << a.output;
  auto b = sh(launch(second_ranks) + second + " --resume");
  ASSERT_EQ(b.code, 0) << what << "\n" << b.output;
  auto got = losses(out / "metrics.jsonl");
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (std::size_t i = static_cast<std::size_t>(stop); i < ref.size(); ++i)
    EXPECT_LE(std::fabs(got[i] - ref[i]), 1e-5 * ref[i]) << what << " step " << i + 1;
}

inline bool have_tokenizer() {
  return fs::exists(fs::path(TESSERA_DATA) / "gpt2" / "encoder.json");
}

}  // namespace tessera::test
