// Packing a QuantizedLinear into the kernels' layout (see packed.hpp), scale encodings and the
// choice of instruction set. The kernels are in packed_kernels.cpp.
#include "tessera/quant/packed.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "tessera/core/cpu.hpp"
#include "tessera/core/error.hpp"

namespace tessera::quant {

const char* scale_type_name(ScaleType t) {
  return t == ScaleType::F16 ? "fp16" : "bf16";
}

std::uint16_t encode_scale(float s, ScaleType t) {
  if (t == ScaleType::F16) return _cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT);
  std::uint32_t u;
  std::memcpy(&u, &s, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even (scales are finite)
  return static_cast<std::uint16_t>(u >> 16);
}

float decode_scale(std::uint16_t h, ScaleType t) {
  std::uint32_t u;
  if (t == ScaleType::BF16) {
    u = std::uint32_t(h) << 16;
  } else {
    const std::uint32_t sign = std::uint32_t(h >> 15) << 31, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0) {  // zero or subnormal: m * 2^-24
      const float v = std::ldexp(static_cast<float>(m), -24);
      return sign ? -v : v;
    }
    u = sign | (e == 31 ? (255u << 23) : ((e + 112u) << 23)) | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

const char* isa_name(Isa isa) {
  return isa == Isa::Avx512 ? "avx512" : (isa == Isa::Avx2 ? "avx2" : "portable");
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Portable:
      return true;
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::Avx512:
      return isa_supported(Isa::Avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return false;
}

void require_isa(Isa isa) {
  if (!isa_supported(isa))
    throw Error(fmt::format("this CPU cannot run the {} kernels", isa_name(isa)),
                "use quant::best_isa() (or set ONEDNN_MAX_CPU_ISA=AVX2)");
}

Isa best_isa() {
  Isa cap = Isa::Avx512;
  if (const char* env = std::getenv("ONEDNN_MAX_CPU_ISA"); env && *env) {
    std::string v(env);
    for (char& ch : v) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (v.rfind("SSE", 0) == 0 || v == "AVX" || v == "DEFAULT")
      cap = Isa::Portable;
    else if (v.rfind("AVX2", 0) == 0)
      cap = Isa::Avx2;
  }
  for (Isa isa : {Isa::Avx512, Isa::Avx2})
    if (static_cast<int>(isa) <= static_cast<int>(cap) && isa_supported(isa)) return isa;
  return Isa::Portable;
}

std::int64_t PackedLinear::bytes() const {
  return static_cast<std::int64_t>(codes.size() + zeros.size() + 4 * real_zeros.size() +
                                   2 * scales.size() + 4 * perm.size() + 4 * in_scale.size());
}

double PackedLinear::bits_per_weight() const {
  return 8.0 * static_cast<double>(bytes()) / (static_cast<double>(rows) * cols);
}

std::string PackedLinear::describe() const {
  return fmt::format(
      "W{} {} {} {}", bits, ngroups == 1 ? std::string("per-channel") : fmt::format("g{}", group),
      sym ? "sym" : (real_zeros.empty() ? "asym" : "asym-min"), scale_type_name(scale_type));
}

namespace {

// Where the code of (row r, packed column j) lives in its block (the layout in packed.hpp):
// byte (in the block) and bit shift; the 3-bit third bit and the 5-bit fifth bit in hi_byte /
// hi_shift.
struct CodeSite {
  int byte, shift, hi_byte, hi_shift;
};
CodeSite code_site(int storage_bits, int r, int j) {
  const int c = j % 32, m = c / 4, lane = 4 * (r % k_tile_rows) + c % 4;
  if (storage_bits == 8) return {32 * m + lane, 0, 0, 0};
  if (storage_bits == 4) return {32 * (m / 2) + lane, 4 * (m % 2), 0, 0};
  if (storage_bits == 5) return {32 * (m / 2) + lane, 4 * (m % 2), 128 + lane, m};
  return {32 * (m / 4) + lane, 2 * (m % 4), 64 + lane, m};
}

// Sets the code of (row r, packed column j) in codes that start zeroed.
void set_code(PackedLinear& p, int r, int j, int code) {
  const CodeSite at = code_site(p.storage_bits, r, j);
  std::uint8_t* blk = p.codes.data() + p.block_offset(r / k_tile_rows, j / 32);
  if (p.storage_bits == 3 || p.storage_bits == 5) {
    const int low = p.storage_bits - 1;  // bits below the one in its own plane
    blk[at.byte] |= static_cast<std::uint8_t>((code & ((1 << low) - 1)) << at.shift);
    blk[at.hi_byte] |= static_cast<std::uint8_t>(((code >> low) & 1) << at.hi_shift);
  } else {
    blk[at.byte] |= static_cast<std::uint8_t>(code << at.shift);
  }
}

// perm (cols) ordering the columns by group, stably; empty if the groups are already contiguous.
// Every group must hold as many columns as the contiguous layout gives it.
std::vector<std::int32_t> group_order(const QuantizedLinear& ql, int G, int ng) {
  const int cols = ql.cols;
  if (static_cast<int>(ql.g_idx.size()) != cols)
    throw Error(fmt::format("g_idx has {} entries for {} columns", ql.g_idx.size(), cols),
                "a quantized linear records the group of every input column");
  std::vector<int> count(ng, 0);
  bool contiguous = true;
  for (int c = 0; c < cols; ++c) {
    const int g = ql.g_idx[c];
    if (g < 0 || g >= ng)
      throw Error(fmt::format("g_idx[{}] = {} is outside 0..{}", c, g, ng - 1),
                  "the linear's g_idx and scales disagree; re-quantize it");
    ++count[g];
    contiguous = contiguous && g == c / G;
  }
  for (int g = 0; g < ng; ++g)
    if (count[g] != std::min(G, cols - g * G))
      throw Error(fmt::format("group {} holds {} columns, expected {}", g, count[g],
                              std::min(G, cols - g * G)),
                  "the packed kernels take groups of the group size (act-order is reordered)");
  if (contiguous) return {};
  std::vector<std::int32_t> perm(cols);
  for (int c = 0; c < cols; ++c) perm[c] = c;
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int a, int b) { return ql.g_idx[a] < ql.g_idx[b]; });
  return perm;
}

void check_shapes(const QuantizedLinear& ql, int ng) {
  const auto n = static_cast<std::size_t>(ql.rows) * ql.cols;
  const auto nq = static_cast<std::size_t>(ql.rows) * ng;
  if (ql.rows <= 0 || ql.cols <= 0 || ql.q.size() != n || ql.scales.size() != nq ||
      ql.zeros.size() != nq || (!ql.in_scale.empty() && ql.in_scale.size() != size_t(ql.cols)))
    throw Error(fmt::format("quantized linear {}x{} ({}) has inconsistent sizes", ql.rows, ql.cols,
                            describe(ql.spec)),
                "codes (rows*cols), scales and zeros (rows*groups), in_scale (cols) or empty");
}

// The min_offset grid's zero points, as they are (fp32): any finite value.
void pack_real_zeros(PackedLinear& p, const QuantizedLinear& ql) {
  p.sym = false;
  p.real_zeros.assign(p.scales.size(), 0.0f);
  for (std::size_t i = 0; i < ql.zeros.size(); ++i) {
    if (!std::isfinite(ql.zeros[i]))
      throw Error(fmt::format("zero point {} is not a finite number", ql.zeros[i]),
                  "the linear's zero points are damaged; re-quantize it");
    p.real_zeros[p.group_index(static_cast<int>(i / p.ngroups), i % p.ngroups)] = ql.zeros[i];
  }
}

// Scales and zeros of every (row, group); sym stays true only if every zero is the middle code.
void pack_scales(PackedLinear& p, const QuantizedLinear& ql) {
  const int maxq = (1 << p.bits) - 1;
  const std::size_t n = static_cast<std::size_t>(p.tiles()) * p.ngroups * k_tile_rows;
  p.scales.assign(n, 0);  // padding rows: scale 0
  for (std::size_t i = 0; i < ql.scales.size(); ++i) {
    const float s = ql.scales[i];
    const std::size_t at = p.group_index(static_cast<int>(i / p.ngroups), i % p.ngroups);
    p.scales[at] = encode_scale(s, p.scale_type);
    const float back = decode_scale(p.scales[at], p.scale_type);
    if (!std::isfinite(back) || (back == 0.0f && s != 0.0f))
      throw Error(fmt::format("scale {} does not fit {}", s, scale_type_name(p.scale_type)),
                  "pack with bf16 scales, which have fp32's range");
  }
  if (ql.spec.min_offset && !ql.spec.sym) return pack_real_zeros(p, ql);
  for (float z : ql.zeros) {
    if (z != std::nearbyint(z) || z < 0.0f || z > static_cast<float>(maxq))
      throw Error(fmt::format("zero point {} is not an integer code 0..{}", z, maxq),
                  "the packed form stores zeros as integer codes (RTN, GPTQ and AWQ write them)");
    p.sym = p.sym && static_cast<int>(z) == p.zero_code();
  }
  if (!p.sym) {
    p.zeros.assign(n, 0);
    for (std::size_t i = 0; i < ql.zeros.size(); ++i)
      p.zeros[p.group_index(static_cast<int>(i / p.ngroups), i % p.ngroups)] =
          static_cast<std::uint8_t>(ql.zeros[i]);
  }
}

}  // namespace

PackedLinear pack(const QuantizedLinear& ql, ScaleType scale_type) {
  validate(ql.spec);
  const int cols = ql.cols;
  const int G = ql.spec.group <= 0 ? cols : std::min(ql.spec.group, cols);
  const int ng = (cols + G - 1) / G;
  check_shapes(ql, ng);
  if (ng > 1 && G % 32 != 0 && !(G == 16 && cols % 32 == 0))
    throw Error(fmt::format("group size {} cannot be packed", ql.spec.group),
                "the packed kernels take group sizes that are multiples of 32 (32, 64, 128), 16 "
                "(rows of a multiple of 32) or per channel (--group -1)");
  PackedLinear p;
  p.rows = ql.rows;
  p.cols = cols;
  p.colsp = (cols + 31) / 32 * 32;
  p.bits = ql.spec.bits;
  p.storage_bits = p.bits <= 3 ? 3 : (p.bits <= 5 ? p.bits : 8);
  p.group = ng == 1 ? p.colsp : G;
  p.ngroups = ng;
  p.sym = ql.spec.sym;
  p.scale_type = scale_type;
  pack_scales(p, ql);
  std::vector<std::int32_t> order = group_order(ql, G, ng);
  const int maxq = (1 << p.bits) - 1;
  p.codes.assign(static_cast<std::size_t>(p.tiles()) * (p.colsp / 32) * p.block_bytes(), 0);
  for (int r = 0; r < p.rows; ++r) {
    const std::uint8_t* qr = ql.q.data() + static_cast<std::size_t>(r) * cols;
    for (int j = 0; j < cols; ++j) {
      const int code = qr[order.empty() ? j : order[j]];
      if (code > maxq)
        throw Error(fmt::format("code {} exceeds the {}-bit maximum {}", code, p.bits, maxq),
                    "the linear's codes and bit width disagree; re-quantize it");
      set_code(p, r, j, code);
    }
  }
  if (!order.empty()) {
    p.perm.assign(order.begin(), order.end());
    for (int j = cols; j < p.colsp; ++j) p.perm.push_back(0);  // padding: the input there is 0
  }
  if (!ql.in_scale.empty()) {
    p.in_scale.assign(p.colsp, 1.0f);
    for (int j = 0; j < cols; ++j) p.in_scale[j] = ql.in_scale[order.empty() ? j : order[j]];
  }
  return p;
}

float PackedLinear::scale(int r, int g) const {
  return decode_scale(scales[group_index(r, g)], scale_type);
}

int PackedLinear::code(int r, int j) const {
  const CodeSite at = code_site(storage_bits, r, j);
  const std::uint8_t* blk = block(r / k_tile_rows, j / 32);
  if (storage_bits == 8) return blk[at.byte];
  if (storage_bits == 4) return (blk[at.byte] >> at.shift) & 15;
  if (storage_bits == 5)
    return ((blk[at.byte] >> at.shift) & 15) | (((blk[at.hi_byte] >> at.hi_shift) & 1) << 4);
  return ((blk[at.byte] >> at.shift) & 3) | (((blk[at.hi_byte] >> at.hi_shift) & 1) << 2);
}

void PackedLinear::dequantize_row(int r, float* w) const {
  for (int j = 0; j < cols; ++j) {
    const float s = scale(r, j / group);
    const float z = zero(r, j / group);
    float v = s * (static_cast<float>(code(r, j)) - z);
    if (!in_scale.empty()) v /= in_scale[j];
    w[perm.empty() ? j : perm[j]] = v;
  }
}

void PackedLinear::dequantize(float* w) const {
  for (int r = 0; r < rows; ++r) dequantize_row(r, w + static_cast<std::size_t>(r) * cols);
}

QuantizedLinear with_rounded_scales(const QuantizedLinear& ql, ScaleType scale_type) {
  QuantizedLinear out = ql;
  for (float& s : out.scales) s = round_scale(s, scale_type);
  return out;
}

}  // namespace tessera::quant
