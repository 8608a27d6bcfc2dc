#include "tessera/quant/gguf_export.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/quant/packed.hpp"
#include "tessera/quant/packed_model.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {

namespace {

using io::GgmlType;

// Why the packed linear's codes do not carry over into `type` ("" when they do).
std::string grid_problem(const PackedLinear& p, GgmlType type) {
  if (!p.perm.empty()) return "act-order columns (GGUF blocks are runs of columns)";
  if (!p.in_scale.empty()) return "AWQ input scales (no GGUF field holds them)";
  if (p.scale_type != ScaleType::F16) return "bf16 scales (GGUF's are fp16)";
  if (type == GgmlType::Q8_0)
    return p.sym ? "" : "an asymmetric grid (Q8_0 has no offset: use Q4_1 or symmetric codes)";
  if (p.bits > 4) return fmt::format("{}-bit codes in a 4-bit type", p.bits);
  if (type == GgmlType::Q4_0 && !p.sym) return "an asymmetric grid (Q4_0 has no offset: use Q4_1)";
  return "";
}

// Row r of p as `type` blocks at out (grid_problem(p, type) must be "").
void encode_row(const PackedLinear& p, int r, GgmlType type, std::byte* out) {
  const std::int64_t block_bytes = io::ggml_type_info(type).block_bytes;
  for (int b = 0; b < p.cols / 32; ++b) {
    const int g = b * 32 / p.group;
    const std::uint16_t d = p.scales[p.group_index(r, g)];
    const float zero = p.zero(r, g);  // an integer code unless the grid is min_offset's (Q4_1)
    std::byte* blk = out + b * block_bytes;
    std::memcpy(blk, &d, 2);
    if (type == GgmlType::Q8_0) {
      for (int i = 0; i < 32; ++i)
        blk[2 + i] = static_cast<std::byte>(
            static_cast<std::int8_t>(p.code(r, b * 32 + i) - static_cast<int>(zero)));
      continue;
    }
    std::byte* qs = blk + (type == GgmlType::Q4_1 ? 4 : 2);
    if (type == GgmlType::Q4_1) {
      const std::uint16_t m = io::fp32_to_fp16(-decode_scale(d, ScaleType::F16) * zero);
      std::memcpy(blk + 2, &m, 2);
    }
    const int shift = type == GgmlType::Q4_0 ? 8 - static_cast<int>(zero) : 0;  // n = q - zero + 8
    for (int i = 0; i < 16; ++i) {
      const int lo = p.code(r, b * 32 + i) + shift, hi = p.code(r, b * 32 + i + 16) + shift;
      qs[i] = static_cast<std::byte>(lo | (hi << 4));
    }
  }
}

struct Exporter {
  const AnyModel& any;
  const model::ParamLayout& layout;
  const std::optional<PackedModel>& packed;
  std::string pack_problem;  // why nothing packs, or ""
  GgufExportReport& report;
  double diff_sq = 0, weight_sq = 0, weights = 0, bytes = 0;

  // The linear (layer * k_num_lin + k) whose weight holds the layout offset, or -1.
  int linear_at(std::int64_t offset) const {
    for (int l = 0; l < layout.config().n_layer; ++l)
      for (int k = 0; k < k_num_lin; ++k) {
        const auto begin = static_cast<std::int64_t>(lin_weight_offset(layout, l, Lin(k)));
        const auto& q = any.linears[static_cast<std::size_t>(l) * k_num_lin + k];
        if (offset >= begin && offset < begin + static_cast<std::int64_t>(q.rows) * q.cols)
          return l * k_num_lin + k;
      }
    return -1;
  }

  std::optional<std::vector<std::byte>> operator()(std::int64_t offset, std::int64_t rows,
                                                   std::int64_t cols, GgmlType type) {
    const int i = linear_at(offset);
    if (i < 0 || type == GgmlType::F16) return std::nullopt;  // embeddings; unblockable rows
    const std::int64_t row_bytes =
        cols / io::ggml_type_info(type).block_size * io::ggml_type_info(type).block_bytes;
    std::vector<std::byte> out(static_cast<std::size_t>(rows * row_bytes));
    const auto begin =
        static_cast<std::int64_t>(lin_weight_offset(layout, i / k_num_lin, Lin(i % k_num_lin)));
    const int row0 = static_cast<int>((offset - begin) / cols);
    const std::string why = packed ? grid_problem(packed->linears[i], type) : pack_problem;
    const float* w = any.model.params.data() + offset;  // tessera's dequantized weights
    std::vector<float> back(static_cast<std::size_t>(cols));
    for (std::int64_t r = 0; r < rows; ++r) {
      std::byte* dst = out.data() + r * row_bytes;
      if (why.empty())
        encode_row(packed->linears[i], row0 + static_cast<int>(r), type, dst);
      else
        io::quantize_row(type, w + r * cols, dst, cols);
      io::dequantize_row(type, dst, back.data(), cols);
      for (std::int64_t c = 0; c < cols; ++c) {
        const double x = w[r * cols + c], e = back[c] - x;
        report.max_abs_diff = std::max(report.max_abs_diff, std::fabs(e));
        diff_sq += e * e;
        weight_sq += x * x;
      }
    }
    if (row0 == 0) {  // the first part of a linear: counted once
      ++report.linears;
      if (why.empty())
        ++report.exact;
      else
        report.redone.push_back(
            fmt::format("layer {} linear {}: {}", i / k_num_lin, i % k_num_lin, why));
    }
    weights += static_cast<double>(rows * cols);
    bytes += static_cast<double>(out.size());
    return out;
  }
};

}  // namespace

std::string GgufExportReport::summary() const {
  std::string s = fmt::format(
      "{} of {} linears carried onto the GGUF grid exactly (codes kept, scales fp16), {} "
      "quantized again; file vs tessera's weights: max |diff| {:.3g}, relative RMS {:.3g}; {:.2f} "
      "bits per weight",
      exact, linears, redone.size(), max_abs_diff, rel_rms_diff, bits_per_weight);
  for (const auto& r : redone) s += "\n  quantized again: " + r;
  return s;
}

GgufExportReport save_quantized_gguf(const std::filesystem::path& out, const AnyModel& any,
                                     io::GgmlType type, const data::BpeVocab* vocab) {
  if (!any.quantized)
    throw Error("the model is not a tessera quantized file",
                "quantize it first, or write an fp32 model with tessera convert --dtype");
  if (type != GgmlType::Q4_0 && type != GgmlType::Q4_1 && type != GgmlType::Q8_0)
    throw Error("a quantized model is written as Q4_0, Q4_1 or Q8_0");
  if (any.act.mode != ActMode::None)
    throw Error(
        fmt::format("{} quantizes activations, which a GGUF file cannot say", any.description),
        "export a weight-only method (rtn, gptq, awq)");
  std::optional<PackedModel> packed;
  std::string pack_problem;
  try {
    packed = pack_model(any, ScaleType::F16, Isa::Portable);
  } catch (const Error& e) {
    pack_problem = e.what();
  }
  const model::ParamLayout layout(any.model.config);
  GgufExportReport report;
  Exporter ex{any, layout, packed, pack_problem, report};
  auto w = io::gguf_model_writer(layout, any.model.params.data(), type, vocab, out.stem().string(),
                                 std::ref(ex));
  report.rel_rms_diff = ex.weight_sq > 0 ? std::sqrt(ex.diff_sq / ex.weight_sq) : 0;
  report.bits_per_weight = ex.weights > 0 ? 8 * ex.bytes / ex.weights : 0;
  w.set_metadata("tessera.quantization.description", io::GgufValue::string(any.description));
  for (const auto& [k, v] : any.info)
    w.set_metadata("tessera.quantization." + k, io::GgufValue::string(v));
  w.set_metadata("tessera.quantization.bits_per_weight",
                 io::GgufValue::f32(static_cast<float>(report.bits_per_weight)));
  w.set_metadata("tessera.quantization.gguf_mapping", io::GgufValue::string(report.summary()));
  w.write(out);
  return report;
}

}  // namespace tessera::quant
