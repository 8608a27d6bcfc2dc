// llama.cpp's block types read as tessera's packed linears (quant/gguf_import.hpp), beyond the
// Q4_0, Q4_1 and Q8_0 files tessera writes itself (test_gguf_export.cpp): Q5_0, Q5_1 and the
// K-quants of llama.cpp's K-quant files, and linears whose parts (q, k, v; gate, up) have
// different types, as those files mix them.
//
// The blocks are random bytes with plausible fp16 scales, so every code, 6-bit scale and min
// occurs. Against the reader's decoding of the same blocks (io::dequantize_row, gguf-py's values
// bit for bit: test_gguf.cpp), each value of the packed linear is within
//  - 0 for Q4_0, Q5_0, Q8_0: d (q - zero), the same fp32 product;
//  - 2^-21 ((maxq + 1) |d| + |m|) for Q4_1, Q5_1: d (q - z) with z = -m / d in fp32 against
//    d q + m: z's, q - z's and the product's roundings and the reader's two, each <= 2^-24 of it;
//  - besides that, for Q4_K and Q5_K, the scale d * scale_j (17 significant bits) rounded to
//    fp16: |s' - s| q <= max(2^-11 |s'|, 2^-25) maxq (the zero point is computed with s', so
//    the value at q = 0 is still min);
//  - for Q6_K and Q3_K (groups of 16, symmetric), the scale d * scale_j (18 and 17 significant
//    bits) rounded to fp16: |s' - s| |q - zero| <= max(2^-11 |s'|, 2^-25) zero; for Q2_K (groups
//    of 16 with a min) as for Q4_K.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/layout.hpp"
#include "tessera/quant/gguf_import.hpp"
#include "tessera/quant/packed.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/runner.hpp"

namespace fs = std::filesystem;
using namespace tessera;
using io::GgmlType;

namespace {

constexpr GgmlType k_types[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                                GgmlType::Q5_K, GgmlType::Q6_K};

void put_f16(std::byte* p, float v) {
  const std::uint16_t h = io::fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// n / block_size random blocks of `type`: random codes, scales and mins, the fp16 fields set to
// plausible values (a normal scale, one in 16 blocks a subnormal one, one in 16 zero).
std::vector<std::byte> random_blocks(GgmlType type, std::int64_t n, Rng& rng) {
  const auto& info = io::ggml_type_info(type);
  std::vector<std::byte> b(static_cast<std::size_t>(n / info.block_size * info.block_bytes));
  for (auto& x : b) x = static_cast<std::byte>(rng.next_u64() & 255);
  for (std::size_t at = 0; at < b.size(); at += static_cast<std::size_t>(info.block_bytes)) {
    const std::uint64_t kind = rng.next_u64() % 16;
    const float d = kind == 0 ? 0.0f : (kind == 1 ? 3e-7f : 0.01f * (rng.uniform() + 0.1f));
    const float m = -0.05f * rng.uniform();
    std::byte* blk = b.data() + at;
    switch (type) {
      case GgmlType::Q4_1:
      case GgmlType::Q5_1:
        put_f16(blk + 2, m);
        [[fallthrough]];
      case GgmlType::Q4_0:
      case GgmlType::Q5_0:
      case GgmlType::Q8_0:
        put_f16(blk, rng.uniform() < 0.5f ? d : -d);
        break;
      case GgmlType::Q4_K:
      case GgmlType::Q5_K:
        put_f16(blk, d / 8);
        put_f16(blk + 2, -m / 32);
        break;
      case GgmlType::Q6_K:
        put_f16(blk + 208, d / 64);
        break;
      case GgmlType::Q3_K:
        put_f16(blk + 108, d / 16);
        break;
      case GgmlType::Q2_K:
        put_f16(blk + 80, d / 8);
        put_f16(blk + 82, -m / 8);
        break;
      default:
        ADD_FAILURE() << "no random blocks for " << info.name;
    }
  }
  return b;
}

// The bound above for a value of a packed linear from `type`, at its (row, group).
double bound(GgmlType type, const quant::PackedLinear& p, int r, int g) {
  const double s = std::fabs(p.scale(r, g)), m = std::fabs(s * p.zero(r, g));
  const int maxq = (1 << io::ggml_codes(type)->bits) - 1;
  const double roundings = std::ldexp((maxq + 1) * s + m, -21);
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
      return 0;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
      return roundings;
    case GgmlType::Q2_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return roundings + std::max(std::ldexp(s, -11) * 1.001, std::ldexp(1.0, -25)) * maxq;
    case GgmlType::Q3_K:
    case GgmlType::Q6_K:  // |q - zero| <= zero
      return roundings +
             std::max(std::ldexp(s, -11) * 1.001, std::ldexp(1.0, -25)) * (maxq + 1) / 2;
    default:
      return 0;
  }
}

}  // namespace

TEST(GgufImport, EveryBlockTypeLoadsWithinItsBoundOfTheReadersValues) {
  Rng rng(5);
  const int rows = 9, cols = 512;
  for (const GgmlType type : k_types) {
    SCOPED_TRACE(io::ggml_type_info(type).name.data());
    const auto blocks = random_blocks(type, std::int64_t{rows} * cols, rng);
    std::vector<float> want(static_cast<std::size_t>(rows) * cols);
    io::dequantize_row(type, blocks.data(), want.data(), std::int64_t{rows} * cols);
    const quant::PackedLinear p = quant::pack(quant::quantized_from_ggml(type, blocks, rows, cols));
    EXPECT_EQ(p.bits, io::ggml_codes(type)->bits);
    EXPECT_EQ(p.group, io::ggml_codes(type)->sub);
    std::vector<float> got(want.size());
    p.dequantize(got.data());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const std::size_t e = static_cast<std::size_t>(r) * cols + c;
        ASSERT_LE(std::fabs(double(got[e]) - want[e]), bound(type, p, r, c / p.group))
            << "row " << r << " column " << c;
      }
  }
  // A non-finite scale (fp16 NaN or infinity) in any type is refused, never packed.
  for (const GgmlType type : k_types) {
    SCOPED_TRACE(io::ggml_type_info(type).name.data());
    auto blocks = random_blocks(type, 256, rng);
    const std::size_t d_at = type == GgmlType::Q6_K   ? 208
                             : type == GgmlType::Q3_K ? 108
                             : type == GgmlType::Q2_K ? 80
                                                      : 0;
    for (const std::uint16_t bad : {std::uint16_t{0x7E00}, std::uint16_t{0x7C00}}) {
      std::memcpy(blocks.data() + d_at, &bad, 2);
      EXPECT_THROW(quant::pack(quant::quantized_from_ggml(type, blocks, 1, 256)), Error);
    }
  }
  EXPECT_THROW(quant::quantized_from_ggml(GgmlType::Q4_K, std::vector<std::byte>(144), 1, 256 + 32),
               Error);
  EXPECT_THROW(quant::quantized_from_ggml(GgmlType::Q6_K, std::vector<std::byte>(209), 1, 256),
               Error);
}

namespace {

model::ModelConfig tiny_llama() {
  model::ModelConfig c;  // rows of 256: the K-quants' super-blocks
  c.family = model::Family::Llama;
  c.n_layer = 2;
  c.n_embd = 256;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.intermediate_size = 256;
  c.block_size = 16;
  c.vocab_size = 64;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  return c;
}

// What llama.cpp's K-quant files mix, per tensor (the others stay F32): parts of one linear of
// different types (q, k Q5_0 with v Q8_0; gate Q5_K with up Q4_1; gate Q3_K with up Q4_0), every
// type somewhere.
const std::map<std::string, GgmlType> k_mix = {
    {"blk.0.attn_q.weight", GgmlType::Q5_0},      {"blk.0.attn_k.weight", GgmlType::Q5_0},
    {"blk.0.attn_v.weight", GgmlType::Q8_0},      {"blk.0.attn_output.weight", GgmlType::Q4_K},
    {"blk.0.ffn_gate.weight", GgmlType::Q5_K},    {"blk.0.ffn_up.weight", GgmlType::Q4_1},
    {"blk.0.ffn_down.weight", GgmlType::Q6_K},    {"blk.1.attn_q.weight", GgmlType::Q4_K},
    {"blk.1.attn_k.weight", GgmlType::Q4_K},      {"blk.1.attn_v.weight", GgmlType::Q6_K},
    {"blk.1.attn_output.weight", GgmlType::Q5_1}, {"blk.1.ffn_gate.weight", GgmlType::Q3_K},
    {"blk.1.ffn_up.weight", GgmlType::Q4_0},      {"blk.1.ffn_down.weight", GgmlType::Q2_K},
    {"token_embd.weight", GgmlType::Q6_K},
};

// The model as an F32 file with the tensors of k_mix replaced by random blocks of their type.
void write_mixed(const model::ModelConfig& cfg, const fs::path& file) {
  const model::ParamLayout layout(cfg);
  std::vector<float> params(layout.total());
  Rng rng(3);
  for (auto& p : params) p = 0.05f * rng.normal();
  io::save_gguf_model(file, layout, params.data(), GgmlType::F32, nullptr);
  const io::GgufFile f32 = io::GgufFile::open(file);
  io::GgufWriter w;
  for (const auto& m : f32.metadata()) w.set_metadata(m.key, m.value);
  for (const auto& t : f32.tensors()) {
    const auto it = k_mix.find(t.name);
    if (it == k_mix.end()) {
      w.add_encoded(t.name, t.type, t.dims, f32.bytes(t));
      continue;
    }
    w.add_encoded(t.name, it->second, t.dims, random_blocks(it->second, t.numel(), rng));
  }
  w.write(file);
}

// The GGUF name of the layout's tensor that holds parameter `offset`.
std::string gguf_name_at(const model::ParamLayout& layout, std::size_t offset) {
  for (const auto& t : layout.tensors())
    if (offset >= t.offset && offset < t.offset + t.numel)
      return io::gguf_name_of(layout.config(), t.name);
  return "";
}

}  // namespace

// A file of mixed types loads packed (every linear; parts of different types joined on the
// widest codes and the smallest groups), each packed value within its type's bound of the reader's;
// and the packed decoder with fp32 activations follows a plain decoder over the packed linears' own
// values: fp32 dot products of 256 terms in another order through two layers, 1e-4 (1 + |logit|).
TEST(GgufImport, MixedTypesOfAQ4KMFileLoadPackedLinearByLinear) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_gguf_mixed_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto cfg = tiny_llama();
  const model::ParamLayout layout(cfg);
  write_mixed(cfg, dir / "m.gguf");
  const auto read = io::load_model(dir / "m.gguf");
  quant::PackedModel pm;
  std::string why;
  const auto any = quant::load_packed_model(dir / "m.gguf", pm, why, quant::ScaleType::F16,
                                            quant::Isa::Portable);
  ASSERT_EQ(why, "");
  ASSERT_TRUE(any.quantized);
  EXPECT_NE(any.description.find("Q6_K scales rounded to fp16"), std::string::npos)
      << any.description;
  // The packed model's own values: its fp32 tensors, and its packed ones dequantized.
  std::vector<float> params(any.model.params.data(),
                            any.model.params.data() + any.model.params.size());
  for (int l = 0; l < cfg.n_layer; ++l)
    for (int k = 0; k < quant::k_num_lin; ++k) {
      const auto& pl = pm.linears[static_cast<std::size_t>(l) * quant::k_num_lin + k];
      const std::size_t at = quant::lin_weight_offset(layout, l, quant::Lin(k));
      pl.dequantize(params.data() + at);
      for (int r = 0; r < pl.rows; ++r) {
        const std::string name = gguf_name_at(layout, at + static_cast<std::size_t>(r) * pl.cols);
        for (int c = 0; c < pl.cols; ++c) {
          const std::size_t e = at + static_cast<std::size_t>(r) * pl.cols + c;
          ASSERT_LE(std::fabs(double(params[e]) - read.params[e]),
                    bound(k_mix.at(name), pl, r, c / pl.group))
              << name << " row " << r << " column " << c;
        }
      }
    }
  ASSERT_EQ(pm.embed.rows, cfg.vocab_size);
  for (int v = 0; v < cfg.vocab_size; ++v)
    pm.embed.dequantize_row(v, params.data() + layout.wte + std::size_t(v) * cfg.n_embd);
  pm.int8_activations = false;
  model::Decoder packed(layout, any.model.params.data(), 8, kernels::GemmLibrary::OneDnn,
                        pm.decoder_kernels());
  model::Decoder plain(layout, params.data(), 8, kernels::GemmLibrary::OneDnn);
  for (const std::int32_t token : {3, 41, 0, 12}) {
    const float* a = packed.step(token);
    const float* b = plain.step(token);
    for (int v = 0; v < cfg.vocab_size; ++v)
      ASSERT_NEAR(a[v], b[v], 1e-4 * (1 + std::fabs(b[v]))) << "token " << token << " logit " << v;
  }
  fs::remove_all(dir);
}

// The blocks llama.cpp's quantizer wrote: the first block linear of each type in Gemma 3 270M's
// Q4_K_M file (Q5_0, Q8_0, Q4_K, Q6_K; the architecture itself is not one tessera runs), within
// the bounds above of the reader's values.
TEST(GgufImport, Gemma3sBlocksLoadWithinTheirBounds) {
  const fs::path gemma = fs::path(TESSERA_DATA) / "models/gemma3-270m/gemma-3-270m-q4_k_m.gguf";
  if (!fs::exists(gemma)) GTEST_SKIP() << gemma << " is absent: run scripts/setup --with-models";
  const io::GgufFile f = io::GgufFile::open(gemma);
  std::vector<GgmlType> seen;
  for (const auto& t : f.tensors()) {
    if (t.dims.size() != 2 || t.name.rfind("blk.", 0) != 0 || !quant::gguf_packable_type(t.type) ||
        std::find(seen.begin(), seen.end(), t.type) != seen.end())
      continue;
    seen.push_back(t.type);
    SCOPED_TRACE(t.name);
    const auto rows = static_cast<int>(t.dims[1]), cols = static_cast<int>(t.dims[0]);
    const quant::PackedLinear p =
        quant::pack(quant::quantized_from_ggml(t.type, f.bytes(t), rows, cols));
    const std::vector<float> want = f.dequantize(t);
    std::vector<float> got(want.size());
    p.dequantize(got.data());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const std::size_t e = static_cast<std::size_t>(r) * cols + c;
        ASSERT_LE(std::fabs(double(got[e]) - want[e]), bound(t.type, p, r, c / p.group))
            << "row " << r << " column " << c;
      }
  }
  EXPECT_EQ(seen.size(), 4u);
}

// The fuzz target's seed of a quantized llama (tools/gguf_fixture.py, written by gguf-py) loads
// packed, every linear from its blocks (parts of one linear of different types), so that fuzzing
// starts inside the importer.
TEST(GgufImport, FuzzSeedOfAQuantizedLlamaLoadsPacked) {
  const fs::path seed = fs::path(TESSERA_FIXTURES) / "../fuzz/corpus/gguf/llama_quantized_mix.gguf";
  quant::PackedModel pm;
  std::string why;
  const auto any = quant::load_packed_model(seed, pm, why);
  ASSERT_EQ(why, "");
  ASSERT_TRUE(any.quantized) << any.description;
  EXPECT_EQ(pm.linears.size(), 2u * quant::k_num_lin);
  EXPECT_EQ(pm.embed.rows, 8);
  for (const char* type : {"Q5_0", "Q8_0", "Q4_1", "Q5_1", "Q4_0"})
    EXPECT_NE(any.description.find(type), std::string::npos) << any.description;
}
