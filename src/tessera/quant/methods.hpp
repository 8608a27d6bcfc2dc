// Weight quantization algorithms on one linear layer (W (rows, cols) = (out, in), row-major) and
// the per-layer pieces of AWQ and SmoothQuant. The model-level drivers are in quantize.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/quant/quantizer.hpp"

namespace tessera::quant {

// ---- GPTQ (reference section 1.2, IST-DASLab/gptq fasterquant) ----
struct GptqOptions {
  WeightQuant spec;
  double percdamp = 0.01;  // damping: H_jj += percdamp * mean(diag H), +percdamp per retry
  int max_retries = 10;    // retries when the Cholesky factorization fails
  int blocksize = 128;     // lazy batch width
  bool act_order = false;  // quantize columns by descending diag(H)
  bool static_groups = false;
};
struct GptqResult {
  QuantizedLinear q;
  double loss = 0;  // sum of (w - q)^2 / d^2 / 2 (the reference's error)
  double damp = 0;  // the relative damping that succeeded
  int retries = 0;
};
// H (cols, cols): any positive multiple of X^T X (taken by value; modified).
GptqResult gptq(const float* W, int rows, int cols, std::vector<double> H, const GptqOptions& opt);

// ---- AWQ (reference section 1.3, llm-awq auto_scale / auto_clip) ----
// Loss of an effective weight W' against W on inputs with second moment S = X^T X / N:
// mean over rows and tokens of ((W' - W) x)^2 = tr((W'-W) S (W'-W)^T) / rows.
double output_mse(const float* Wq, const float* W, int rows, int cols,
                  const std::vector<double>& S);
// The 20-point grid search of s = mean|x|^alpha (normalized); W is (rows, cols), possibly
// several linears stacked by rows sharing the input. Returns s (cols) and the best alpha.
std::vector<float> awq_search_scales(const float* W, int rows, int cols,
                                     const std::vector<double>& mean_abs_x,
                                     const std::vector<double>& S, const WeightQuant& spec,
                                     int n_grid = 20, float* best_alpha = nullptr);
// Clip search per (row, group): shrink in {1, 0.95, ..., 0.55} of max|w|, error of the group's
// partial dot products measured with the group block of S. Clamps W in place.
void awq_clip(float* W, int rows, int cols, const std::vector<double>& S, const WeightQuant& spec);

// ---- SmoothQuant (reference section 1.4) ----
// s_j = max|X_j|^alpha / max|W_j|^(1-alpha), W_j over the rows of all linears of the site.
std::vector<float> smooth_scales(const std::vector<float>& act_max, const float* W, int rows,
                                 int cols, float alpha);

}  // namespace tessera::quant
