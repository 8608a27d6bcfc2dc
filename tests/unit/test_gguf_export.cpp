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
#include "tessera/model/gpt.hpp"
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

// The other way: a GGUF file whose block linears are Q4_0, Q4_1 or Q8_0 (here as llama.cpp's
// rounding writes them from fp32 weights) loads for the packed decoder from its own blocks
// (quant/gguf_import.hpp), for both families, llama's q/k rows back in Hugging Face's order.
// Against the same file dequantized by tessera's reader (gguf-py's values, test_gguf.cpp):
//  - each packed linear: Q4_0 and Q8_0 bit for bit (d (n - 8), d n: the same fp32 product);
//    Q4_1 as d (n - z) with z = -m / d in fp32, against d n + m: the roundings of z, of n - z and
//    of the product, and the reader's own two, each <= 2^-24 of |d| 16 + |m|: 2^-21 of it;
//  - the token embedding (Q8_0 in every such file) bit for bit, the norms and biases as read;
//  - the decoder's logits with fp32 activations against the dequantized model's: the same
//    weights (Q4_1 within the bound above), fp32 dot products of at most 96 terms in another
//    order (a relative 96 u of the sum of |terms| each) through two layers: 1e-4 (1 + |logit|),
//    where a wrong row order or code moves them by tenths.
TEST(GgufImport, QuantizedBlocksLoadPackedAsTheReaderDecodesThem) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_gguf_import_" + std::to_string(::getpid()));
  for (const bool llama : {true, false})
    for (const GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0}) {
      SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + io::ggml_type_info(type).name.data());
      fs::remove_all(dir);
      fs::create_directories(dir);
      const auto cfg = tiny(llama);
      const model::ParamLayout layout(cfg);
      std::vector<float> params(layout.total());
      Rng rng(11);
      for (auto& p : params) p = 0.05f * rng.normal() + 0.01f;  // an offset: Q4_1's m is not 0
      io::save_gguf_model(dir / "m.gguf", layout, params.data(), type, nullptr);
      const auto dequantized = io::load_model(dir / "m.gguf");
      quant::PackedModel pm;
      std::string why;
      const auto any = quant::load_packed_model(dir / "m.gguf", pm, why, quant::ScaleType::F16,
                                                quant::Isa::Portable);
      ASSERT_EQ(why, "");
      ASSERT_TRUE(any.quantized);
      EXPECT_NE(any.description.find(io::ggml_type_info(type).name), std::string::npos)
          << any.description;
      ASSERT_EQ(pm.linears.size(), static_cast<std::size_t>(cfg.n_layer) * quant::k_num_lin);
      for (int l = 0; l < cfg.n_layer; ++l)
        for (int k = 0; k < quant::k_num_lin; ++k) {
          const auto& pl = pm.linears[static_cast<std::size_t>(l) * quant::k_num_lin + k];
          const std::size_t at = quant::lin_weight_offset(layout, l, quant::Lin(k));
          std::vector<float> got(static_cast<std::size_t>(pl.rows) * pl.cols);
          pl.dequantize(got.data());
          for (std::size_t e = 0; e < got.size(); ++e) {
            const float want = dequantized.params[at + e];
            const int r = static_cast<int>(e) / pl.cols, g = static_cast<int>(e) % pl.cols / 32;
            const double d = pl.scale(r, g), m = -d * pl.zero(r, g);
            const double bound =
                type == GgmlType::Q4_1 ? std::ldexp(16 * std::fabs(d) + std::fabs(m), -21) : 0;
            ASSERT_LE(std::fabs(got[e] - want), bound)
                << "layer " << l << " linear " << k << " " << e;
            ASSERT_EQ(any.model.params[at + e], 0.0f);  // never read in fp32
          }
        }
      for (const auto& t : layout.tensors()) {
        if (t.shape.size() != 1) continue;
        for (std::size_t e = 0; e < t.numel; ++e)
          ASSERT_EQ(any.model.params[t.offset + e], dequantized.params[t.offset + e]) << t.name;
      }
      if (llama) {
        ASSERT_EQ(pm.embed.rows, cfg.vocab_size);
        std::vector<float> row(cfg.n_embd);
        for (int v = 0; v < cfg.vocab_size; ++v) {
          pm.embed.dequantize_row(v, row.data());
          for (int c = 0; c < cfg.n_embd; ++c)
            ASSERT_EQ(row[c], dequantized.params[layout.wte + std::size_t(v) * cfg.n_embd + c]);
        }
      }
      pm.int8_activations = false;
      model::Decoder packed(layout, any.model.params.data(), 8, kernels::GemmLibrary::OneDnn,
                            pm.decoder_kernels());
      model::Decoder plain(layout, dequantized.params.data(), 8, kernels::GemmLibrary::OneDnn);
      for (const std::int32_t token : {3, 41, 97, 0, 12}) {
        const float* a = packed.step(token);
        const float* b = plain.step(token);
        for (int v = 0; v < cfg.vocab_size; ++v)
          ASSERT_NEAR(a[v], b[v], 1e-4 * (1 + std::fabs(b[v])))
              << "token " << token << " logit " << v;
      }
    }
  fs::remove_all(dir);
}

// Files with other matrix types load dequantized, as before, saying which tensor is why.
TEST(GgufImport, OtherTypesLoadDequantized) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_gguf_import2_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto cfg = tiny(true);
  const model::ParamLayout layout(cfg);
  std::vector<float> params(layout.total(), 0.02f);
  io::save_gguf_model(dir / "f16.gguf", layout, params.data(), GgmlType::F16, nullptr);
  quant::PackedModel pm;
  std::string why;
  const auto any = quant::load_packed_model(dir / "f16.gguf", pm, why);
  EXPECT_EQ(why, "");
  EXPECT_FALSE(any.quantized);
  EXPECT_TRUE(pm.linears.empty());
  EXPECT_NE(any.description.find("is F16"), std::string::npos) << any.description;
  EXPECT_EQ(any.model.params[quant::lin_weight_offset(layout, 0, quant::Lin::Qkv)],
            io::fp16_to_fp32(io::fp32_to_fp16(0.02f)));  // read, as F16
  fs::remove_all(dir);
}
