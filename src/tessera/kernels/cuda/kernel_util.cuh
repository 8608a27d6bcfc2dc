// Shared helpers of the .cu files: launch shapes, grid-stride indices, warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace tessera::kernels::cuda {

inline cudaStream_t as_stream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

// bf16 tensors travel through the op table as uint16_t bits.
__host__ __device__ inline const __nv_bfloat16* as_bf16(const std::uint16_t* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
__host__ __device__ inline __nv_bfloat16* as_bf16(std::uint16_t* p) {
  return reinterpret_cast<__nv_bfloat16*>(p);
}

// Whether p may be read and written 16 bytes at a time (null counts as aligned).
inline bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

constexpr int k_block = 256;  // threads per block of the grid-stride kernels

// Blocks for a grid-stride loop over n elements: enough to fill any current GPU several times
// over, capped so the launch stays valid for any n.
inline unsigned grid_for(std::int64_t n) {
  std::int64_t blocks = (n + k_block - 1) / k_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, 65536));
}

__device__ inline std::int64_t global_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t global_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions; every thread of the block must call them (they synchronize) and gets
// the result. blockDim.x must be a multiple of 32; scratch holds 32 floats and may be reused by
// consecutive calls.
__device__ inline float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// Eight consecutive values between memory (fp32 or bf16, 16-byte aligned) and fp32 registers,
// in 16-byte accesses.
__device__ inline void load8(float (&f)[8], const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ inline void store8(float* p, const float (&f)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}
__device__ inline void load8(float (&f)[8], const __nv_bfloat16* p) {
  uint4 v = *reinterpret_cast<const uint4*>(p);
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 t = __bfloat1622float2(h[k]);
    f[2 * k] = t.x, f[2 * k + 1] = t.y;
  }
}
__device__ inline void store8(__nv_bfloat16* p, const float (&f)[8]) {
  uint4 v;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = v;
}

}  // namespace tessera::kernels::cuda
