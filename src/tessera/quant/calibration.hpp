// Calibration: named, seeded calibration sets, and the capture pass that records statistics of
// every linear's input (per channel: count, sum, sum of squares, sum |x|, max |x|, third and
// fourth moments, tokens with |x| >= 6) and, when a method needs it, the second-moment matrix
// X^T X (fp32 GEMM per micro-batch, accumulated in fp64).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/model/layout.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {

// ---- calibration sets ----
struct CalibSources {
  std::filesystem::path train_shard = "data/brown/train.bin";  // corpus, corpus-concat
  // The model's tokenizer (a .gguf, a tokenizer.json, or GPT-2's folder): it tokenizes the text
  // sets and names the end-of-text token (corpus-concat) and the punctuation tokens (punct).
  std::filesystem::path tokenizer = "data/gpt2";
  std::filesystem::path domain_text = "/usr/share/common-licenses/GPL-3";  // legal English
  std::filesystem::path lang2_text = "data/lang2/de.txt";  // German prose (scripts/setup)
  std::filesystem::path code_dir = "src/tessera";          // C++ source (code)
};
struct CalibSet {
  std::string name;
  std::uint64_t seed = 0;
  int seqlen = 0;
  std::vector<std::int32_t> tokens;  // (n, seqlen)
  int n() const { return seqlen ? static_cast<int>(tokens.size() / seqlen) : 0; }
  std::string describe() const;
};
// Names: corpus (GPTQ-style random windows of the training shard), corpus-concat (AWQ-style:
// shuffled documents concatenated and cut into blocks), random (uniform token ids), punct
// (random tokens of the tokenizer's single-token ASCII punctuation), domain (windows of another
// domain's text), lang2 (windows of non-English prose), code (windows of the C++ sources under
// code_dir, files in name order). Throws tessera::Error for an unknown name, n or seqlen < 1, or a
// source too small for even one sample.
CalibSet make_calibration(const std::string& name, int n, int seqlen, std::uint64_t seed,
                          int vocab_size, const CalibSources& src = {});
const std::vector<std::string>& calibration_names();
// Throws tessera::Error when the source a set is built from (the shard, the text file, the source
// folder) is not there: what make_calibration would find only when it builds the set, which a
// study does after other work.
void check_calibration_source(const std::string& name, const CalibSources& src);
// A text's token ids by the tokenizer at `tokenizer` (no BOS added).
std::vector<std::int32_t> tokenize_text(const std::string& body,
                                        const std::filesystem::path& tokenizer);

// ---- statistics ----
struct ChannelStats {
  int cols = 0;
  std::int64_t count = 0;  // tokens
  std::vector<double> sum, sumsq, sumabs, sum3, sum4;
  std::vector<float> maxabs;
  std::vector<std::int64_t> over6;  // tokens with |x| >= 6 in this channel
  void init(int c);
  void add(const float* x, std::int64_t N);  // x (N, cols)
  double mean(int j) const { return count ? sum[j] / count : 0.0; }
  double mean_abs(int j) const { return count ? sumabs[j] / count : 0.0; }
  double excess_kurtosis(int j) const;
};

struct Hessian {
  int cols = 0;
  std::int64_t count = 0;
  std::vector<double> xtx;  // (cols, cols): sum over tokens of x x^T
  void init(int c);
  void add(const float* x, std::int64_t N, kernels::GemmLibrary gemm);
  // GPTQ's H = 2/N X^T X; AWQ/clip losses use X^T X / N.
  std::vector<double> mean_xtx() const;
};

struct LinearCapture {
  ChannelStats stats;
  Hessian hessian;  // empty (cols 0) unless requested
};

// A massive activation (Sun et al.): |x| > 100 and >= 1000x the median |x| of its hidden state.
struct MassiveActivation {
  int layer = 0;  // output of block `layer`
  int sample = 0, position = 0, dim = 0;
  float value = 0, median = 0;
};
struct ResidualStats {
  std::vector<float> maxabs;               // (L) largest |x| of each block's output
  std::vector<double> max_ratio;           // (L) largest max/median over tokens
  std::vector<MassiveActivation> massive;  // at most 1000 kept
  std::vector<MassiveActivation> largest;  // (L) where each block's largest |x| is
};

struct Capture {
  model::ModelConfig config;  // the model captured (names its linears)
  std::vector<std::array<LinearCapture, k_num_lin>> layers;  // (L, 4)
  ResidualStats residual;
  std::int64_t tokens = 0;
};

// One pass of the calibration set through the (unmodified) model, micro-batch by micro-batch.
Capture capture(const model::ParamLayout& layout, const float* params, const CalibSet& calib,
                bool hessians, int micro_batch = 8,
                kernels::GemmLibrary gemm = kernels::GemmLibrary::OneDnn);

}  // namespace tessera::quant
