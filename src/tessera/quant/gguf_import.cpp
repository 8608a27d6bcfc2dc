#include "tessera/quant/gguf_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/quant/packed.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {

using io::GgmlType;

bool gguf_packable_type(GgmlType type) {
  return io::ggml_codes(type) != nullptr;
}

namespace {

// A sub-block's scale as the packed form stores it: rounded to fp16 (exact for the types whose
// scale is an fp16 d; the K-quants' d * scale_j has up to 18 significant bits).
float fp16_scale(float scale) {
  const float s = round_scale(scale, ScaleType::F16);
  if (!std::isfinite(s))
    throw Error(fmt::format("a block scale of {} is beyond fp16's range", scale),
                "the file's scales are implausible; the file is damaged");
  return s;
}

// Group g of a row of a type with a min (value scale q + min) as s (q - zero), s the scale in
// fp16 and the zero point then real: -min / s, so that the value at q = 0 stays min. A scale
// that is 0 in fp16 (every value then min, up to 2^-25 q): codes 0, scale 1, zero -min.
void min_group(QuantizedLinear& ql, std::size_t g, float scale, float min) {
  const float s = fp16_scale(scale);
  if (s == 0.0f) {
    const int group = ql.spec.group;
    std::fill_n(ql.q.begin() + static_cast<std::ptrdiff_t>(g) * group, group, std::uint8_t{0});
    ql.scales[g] = 1.0f;
    ql.zeros[g] = -min;
    return;
  }
  ql.scales[g] = s;
  ql.zeros[g] = -min / s;
}

// The linear's scales and zeros for groups of 16 (each group of 32 as two of 16).
void split_groups(QuantizedLinear& ql) {
  const auto twice = [](const std::vector<float>& v) {
    std::vector<float> out(2 * v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[2 * i] = out[2 * i + 1] = v[i];
    return out;
  };
  ql.scales = twice(ql.scales);
  ql.zeros = twice(ql.zeros);
  ql.spec.group = 16;
  for (int c = 0; c < ql.cols; ++c) ql.g_idx[c] = c / 16;
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

// Parts' rows one after the other, as one linear: where their specs differ, on the widest codes
// (a symmetric part's codes shifted to its zero) with real zero points if any part has them, and
// on groups of 16 if any part has them.
QuantizedLinear join_rows(std::vector<QuantizedLinear> parts) {
  WeightQuant spec = parts.front().spec;
  for (const auto& p : parts) {
    spec.bits = std::max(spec.bits, p.spec.bits);
    spec.min_offset = spec.min_offset || p.spec.min_offset;
    spec.group = std::min(spec.group, p.spec.group);
  }
  spec.sym = !spec.min_offset;
  for (auto& p : parts) {
    if (p.spec.group != spec.group) split_groups(p);
    if (!spec.sym) continue;  // real zero points: the codes and zeros serve as they are
    const int shift = (1 << (spec.bits - 1)) - (1 << (p.spec.bits - 1));
    for (auto& q : p.q) q = static_cast<std::uint8_t>(q + shift);
    for (auto& z : p.zeros) z += static_cast<float>(shift);
  }
  QuantizedLinear out = std::move(parts.front());
  out.spec = spec;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    out.rows += parts[i].rows;
    out.q.insert(out.q.end(), parts[i].q.begin(), parts[i].q.end());
    out.scales.insert(out.scales.end(), parts[i].scales.begin(), parts[i].scales.end());
    out.zeros.insert(out.zeros.end(), parts[i].zeros.begin(), parts[i].zeros.end());
  }
  return out;
}

// The matrix of the parts (their rows one after the other; llama's q and k rows put back in
// Hugging Face's order) as a quantized linear.
QuantizedLinear read_matrix(const io::GgufFile& f, const model::ModelConfig& cfg,
                            const std::vector<const model::ParamTensor*>& parts) {
  std::vector<QuantizedLinear> read;
  for (const model::ParamTensor* t : parts) {
    const io::GgufTensorInfo& g = f.tensor(io::gguf_name_of(cfg, t->name));
    const auto rows = static_cast<int>(t->vocab_rows ? cfg.vocab_size : t->shape[0]);
    const std::span<const std::byte> bytes = f.bytes(g);
    std::vector<std::byte> rows_hf(bytes.size());
    if (const std::int64_t heads = io::gguf_qk_heads(cfg, t->name))
      io::permute_qk_rows(bytes, rows_hf, heads, rows, true);
    else
      std::memcpy(rows_hf.data(), bytes.data(), bytes.size());
    read.push_back(quantized_from_ggml(g.type, rows_hf, rows, static_cast<int>(t->shape[1])));
  }
  return join_rows(std::move(read));
}

}  // namespace

QuantizedLinear quantized_from_ggml(GgmlType type, std::span<const std::byte> blocks, int rows,
                                    int cols) {
  const io::GgmlCodes* codes = io::ggml_codes(type);
  TESSERA_CHECK(codes != nullptr, "{} is not read as a quantized linear", io::ggml_type_name(type));
  const auto& info = io::ggml_type_info(type);
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (rows <= 0 || cols <= 0 || cols % info.block_size != 0 ||
      blocks.size() != n / info.block_size * info.block_bytes)
    throw Error(fmt::format("{} blocks of {} bytes for a {}x{} matrix", io::ggml_type_name(type),
                            blocks.size(), rows, cols),
                "the file's tensor sizes disagree with its shapes; the file is damaged");
  QuantizedLinear ql;
  ql.rows = rows;
  ql.cols = cols;
  const int group = codes->sub;
  ql.spec = WeightQuant{codes->bits, group, !codes->has_min, codes->has_min};
  ql.q.resize(n);
  ql.scales.resize(n / group);
  ql.zeros.assign(n / group, static_cast<float>(codes->zero));
  ql.g_idx.resize(cols);
  for (int c = 0; c < cols; ++c) ql.g_idx[c] = c / group;
  std::vector<float> min(n / group);
  io::unpack_codes(type, blocks.data(), static_cast<std::int64_t>(n), ql.q.data(), ql.scales.data(),
                   min.data());
  for (std::size_t g = 0; g < ql.scales.size(); ++g)
    if (codes->has_min)
      min_group(ql, g, ql.scales[g], min[g]);
    else
      ql.scales[g] = fp16_scale(ql.scales[g]);
  return ql;
}

namespace {

// Whether every block linear's parts are of the types read here; else `why` names a tensor that
// is not (empty where the file lacks one: the fp32 loader names it). `types` collects the types.
bool linears_packable(const io::GgufFile& f, const model::ParamLayout& layout,
                      std::vector<GgmlType>& types, std::string& why) {
  const auto& cfg = layout.config();
  for (int l = 0; l < cfg.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k)
      for (const model::ParamTensor* t : linear_parts(layout, l, static_cast<Lin>(k))) {
        const auto type = type_of(f, cfg, *t);
        if (!type) return false;
        if (!gguf_packable_type(*type)) {
          why = fmt::format(
              "tensor {} is {}; the packed kernels take GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and "
              "Q2_K to Q6_K",
              io::gguf_name_of(cfg, t->name), io::ggml_type_name(*type));
          return false;
        }
        if (std::find(types.begin(), types.end(), *type) == types.end()) types.push_back(*type);
      }
  return true;
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

// What of `types` was not taken as the file has it: " (Q4_K scales rounded to fp16; ...)".
std::string rounding_notes(const std::vector<GgmlType>& types) {
  std::string notes;
  for (const GgmlType t : types) {
    const std::string_view name = io::ggml_type_name(t);
    if (t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_K || t == GgmlType::Q5_K ||
        t == GgmlType::Q6_K)
      notes += fmt::format("{}{} scales rounded to fp16", notes.empty() ? "" : "; ", name);
  }
  return notes.empty() ? notes : " (" + notes + ")";
}

}  // namespace

bool read_gguf_quantized(const io::GgufFile& f, const QuantizedSink& sink, AnyModel& out,
                         std::string& why) {
  const model::ModelConfig cfg = io::gguf_model_config(f);
  const model::ParamLayout layout(cfg);
  std::vector<GgmlType> types;
  if (!linears_packable(f, layout, types, why)) return false;
  const auto vocab = vocab_types(f, layout);
  const auto handed = [&](const model::ParamTensor& t) {
    if (!t.vocab_rows) return is_linear_weight(t);
    return std::any_of(vocab.begin(), vocab.end(), [&](const auto& v) { return v.first == &t; });
  };
  out.model = io::load_gguf_model(f, handed);
  for (int l = 0; l < cfg.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k)
      sink.linear(static_cast<std::size_t>(l) * k_num_lin + k,
                  read_matrix(f, cfg, linear_parts(layout, l, static_cast<Lin>(k))));
  std::string names;
  for (const GgmlType t : types)
    names += fmt::format("{}{}", names.empty() ? "" : "/", io::ggml_type_name(t));
  out.description = fmt::format("GGUF {} linears", names);
  for (const auto& [t, type] : vocab) {
    sink.vocab(t->offset, read_matrix(f, cfg, {t}));
    out.description += fmt::format(", {} {}", t->offset == layout.wte ? "embedding" : "head",
                                   io::ggml_type_name(type));
    if (std::find(types.begin(), types.end(), type) == types.end()) types.push_back(type);
  }
  out.description += rounding_notes(types);
  out.quantized = true;
  out.act = ActQuant{};
  return true;
}

}  // namespace tessera::quant
