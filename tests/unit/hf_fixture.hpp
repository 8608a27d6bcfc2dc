// A parameter tensor of tessera's layout in the layout of the Hugging Face fixtures
// (tools/make_gpt2_fixture.py, tools/make_llama_fixture.py): GPT-2's Conv1D weights transposed
// back to (in, out), the vocabulary matrices without their padding rows. Used by the CPU and GPU
// fixture tests.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/model/layout.hpp"

inline std::vector<float> to_hf(const tessera::model::ParamTensor& t,
                                const tessera::model::ModelConfig& cfg, const float* buf) {
  const float* p = buf + t.offset;
  if (t.vocab_rows)
    return std::vector<float>(p, p + std::size_t(cfg.vocab_size) * cfg.n_embd);
  if (!t.transposed_in_hf) return std::vector<float>(p, p + t.numel);
  std::vector<float> out(t.numel);
  auto rows = t.shape[0], cols = t.shape[1];
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = p[r * cols + c];
  return out;
}
