#include "tessera/quant/packed_model.hpp"

#include <algorithm>
#include <memory>

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {

std::int64_t PackedModel::bytes() const {
  std::int64_t b = 0;
  for (const auto& l : linears) b += l.bytes();
  return b;
}

double PackedModel::bits_per_weight() const {
  double weights = 0;
  for (const auto& l : linears) weights += static_cast<double>(l.rows) * l.cols;
  return weights > 0 ? 8.0 * static_cast<double>(bytes()) / weights : 0.0;
}

model::DecoderLinear PackedModel::decoder_linear() const {
  int max_rows = 0;
  for (const auto& l : linears) max_rows = std::max(max_rows, l.rows);
  auto tmp = std::make_shared<std::vector<float>>(max_rows);  // (OC) for accumulating linears
  return [this, tmp](int layer, int which, float* out, const float* in, const float* bias,
                     bool accumulate) {
    const PackedLinear& w = linears[static_cast<std::size_t>(layer) * k_num_lin + which];
    if (!accumulate) {
      packed_matvec(w, out, in, bias, isa);
      return;
    }
    packed_matvec(w, tmp->data(), in, bias, isa);
    for (int r = 0; r < w.rows; ++r) out[r] += (*tmp)[r];
  };
}

void PackedModel::dequantize_into(const model::ParamLayout& layout, float* params) const {
  for (int l = 0; l < config.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k)
      linears[static_cast<std::size_t>(l) * k_num_lin + k].dequantize(
          params + lin_weight_offset(layout, l, static_cast<Lin>(k)));
}

std::int64_t PackedModel::release_linear_weights(const model::ParamLayout& layout,
                                                 float* params) const {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::int64_t released = 0;
  for (int l = 0; l < config.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      const PackedLinear& w = linears[static_cast<std::size_t>(l) * k_num_lin + k];
      const float* p = params + lin_weight_offset(layout, l, static_cast<Lin>(k));
      const auto begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
      const auto end =
          reinterpret_cast<std::uintptr_t>(p + static_cast<std::size_t>(w.rows) * w.cols) / page *
          page;
      if (end > begin && madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) == 0)
        released += static_cast<std::int64_t>(end - begin);
    }
  return released;
}

PackedModel pack_model(const AnyModel& any, ScaleType scale_type, Isa isa) {
  const auto& cfg = any.model.config;
  if (!any.quantized || any.linears.size() != static_cast<std::size_t>(cfg.n_layer) * k_num_lin)
    throw Error("the model is not a tessera quantized file",
                "quantize it first: tessera quantize -m MODEL -o DIR --method rtn");
  if (any.act.mode != ActMode::None)
    throw Error(fmt::format("{} quantizes activations too; the packed kernels are weight-only",
                            any.description),
                "sample it with the simulated path (the dequantized fp32 weights)");
  PackedModel pm;
  pm.config = cfg;
  pm.isa = isa;
  pm.linears.reserve(any.linears.size());
  for (const auto& q : any.linears) pm.linears.push_back(pack(q, scale_type));
  return pm;
}

}  // namespace tessera::quant
