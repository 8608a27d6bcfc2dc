#include "tessera/quant/gguf_import.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {

using io::GgmlType;

bool gguf_packable_type(GgmlType type) {
  return type == GgmlType::Q4_0 || type == GgmlType::Q4_1 || type == GgmlType::Q8_0;
}

namespace {

float half_at(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return io::fp16_to_fp32(h);
}

// Block `blk` (32 values) as codes q[0..31], its scale and zero point.
void decode_block(GgmlType type, const std::byte* blk, std::uint8_t* q, float& scale, float& zero) {
  scale = half_at(blk);
  if (type == GgmlType::Q8_0) {
    for (int i = 0; i < 32; ++i)
      q[i] =
          static_cast<std::uint8_t>(static_cast<int>(static_cast<std::int8_t>(blk[2 + i])) + 128);
    zero = 128.0f;
    return;
  }
  const std::byte* qs = blk + (type == GgmlType::Q4_1 ? 4 : 2);
  for (int i = 0; i < 16; ++i) {  // low nibbles: values 0..15, high nibbles: 16..31
    q[i] = static_cast<std::uint8_t>(std::to_integer<int>(qs[i]) & 15);
    q[i + 16] = static_cast<std::uint8_t>(std::to_integer<int>(qs[i]) >> 4);
  }
  if (type == GgmlType::Q4_0) {
    zero = 8.0f;
    return;
  }
  const float m = half_at(blk + 2);
  if (scale != 0.0f) {
    zero = -m / scale;
    return;
  }
  std::memset(q, 0, 32);  // every value is m: m (0 - (-1))
  scale = m;
  zero = -1.0f;
}

// The layout's tensors that make up block linear k of layer l, in row order (q k v, gate up).
std::vector<const model::ParamTensor*> linear_parts(const model::ParamLayout& layout, int l,
                                                    Lin k) {
  const auto& cfg = layout.config();
  const std::size_t begin = lin_weight_offset(layout, l, k);
  const std::size_t end = begin + static_cast<std::size_t>(lin_rows(cfg, k)) *
                                      static_cast<std::size_t>(lin_cols(cfg, k));
  std::map<std::size_t, const model::ParamTensor*> parts;
  for (const auto& t : layout.tensors())
    if (t.shape.size() == 2 && t.offset >= begin && t.offset < end) parts[t.offset] = &t;
  std::vector<const model::ParamTensor*> out;
  for (const auto& [offset, t] : parts) out.push_back(t);
  return out;
}

// The type of the file's tensor for t, or nullopt where the file has none (load_gguf_model then
// says so).
std::optional<GgmlType> type_of(const io::GgufFile& f, const model::ModelConfig& cfg,
                                const model::ParamTensor& t) {
  const io::GgufTensorInfo* g = f.find(io::gguf_name_of(cfg, t.name));
  return g ? std::optional<GgmlType>(g->type) : std::nullopt;
}

// The matrix of the parts (their rows one after the other; llama's q and k rows put back in
// Hugging Face's order) as a quantized linear.
QuantizedLinear read_matrix(const io::GgufFile& f, const model::ModelConfig& cfg,
                            const std::vector<const model::ParamTensor*>& parts, GgmlType type) {
  std::vector<std::byte> all;
  int rows = 0;
  const auto cols = static_cast<int>(parts.front()->shape[1]);
  for (const model::ParamTensor* t : parts) {
    const io::GgufTensorInfo& g = f.tensor(io::gguf_name_of(cfg, t->name));
    const auto part_rows = static_cast<int>(t->vocab_rows ? cfg.vocab_size : t->shape[0]);
    const std::span<const std::byte> bytes = f.bytes(g);
    const std::size_t at = all.size();
    all.resize(at + bytes.size());
    if (const std::int64_t heads = io::gguf_qk_heads(cfg, t->name))
      io::permute_qk_rows(bytes, std::span<std::byte>(all).subspan(at), heads, part_rows, true);
    else
      std::memcpy(all.data() + at, bytes.data(), bytes.size());
    rows += part_rows;
  }
  return quantized_from_ggml(type, all, rows, cols);
}

}  // namespace

QuantizedLinear quantized_from_ggml(GgmlType type, std::span<const std::byte> blocks, int rows,
                                    int cols) {
  TESSERA_CHECK(gguf_packable_type(type), "{} is not read as a quantized linear",
                io::ggml_type_name(type));
  const auto& info = io::ggml_type_info(type);
  const int ng = cols / 32;
  if (rows <= 0 || cols <= 0 || cols % 32 != 0 ||
      blocks.size() != static_cast<std::size_t>(rows) * ng * info.block_bytes)
    throw Error(fmt::format("{} blocks of {} bytes for a {}x{} matrix", io::ggml_type_name(type),
                            blocks.size(), rows, cols),
                "the file's tensor sizes disagree with its shapes; the file is damaged");
  QuantizedLinear ql;
  ql.rows = rows;
  ql.cols = cols;
  ql.spec = WeightQuant{type == GgmlType::Q8_0 ? 8 : 4, 32, type != GgmlType::Q4_1,
                        type == GgmlType::Q4_1};
  ql.q.resize(static_cast<std::size_t>(rows) * cols);
  ql.scales.resize(static_cast<std::size_t>(rows) * ng);
  ql.zeros.resize(ql.scales.size());
  ql.g_idx.resize(cols);
  for (int c = 0; c < cols; ++c) ql.g_idx[c] = c / 32;
  for (std::size_t b = 0; b < ql.scales.size(); ++b)
    decode_block(type, blocks.data() + b * info.block_bytes, ql.q.data() + b * 32, ql.scales[b],
                 ql.zeros[b]);
  return ql;
}

namespace {

// Each block linear's type (layer-major, in Lin order), where every one is of those read here,
// the same for its parts; else nullopt, with `why` saying which tensor is not (empty where the
// file lacks a tensor: the fp32 loader names it).
std::optional<std::vector<GgmlType>> linear_types(const io::GgufFile& f,
                                                  const model::ParamLayout& layout,
                                                  std::string& why) {
  const auto& cfg = layout.config();
  std::vector<GgmlType> types;
  for (int l = 0; l < cfg.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      const auto parts = linear_parts(layout, l, static_cast<Lin>(k));
      const auto first = type_of(f, cfg, *parts.front());
      for (const model::ParamTensor* t : parts) {
        const auto type = type_of(f, cfg, *t);
        if (!type) return std::nullopt;
        if (gguf_packable_type(*type) && type == first) continue;
        why = fmt::format(
            "tensor {} is {}{}; the packed kernels take GGUF's Q4_0, Q4_1 and Q8_0, "
            "one type per linear",
            io::gguf_name_of(cfg, t->name), io::ggml_type_name(*type),
            type != first ? fmt::format(" and {} {}", io::gguf_name_of(cfg, parts.front()->name),
                                        io::ggml_type_name(*first))
                          : "");
        return std::nullopt;
      }
      types.push_back(*first);
    }
  return types;
}

// The vocabulary matrices of a llama file that are of those types too (the others stay fp32).
std::vector<std::pair<const model::ParamTensor*, GgmlType>> vocab_types(
    const io::GgufFile& f, const model::ParamLayout& layout) {
  std::vector<std::pair<const model::ParamTensor*, GgmlType>> out;
  for (const auto& t : layout.tensors())
    if (t.vocab_rows && layout.config().llama())
      if (const auto type = type_of(f, layout.config(), t); type && gguf_packable_type(*type))
        out.emplace_back(&t, *type);
  return out;
}

}  // namespace

bool read_gguf_quantized(const io::GgufFile& f, const QuantizedSink& sink, AnyModel& out,
                         std::string& why) {
  const model::ModelConfig cfg = io::gguf_model_config(f);
  const model::ParamLayout layout(cfg);
  const auto types = linear_types(f, layout, why);
  if (!types) return false;
  const auto vocab = vocab_types(f, layout);
  const auto handed = [&](const model::ParamTensor& t) {
    if (!t.vocab_rows) return is_linear_weight(t);
    return std::any_of(vocab.begin(), vocab.end(), [&](const auto& v) { return v.first == &t; });
  };
  out.model = io::load_gguf_model(f, handed);
  for (int l = 0; l < cfg.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      const auto i = static_cast<std::size_t>(l) * k_num_lin + k;
      sink.linear(i,
                  read_matrix(f, cfg, linear_parts(layout, l, static_cast<Lin>(k)), (*types)[i]));
    }
  const bool mixed =
      std::any_of(types->begin(), types->end(), [&](GgmlType t) { return t != types->front(); });
  out.description =
      fmt::format("GGUF {} linears", mixed ? "Q4_0/Q4_1/Q8_0" : io::ggml_type_name(types->front()));
  for (const auto& [t, type] : vocab) {
    sink.vocab(t->offset, read_matrix(f, cfg, {t}, type));
    out.description += fmt::format(", {} {}", t->offset == layout.wte ? "embedding" : "head",
                                   io::ggml_type_name(type));
  }
  out.quantized = true;
  out.act = ActQuant{};
  return true;
}

}  // namespace tessera::quant
