// Packed quantized linears and the kernels that compute from them (W4A16 / W8A16 style, fp32
// activations): the weight stays in its packed form (int4 codes two per byte, int3 and int5
// densely, int8 codes one per byte, one fp16 or bf16 scale and one integer zero per (row, group))
// and is decoded in registers (matrix-vector) or one tile of 64 rows at a time (matrix-matrix),
// never as a whole fp32 copy.
//
// Layout of a PackedLinear (rows = OC output rows, cols = IC input columns):
//  - Columns are in "packed order": act-order g_idx is converted at pack time by a stable sort of
//    the columns by group (perm[j] = the original column stored at j), so every group is a run of
//    contiguous columns; the kernels gather the input through perm. Each row is padded with
//    zero-code columns to colsp (a multiple of 32); the padded inputs are zero.
//  - Rows come in tiles of 8 (k_tile_rows), the last one padded with zero rows (zero codes and
//    scales). A tile is stored block after block (a block: 32 columns of its 8 rows), and inside
//    a block the rows are interleaved four columns at a time: the codes of columns 4m..4m+3 of
//    the 8 rows form one 32-byte vector, row r in its bytes 4r..4r+3 (the "vector m" of the
//    block, m = 0..7). A matrix-vector kernel multiplies vector m by columns 4m..4m+3 of the
//    input broadcast to every row, so 8 output rows accumulate in the lanes of one register and
//    the weights stream from one place. Storage of a block's vectors:
//      8-bit (bits 6..8): 256 bytes, vector m at byte 32m;
//      4-bit (bits 4): 128 bytes, the low nibbles of bytes 32k..32k+31 are vector 2k, the high
//        nibbles vector 2k + 1;
//      5-bit (bits 5): 160 bytes: bytes 0..127 hold the low four bits as the 4-bit layout does;
//        bit m of bytes 128..159 holds the fifth bit of vector m;
//      3-bit (bits 2..3): 96 bytes: bits 2s..2s+1 of bytes 0..31 hold the low two bits of vector
//        s and those of bytes 32..63 of vector 4 + s (s = 0..3); bit m of bytes 64..95 holds the
//        third bit of vector m.
//  - A group is `group` columns (a multiple of 32; per channel: the whole padded row); the last
//    group of a row may be shorter (576 = 4 x 128 + 64). Block b of a row belongs to group
//    b * 32 / group. Or 16 (llama.cpp's Q6_K), for rows of a multiple of 32 columns: block b then
//    holds groups 2b (its vectors 0..3) and 2b + 1 (vectors 4..7).
//  - scales as fp16 or bf16 bits and zeros as uint8 codes (asymmetric formats; symmetric ones
//    store none: zero = (maxq + 1) / 2), tiled as the codes: the 8 rows of a tile side by side
//    per group, (row, group) at group_index(row, group).
//  - in_scale (AWQ, colsp in packed order, or empty): the input is divided by it before the dot
//    product, which is the dequantized weight's division of its columns.
// Dequantized weight: w[r, perm[j]] = scale[r, j / group] * (q[r, j] - zero[r, j / group]) /
// in_scale[j], the same as QuantizedLinear::dequantize up to the rounding of the scales.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/quant/quantizer.hpp"

namespace tessera::quant {

enum class ScaleType { F16, BF16 };
const char* scale_type_name(ScaleType t);          // "fp16" | "bf16"
std::uint16_t encode_scale(float s, ScaleType t);  // round to nearest even
float decode_scale(std::uint16_t bits, ScaleType t);
inline float round_scale(float s, ScaleType t) {
  return decode_scale(encode_scale(s, t), t);
}

// The instruction set a kernel runs with. best_isa() is what this CPU supports, capped by
// ONEDNN_MAX_CPU_ISA when it names AVX2 (or SSE4.1: portable), the variable the project already
// uses to force the AVX2 kernels of oneDNN; every kernel also takes the ISA as an argument.
enum class Isa { Portable, Avx2, Avx512 };
const char* isa_name(Isa isa);  // "portable" | "avx2" | "avx512"
bool isa_supported(Isa isa);    // by this CPU
void require_isa(Isa isa);      // throws tessera::Error (with a hint) where !isa_supported
Isa best_isa();

constexpr int k_tile_rows = 8;

// f.template operator()<SB>() for the storage width sb (3, 4, 5 or 8) as a constant: the kernels'
// dispatch to their bodies for each layout.
template <typename F>
decltype(auto) with_storage(int sb, F&& f) {
  switch (sb) {
    case 3:
      return f.template operator()<3>();
    case 4:
      return f.template operator()<4>();
    case 5:
      return f.template operator()<5>();
    default:
      return f.template operator()<8>();
  }
}

struct PackedLinear {
  int rows = 0, cols = 0;  // (OC, IC) of the original linear
  int colsp = 0;           // cols padded to a multiple of 32
  int bits = 4;            // the codes' bit width (2..8)
  int storage_bits = 4;    // 3 (dense), 4 (two codes per byte), 5 (dense) or 8
  int group = 0;           // columns per group in packed order (a multiple of 32, or 16)
  int ngroups = 0;
  bool sym = false;
  ScaleType scale_type = ScaleType::F16;
  std::vector<std::uint8_t> codes;    // (tiles(), colsp / 32, block_bytes())
  std::vector<std::uint16_t> scales;  // (tiles(), ngroups, 8)
  std::vector<std::uint8_t> zeros;    // (tiles(), ngroups, 8); empty if sym or real zeros
  // Zero points that are not codes, laid out as zeros (fp32): the min_offset grid, llama.cpp's
  // Q4_1 (w = s (q - z) = d q + min with z = -min / d); empty otherwise.
  std::vector<float> real_zeros;
  std::vector<std::int32_t> perm;  // (colsp): original column of packed column j; empty = identity
  std::vector<float> in_scale;     // (colsp) in packed order (1 in the padding), or empty

  int tiles() const { return (rows + k_tile_rows - 1) / k_tile_rows; }
  int block_bytes() const { return 32 * storage_bits; }  // 8 rows x 32 columns
  // Where block b (columns 32b..32b+31) of tile t starts in codes, and its codes.
  std::size_t block_offset(int t, int b) const {
    return (static_cast<std::size_t>(t) * (colsp / 32) + b) * block_bytes();
  }
  const std::uint8_t* block(int t, int b) const { return codes.data() + block_offset(t, b); }
  std::size_t group_index(int r, int g) const {  // of (row, group) in scales and zeros
    return (static_cast<std::size_t>(r / k_tile_rows) * ngroups + g) * k_tile_rows +
           r % k_tile_rows;
  }
  int zero_code() const { return (1 << (bits - 1)); }  // symmetric formats: (maxq + 1) / 2
  float zero(int r, int g) const {
    if (sym) return static_cast<float>(zero_code());
    return real_zeros.empty() ? zeros[group_index(r, g)] : real_zeros[group_index(r, g)];
  }
  float scale(int r, int g) const;
  int code(int r, int j) const;  // of row r, packed column j
  // Bytes of the weight as the kernels read it (codes, scales, zeros; perm and in_scale too).
  std::int64_t bytes() const;
  // bytes() * 8 / (rows * cols): 4 + 16/128 + 8/128 = 4.19 for W4 g128 asym, 3.19 for W3.
  double bits_per_weight() const;
  std::string describe() const;                // "W4 g128 asym fp16", "W4 g32 asym-min fp16"
  void dequantize(float* w) const;             // w (rows, cols), original column order
  void dequantize_row(int r, float* w) const;  // w (cols): row r, original column order
};

// Packs a quantized linear. Throws tessera::Error (with a hint) for what the packed form cannot
// hold: a group size that is not a multiple of 32 (or per channel), zeros that are not integer
// codes in range (unless spec.min_offset: then any finite zeros, kept as real_zeros), a g_idx whose
// groups are not the sizes of contiguous groups, mismatched sizes.
PackedLinear pack(const QuantizedLinear& ql, ScaleType scale_type = ScaleType::F16);

// The same linear with its scales rounded to scale_type (what pack stores): its dequantize is
// the fp32 reference the packed kernels must match up to summation order.
QuantizedLinear with_rounded_scales(const QuantizedLinear& ql, ScaleType scale_type);

// y (OC) = W x (IC) + bias (OC, may be null). OpenMP over output rows; fp32 accumulation.
void packed_matvec(const PackedLinear& w, float* y, const float* x, const float* bias, Isa isa);
// Its body on the calling thread alone (the caller shares the tiles among threads and has
// checked isa_supported): y[r] = (or += when accumulate) (W x)[r] + bias[r] for the rows of tiles
// t0 <= t < t1.
void packed_matvec_tiles(const PackedLinear& w, float* y, const float* x, const float* bias,
                         bool accumulate, int t0, int t1, Isa isa);
// How packed_matvec_q8 scales the int8 input: one scale per block of 32 columns (the decoder's
// default for weight-only files, as llama.cpp quantizes activations), or one for the whole input
// (per token: what W8A8 and SmoothQuant files quantize their activations with).
enum class ActScale { PerBlock, PerRow };

// y (OC) = W x^ (IC) + bias with x^ = x quantized to int8 (in packed order, after in_scale):
// x^ = round(x / d) d with d = max |x| / 127 over each block or the row, each block then one
// integer dot product of codes and int8 inputs: AVX-512 VNNI's dpbusd where the CPU has it (isa
// Avx512), AVX2's maddubs otherwise, plain loops for Portable.
// |y - W x| <= sum_c |w[r, c]| d[block of c] / 2 plus fp32 summation error.
void packed_matvec_q8(const PackedLinear& w, float* y, const float* x, const float* bias, Isa isa,
                      ActScale scale = ActScale::PerBlock);
// The integer dot product packed_matvec_q8 uses with isa: "avx512-vnni dpbusd", "avx2 maddubs"
// or "portable".
const char* q8_dot_name(Isa isa);
// The int8 input of packed_matvec_q8 in packed order: xq (colsp) codes, d (colsp / 32) block
// scales, xs (ngroups) the quantized input's group sums; xp the prepared fp32 input it came from.
// A caller that keeps one between products reuses its storage.
struct Q8Input {
  std::vector<std::int8_t> xq;
  std::vector<float> d, xs, xp;
};
void quantize_q8(const PackedLinear& w, const float* x, ActScale scale, Isa isa, Q8Input& in);
// packed_matvec_q8's body on the calling thread alone, for callers that share the tiles among
// threads themselves (and have checked isa_supported): y[r] = (or += when accumulate) (W x^)[r] +
// bias[r] for the rows of tiles t0 <= t < t1, x^ as quantize_q8 made it for w.
void packed_matvec_q8_tiles(const PackedLinear& w, const Q8Input& in, float* y, const float* bias,
                            bool accumulate, int t0, int t1, Isa isa);
// Y (N, rows) = X (N, cols) W^T + bias (may be null), each row of X rounded to int8 as
// packed_matvec_q8 rounds it (so row n of Y is packed_matvec_q8 of row n of X, bit for bit): runs
// of tiles, the codes of a run read once from memory for all N rows, each block's codes unpacked
// once for four rows at a time (with VNNI, two tiles' blocks at once). A prompt's products in the
// decoder's prefill when it decodes with int8 activations.
//
// With VNNI the prompt kernel holds its two tiles either in the two halves of each 512-bit
// register (one dpbusd and one unpacking instruction for both) or in two 256-bit ones. The rows
// are the same bit for bit; which is faster depends on the core: one that runs 512-bit integer
// operations at full width (a Zen 5) took the 512-bit kernel 1.3x faster, one that splits them
// in two (a Zen 4) may not. Auto takes prompt_width()'s choice when isa is Avx512; W512 without
// VNNI (or with isa Avx2) runs as W256.
enum class PromptWidth { Auto, W256, W512 };
void packed_matmul_q8(const PackedLinear& w, float* Y, const float* X, const float* bias,
                      std::int64_t N, Isa isa, ActScale scale = ActScale::PerBlock,
                      PromptWidth width = PromptWidth::Auto);
// The width Auto takes on this machine, timed once per process on its first call (0.22 ms on
// a Zen 5): both kernels on one thread over a product that stays in cache (64 rows x 512
// columns of 4-bit codes, four tokens), rounds of each taking turns, the best round of each;
// W512 where it ran at least 5% faster. speedup: the 256-bit kernel's time over the 512-bit
// one's (0 without VNNI, where the choice is W256 untimed).
struct PromptWidthChoice {
  PromptWidth width = PromptWidth::W256;
  double speedup = 0;
};
PromptWidthChoice prompt_width();
// "512-bit" or "256-bit" (Auto: the choice's).
const char* prompt_width_name(PromptWidth width);
// The choice for a report: "512-bit (1.31x the 256-bit kernel, timed in cache)", "256-bit (the
// 512-bit kernel 0.97x, timed in cache)" or "256-bit (no VNNI)".
std::string describe_prompt_width();
// The int8 input of packed_matvec_q8 (for tests): xq (colsp) and d (colsp / 32), packed order,
// as isa's kernels quantize it (SIMD or plain loops: the same values bit for bit).
void quantize_q8_input(const PackedLinear& w, const float* x, std::int8_t* xq, float* d,
                       ActScale scale = ActScale::PerBlock, Isa isa = Isa::Portable);

// Y (N, OC) = X (N, IC) W^T + bias (OC, may be null). OpenMP over tiles of 64 output rows, each
// tile decoded (SIMD) once into a per-thread fp32 buffer (64 x colsp, in cache) and multiplied
// with every row of X by oneDNN's sgemm (the portable path: plain loops).
void packed_matmul(const PackedLinear& w, float* Y, const float* X, const float* bias,
                   std::int64_t N, Isa isa);

}  // namespace tessera::quant
