// bf16 on the CPU: conversions between fp32 and bf16 bit patterns (the upper 16 bits of an fp32)
// and the linear layers of bf16 mixed precision: bf16 GEMM inputs (activations rounded to bf16,
// the weights' bf16 copy), fp32 accumulation and output (kernels::gemm_bf16), biases added and
// their gradients summed in fp32.
#pragma once

#include <cstdint>

#include "tessera/core/bf16.hpp"
#include "tessera/core/buffer.hpp"

namespace tessera::kernels::cpu {

// The conversions (core/bf16.hpp), also by these names here.
using tessera::bf16_to_fp32;
using tessera::fp32_to_bf16;

// out (n) = bf16(in (n))
void to_bf16(std::uint16_t* out, const float* in, std::int64_t n);
// out = in widened (exact).
void from_bf16(float* out, const std::uint16_t* in, std::int64_t n);

// The GEMM operands rounded to bf16, reused by every linear of a pass: grown on demand, never
// shrunk.
struct Bf16Scratch {
  Buffer<std::uint16_t> a, b;
  // Who may reuse what `b` holds (null: nobody): a caller that rounds an operand into `b` for one
  // GEMM and wants it again for the next sets this to itself; every other rounding into `b`
  // resets it.
  const void* b_owner = nullptr;
  // `in` (n) rounded into `buf` (grown to n if smaller); returns buf's data.
  static const std::uint16_t* round(Buffer<std::uint16_t>& buf, const float* in, std::int64_t n);
};

// out (N,OC) = bf16(inp) (N,IC) @ w^T (IC,OC) [+ out if accumulate_out] + bias (OC)
void linear_forward_bf16(Bf16Scratch& s, float* out, const float* inp, const std::uint16_t* w,
                         const std::uint16_t* bias16, const float* bias32, std::int64_t N, int IC,
                         int OC, bool accumulate_out = false);
// dinp (N,IC) = bf16(dout) (N,OC) @ w (OC,IC)   (overwrites)
void linear_backward_input_bf16(Bf16Scratch& s, float* dinp, const float* dout,
                                const std::uint16_t* w, std::int64_t N, int IC, int OC);
// dinp as above (if not null); dweight (OC,IC) += bf16(dout)^T @ bf16(inp); dbias (OC) += the
// column sums of dout in fp32 (if not null).
void linear_backward_bf16(Bf16Scratch& s, float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp, const std::uint16_t* w,
                          std::int64_t N, int IC, int OC);

}  // namespace tessera::kernels::cpu
