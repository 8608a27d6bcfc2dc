// A tessera-quantized model written as GGUF (quant::save_quantized_gguf, `tessera convert
// --format gguf --dtype q4_0|q4_1|q8_0` of a quantized directory), read back by tessera's GGUF
// reader (whose decoding equals gguf-py's bit for bit: test_gguf.cpp), for both families (llama's
// q/k rows go through GGUF's row order and back).
//
// Bounds. A linear carried over exactly keeps its codes; what the file computes is then:
//  - Q4_0, Q8_0: d (q - zero) with d the fp16 scale: the packed linear's own dequantization
//    (scale (q - zero), the same fp32 product), equal bit for bit;
//  - Q4_1: d q + m, m = -d zero rounded to fp16: off by at most |m| 2^-11 <= d zero 2^-11 plus
//    the product's and sum's roundings (each <= 2^-24 of |d q| + |m|): bounded by 2^-10 d 16.
// Against the fp32-scaled weights tessera evaluates with, d itself is within 2^-11 of the scale.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/model/layout.hpp"
#include "tessera/quant/gguf_export.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/quantize.hpp"
#include "tessera/quant/runner.hpp"

namespace fs = std::filesystem;
using namespace tessera;
using io::GgmlType;

namespace {

model::ModelConfig tiny(bool llama) {
  model::ModelConfig c;  // every linear's rows a whole number of 32-blocks
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.block_size = 16;
  c.vocab_size = 100;
  if (llama) {
    c.family = model::Family::Llama;
    c.n_kv_head = 2;
    c.intermediate_size = 96;
    c.norm_eps = 1e-5;
    c.rope_theta = 10000.0;
  }
  return c;
}

// The model quantized with `wq` by RTN, saved and loaded as `tessera quantize` leaves it.
quant::AnyModel quantized(const model::ModelConfig& cfg, const quant::WeightQuant& wq,
                          const fs::path& dir) {
  const model::ParamLayout layout(cfg);
  std::vector<float> params(layout.total());
  Rng rng(7);
  for (auto& p : params) p = 0.05f * rng.normal();
  quant::QuantizeOptions o;
  o.method = quant::Method::Rtn;
  o.wq = wq;
  quant::save_quantized(dir, quant::quantize_model(layout, params.data(), o, nullptr));
  return quant::load_any_model(dir);
}

struct Case {
  bool llama;
  quant::WeightQuant wq;
  GgmlType type;
};

}  // namespace

TEST(GgufExport, QuantizedLinearsCarryOverOntoTheGgufGrid) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_gguf_export_" + std::to_string(::getpid()));
  for (const Case& c :
       {Case{true, {4, 32, true}, GgmlType::Q4_0}, Case{false, {4, 64, true}, GgmlType::Q4_0},
        Case{true, {4, 32, false}, GgmlType::Q4_1}, Case{false, {3, 32, false}, GgmlType::Q4_1},
        Case{true, {8, -1, true}, GgmlType::Q8_0}}) {
    SCOPED_TRACE(std::string(c.llama ? "llama " : "gpt2 ") +
                 io::ggml_type_info(c.type).name.data());
    fs::remove_all(dir);
    const auto cfg = tiny(c.llama);
    const auto any = quantized(cfg, c.wq, dir / "q");
    const auto report = quant::save_quantized_gguf(dir / "m.gguf", any, c.type, nullptr);
    EXPECT_EQ(report.exact, cfg.n_layer * 4) << report.summary();
    EXPECT_EQ(report.linears, cfg.n_layer * 4);
    const auto back = io::load_model(dir / "m.gguf");
    const auto packed = quant::pack_model(any, quant::ScaleType::F16, quant::Isa::Portable);
    const model::ParamLayout layout(cfg);
    for (int l = 0; l < cfg.n_layer; ++l)
      for (int k = 0; k < quant::k_num_lin; ++k) {
        const auto i = static_cast<std::size_t>(l) * quant::k_num_lin + k;
        const auto& pl = packed.linears[i];
        std::vector<float> want(static_cast<std::size_t>(pl.rows) * pl.cols);
        pl.dequantize(want.data());
        const float* got = back.params.data() + quant::lin_weight_offset(layout, l, quant::Lin(k));
        const auto& ql = any.linears[i];
        for (std::size_t e = 0; e < want.size(); ++e) {
          if (c.type != GgmlType::Q4_1) {
            ASSERT_EQ(got[e], want[e]) << "layer " << l << " linear " << k << " element " << e;
            continue;
          }
          const int r = static_cast<int>(e) / pl.cols, col = static_cast<int>(e) % pl.cols;
          const float d = ql.scales[static_cast<std::size_t>(r) * ql.ngroups() + col / c.wq.group];
          ASSERT_LE(std::fabs(got[e] - want[e]), std::ldexp(16.0f * std::fabs(d), -10))
              << "layer " << l << " linear " << k << " element " << e;
        }
      }
    for (const auto& t : layout.tensors()) {  // the norms and biases as they were
      if (t.shape.size() != 1) continue;
      for (std::size_t e = 0; e < t.numel; ++e)
        ASSERT_EQ(back.params[t.offset + e], any.model.params[t.offset + e]) << t.name;
    }
  }
  fs::remove_all(dir);
}

// What the grid cannot hold is quantized again (and said); what cannot be written is refused.
TEST(GgufExport, OtherGridsAreQuantizedAgainOrRefused) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_gguf_export2_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto cfg = tiny(true);
  const auto asym = quantized(cfg, {4, 32, false}, dir / "asym");
  const auto report = quant::save_quantized_gguf(dir / "q40.gguf", asym, GgmlType::Q4_0, nullptr);
  EXPECT_EQ(report.exact, 0);
  ASSERT_EQ(report.redone.size(), static_cast<std::size_t>(cfg.n_layer * 4));
  EXPECT_NE(report.redone[0].find("asymmetric"), std::string::npos) << report.redone[0];
  EXPECT_GT(report.rel_rms_diff, 0);
  EXPECT_LT(report.rel_rms_diff, 0.2);  // 4-bit RTN again: a few percent of the weights' RMS
  EXPECT_NO_THROW(io::load_model(dir / "q40.gguf"));
  EXPECT_THROW(quant::save_quantized_gguf(dir / "f16.gguf", asym, GgmlType::F16, nullptr), Error);
  fs::remove_all(dir);
}
