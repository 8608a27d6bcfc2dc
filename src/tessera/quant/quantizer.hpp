// Uniform weight quantizers (reference section 1.0): asymmetric and symmetric, per output row
// ("per channel", group = -1) or per group of G consecutive input columns of a row.
// A quantized linear keeps integer codes, one (scale, zero) per (row, group), the group of every
// input column (g_idx: contiguous unless GPTQ's act-order reordered them) and an optional
// per-input-column divisor (AWQ scales that no previous op can absorb, e.g. after GELU).
// Dequantized weight: w[r, c] = scale[r, g_idx[c]] * (q[r, c] - zero[r, g_idx[c]]) / in_scale[c].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::quant {

struct WeightQuant {
  int bits = 4;      // 2..8
  int group = 128;   // columns per group; -1 = one group per row (per channel)
  bool sym = false;  // symmetric (zero at the middle code) or asymmetric (zero fitted)
  // Asymmetric with the group's minimum as the offset (llama.cpp's Q4_1 form, w = d q + min):
  // the range is the group's own (not widened to include 0) and the zero point is not rounded
  // to a code, so a group already on such a grid is represented exactly.
  bool min_offset = false;
  int maxq() const { return (1 << bits) - 1; }
  int groups(int cols) const { return group <= 0 ? 1 : (cols + group - 1) / group; }
  int group_size(int cols) const { return group <= 0 ? cols : group; }
};

// Throws tessera::Error for a bit width outside 2..8 or a group size that is neither -1 nor
// positive. A group size need not divide a row: the last group of a row is then shorter (as in
// the GPTQ reference; SmolLM2's width 576 is 4 groups of 128 and one of 64).
void validate(const WeightQuant& q);
std::string describe(const WeightQuant& q);  // "W4 g128 asym", "W4 g32 asym-min"

struct QParams {
  float scale = 1.0f;
  float zero = 0.0f;    // an integer code, or any value with WeightQuant::min_offset
  bool offset = false;  // min_offset: the zero is not a code
};

// Fits (scale, zero) to the values v[0..n) (stride apart), range including 0 as GPTQ and AWQ
// do (or the values' own range with min_offset). clip in (0, 1] shrinks the range (AWQ's clip
// search).
QParams fit(const float* v, int n, int stride, const WeightQuant& spec, float clip = 1.0f);
inline float quantize_code(float w, QParams p, int maxq) {
  float q =
      p.offset ? __builtin_roundf(w / p.scale + p.zero) : __builtin_roundf(w / p.scale) + p.zero;
  return q < 0.0f ? 0.0f : (q > static_cast<float>(maxq) ? static_cast<float>(maxq) : q);
}
inline float dequant(float q, QParams p) {
  return p.scale * (q - p.zero);
}
inline float quant_dequant(float w, QParams p, int maxq) {
  return dequant(quantize_code(w, p, maxq), p);
}

struct QuantizedLinear {
  int rows = 0, cols = 0;  // (out, in)
  WeightQuant spec;
  std::vector<std::uint8_t> q;       // (rows, cols) codes 0..maxq
  std::vector<float> scales, zeros;  // (rows, ngroups)
  std::vector<std::int32_t> g_idx;   // (cols) group of each input column
  std::vector<float> in_scale;       // (cols) or empty: dequantized columns are divided by it
  int ngroups() const { return static_cast<int>(scales.size()) / (rows ? rows : 1); }
  void dequantize(float* w) const;  // w (rows, cols)
};

// Round-to-nearest of W (rows, cols) with contiguous groups; W is left unchanged.
QuantizedLinear rtn(const float* W, int rows, int cols, const WeightQuant& spec);
// Fake quantization in place (W <- dequant(quant(W))), contiguous groups.
void rtn_inplace(float* W, int rows, int cols, const WeightQuant& spec);

// ---- INT8 absmax helpers (SmoothQuant, LLM.int8()) ----
// Per output row: w <- round(w / s) * s, s = max|row| / 127. Returns the per-row scales.
std::vector<float> int8_rows_inplace(float* W, int rows, int cols);
// Whole-tensor absmax INT8 (SmoothQuant's per-tensor weight level).
float int8_tensor_inplace(float* W, std::int64_t n);

}  // namespace tessera::quant
