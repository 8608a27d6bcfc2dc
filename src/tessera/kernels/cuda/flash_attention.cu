// Causal flash attention in bf16 on the tensor cores (mma.sync m16n8k16, fp32 accumulation), the
// contract of attention_forward/backward with bf16 tensors: qkv (B,T,3C) holds q, k, v each
// (B,T,NH,hs); out (B,T,C); lse (B,NH,T) in fp32. Scores never reach device memory: each block
// streams 64-key tiles past 64 query rows with the online softmax (forward), or 64-query tiles
// past 64 keys (backward, FlashAttention-2's loop order; dq is accumulated in an fp32 buffer
// with atomics and converted at the end).
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and c = 2 * (lane % 4):
//   A (16x16, row-major): a0 = A[g][c..c+1], a1 = A[g+8][c..c+1], a2 = A[g][c+8..c+9],
//                         a3 = A[g+8][c+8..c+9]        (two bf16 per 32-bit register)
//   B (16x8, k x n):      b0 = B[c..c+1][g], b1 = B[c+8..c+9][g]
//   C (16x8, fp32):       c0,c1 = C[g][c..c+1], c2,c3 = C[g+8][c..c+1]
// Two adjacent C tiles (n 0-7 and 8-15) hold exactly an A fragment's elements, so P = softmax(S)
// feeds the next product from registers. ldmatrix loads 8x8 bf16 matrices from shared memory in
// these layouts (.trans for operands stored k-contiguous the other way round).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tessera/kernels/cuda/check.hpp"
#include "tessera/kernels/cuda/kernel_util.cuh"
#include "tessera/kernels/cuda/ops.hpp"

namespace tessera::kernels::cuda {

namespace {

constexpr int k_tile = 64;  // query rows and keys per tile
constexpr int k_warps = 4;  // 16 rows (forward: queries; backward: keys) per warp
constexpr int k_threads = 32 * k_warps;
constexpr float k_log2e = 1.4426950408889634f;

// Shared-memory tile of 64 rows x COLS bf16, rows padded by 8 elements (16 bytes) so that the 8
// row addresses of an ldmatrix fall in distinct bank groups.
template <int COLS>
struct Tile {
  static constexpr int stride = COLS + 8;
  __nv_bfloat16 v[k_tile * stride];
  __device__ __nv_bfloat16* row(int r) { return v + r * stride; }
};

__device__ inline std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d (16x8 fp32) += a (16x16 bf16) * b (16x8 bf16)
__device__ inline void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                           std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline std::uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// *p += v, four floats (p 16-byte aligned), as one vector reduction where the GPU has it.
__device__ inline void red_add_v4(float* p, float4 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(p, v.x);
  atomicAdd(p + 1, v.y);
  atomicAdd(p + 2, v.z);
  atomicAdd(p + 3, v.w);
#endif
}

// 2^x with the special-function unit (relative error ~2^-22; 2^-inf = 0).
__device__ inline float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A fragment (16x16) of rows r0.. and columns k0.. of a row-major tile.
template <int HS>
__device__ inline void load_a(std::uint32_t (&a)[4], Tile<HS>& t, int r0, int k0, int lane) {
  ldmatrix_x4(a, t.row(r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) + k0 + 8 * (lane >> 4));
}
// B fragments (k x n) for n = rows n0..n0+7 of a tile stored [n][k] (k contiguous):
// {b0,b1} of k0..k0+15 and {b0,b1} of k0+16..k0+31.
template <int HS>
__device__ inline void load_b_nk(std::uint32_t (&b)[4], Tile<HS>& t, int n0, int k0, int lane) {
  ldmatrix_x4(b, t.row(n0 + (lane & 7)) + k0 + 8 * (lane >> 3));
}
// B fragments (k x n) for a tile stored [k][n] (n contiguous): k = rows k0..k0+15, n = columns
// n0..n0+7 ({b0,b1} in r[0..1]) and n0+8..n0+15 (r[2..3]).
template <int HS>
__device__ inline void load_b_kn(std::uint32_t (&b)[4], Tile<HS>& t, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, t.row(k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) + n0 + 8 * (lane >> 4));
}
// A fragment (16x16, m x k) of a tile stored transposed, [k][m]: m = m0.., k = k0..
template <int HS>
__device__ inline void load_a_trans(std::uint32_t (&a)[4], Tile<HS>& t, int m0, int k0, int lane) {
  ldmatrix_x4_trans(a, t.row(k0 + (lane & 7) + 8 * (lane >> 4)) + m0 + 8 * ((lane >> 3) & 1));
}

// acc (16 x 64) = A (16 x HS, this warp's rows, registers) times t^T, t a 64-row tile stored
// [row][dim]: the scores of one warp's rows against a tile (Q K^T, K Q^T, V dO^T).
template <int HS>
__device__ inline void rows_times_tile_t(float (&acc)[k_tile / 8][4],
                                         const std::uint32_t (&a)[HS / 16][4], Tile<HS>& t,
                                         int lane) {
#pragma unroll
  for (int j = 0; j < k_tile / 8; ++j) {
    acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk += 2) {
      std::uint32_t b[4];
      load_b_nk(b, t, 8 * j, 16 * kk, lane);
      mma(acc[j], a[kk], b[0], b[1]);
      mma(acc[j], a[kk + 1], b[2], b[3]);
    }
  }
}

// The A fragment of columns 16 kk .. 16 kk + 15 of a 16 x 64 fp32 accumulator (its C tiles 2 kk
// and 2 kk + 1), rounded to bf16.
__device__ inline void a_fragment(std::uint32_t (&a)[4], const float (&s)[k_tile / 8][4], int kk) {
  a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// acc (16 x HS) += P (16 x 64, fp32 accumulator, rounded to bf16) times t (64 x HS, a tile stored
// [row][dim]): P V, P^T dO, dS^T Q.
template <int HS>
__device__ inline void accumulate_times_tile(float (&acc)[HS / 8][4],
                                             const float (&p)[k_tile / 8][4], Tile<HS>& t,
                                             int lane) {
#pragma unroll
  for (int kk = 0; kk < k_tile / 16; ++kk) {
    std::uint32_t a[4];
    a_fragment(a, p, kk);
#pragma unroll
    for (int d = 0; d < HS / 8; d += 2) {
      std::uint32_t b[4];
      load_b_kn(b, t, 16 * kk, 8 * d, lane);
      mma(acc[d], a, b[0], b[1]);
      mma(acc[d + 1], a, b[2], b[3]);
    }
  }
}

// Starts copying rows [r0, r0+64) of one head's q, k or v (or dout) into a tile with cp.async,
// 16 bytes a thread at a time; rows past T are zero-filled (source size 0). The copy completes
// at the cp_async_wait that follows the matching cp_async_commit.
template <int HS>
__device__ inline void load_tile_async(Tile<HS>& t, const __nv_bfloat16* base,
                                       std::int64_t row_stride, int r0, int T) {
  constexpr int chunks = HS / 8;                     // 16-byte pieces per row
  constexpr int rows_per_pass = k_threads / chunks;  // rows the block covers per pass
  const int r = threadIdx.x / chunks, c = (threadIdx.x % chunks) * 8;
#pragma unroll
  for (int n = 0; n < k_tile / rows_per_pass; ++n) {
    const int rr = r + n * rows_per_pass;
    const bool in = r0 + rr < T;
    const __nv_bfloat16* src = base + (in ? (r0 + rr) * row_stride + c : 0);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(t.row(rr) + c)),
                 "l"(src), "r"(in ? 16 : 0));
  }
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most n of this thread's committed groups are still in flight.
template <int n>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

// ---------------------------------------------------------------- forward
template <int HS>
struct FwdShared {
  Tile<HS> q, k[2], v[2];  // K and V double-buffered: the next tile loads during this one's math
};

// Block (query tile, head, batch); warp w owns query rows 16w..16w+15 of the tile.
// Blocks per SM the register allocation is capped for: head sizes up to 64 fit 4 forward (3
// backward) blocks of 128 threads without spilling; 128 needs every register it can get.
template <int HS>
constexpr int k_fwd_blocks = HS <= 64 ? 4 : 1;
template <int HS>
constexpr int k_bwd_blocks = HS <= 64 ? 3 : 1;

template <int HS>
__global__ void __launch_bounds__(k_threads, k_fwd_blocks<HS>)
    flash_forward_kernel(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int T, int C,
                         int NH, float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<FwdShared<HS>*>(smem_raw);
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = 2 * (lane & 3);
  const std::int64_t C3 = 3LL * C;
  const __nv_bfloat16* base = qkv + static_cast<std::int64_t>(b) * T * C3 + h * HS;
  const int q0 = qt * k_tile;

  load_tile_async(sm.q, base, C3, q0, T);
  load_tile_async(sm.k[0], base + C, C3, 0, T);
  load_tile_async(sm.v[0], base + 2 * C, C3, 0, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  std::uint32_t qa[HS / 16][4];
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) load_a(qa[kk], sm.q, 16 * warp, 16 * kk, lane);

  float o[HS / 8][4];
#pragma unroll
  for (int d = 0; d < HS / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g+8, log2 domain
  const float sl2 = scale * k_log2e;
  const int row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * k_tile;
    Tile<HS>& tk = sm.k[kt & 1];
    Tile<HS>& tv = sm.v[kt & 1];
    if (kt < qt) {  // prefetch the next tile into the other buffer (free since the last barrier)
      load_tile_async(sm.k[(kt + 1) & 1], base + C, C3, k0 + k_tile, T);
      load_tile_async(sm.v[(kt + 1) & 1], base + 2 * C, C3, k0 + k_tile, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile kt has landed for every thread
    float s[k_tile / 8][4];
    rows_times_tile_t<HS>(s, qa, tk, lane);  // S = Q K^T for this warp's rows
    // mask (causal on the diagonal tile, keys past T on the last), running max, rescale; the
    // max is taken over raw scores and scaled once (scale > 0)
    if (kt == qt || k0 + k_tile > T) {
#pragma unroll
      for (int j = 0; j < k_tile / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + 8 * j + c + (e & 1);
          if (key > row[e >> 1] || key >= T) s[j][e] = -INFINITY;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < k_tile / 8; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
    float corr[2], rs[2] = {0.0f, 0.0f}, neg_m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float mn = fmaxf(m[r], mx[r] * sl2);
      // rows past T see only masked keys: keep them finite (their output is never written)
      if (mn == -INFINITY) mn = 0.0f;
      corr[r] = ex2(m[r] - mn);
      m[r] = mn;
      neg_m[r] = -mn;
    }
#pragma unroll
    for (int j = 0; j < k_tile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = ex2(fmaf(s[j][e], sl2, neg_m[e >> 1]));
        s[j][e] = p;
        rs[e >> 1] += p;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + rs[r];  // per-thread partial sums
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) {
      o[d][0] *= corr[0];
      o[d][1] *= corr[0];
      o[d][2] *= corr[1];
      o[d][3] *= corr[1];
    }
    // O += P V: P's C tiles 2kk, 2kk+1 are the A fragment of keys 16kk..16kk+15
    accumulate_times_tile<HS>(o, s, tv, lane);
    __syncthreads();  // every warp is done with tile kt before the next prefetch overwrites it
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= T) continue;
    const float inv = 1.0f / l[r];
    __nv_bfloat16* orow = out + (static_cast<std::int64_t>(b) * T + row[r]) * C + h * HS;
#pragma unroll
    for (int d = 0; d < HS / 8; ++d)
      *reinterpret_cast<__nv_bfloat162*>(orow + 8 * d + c) =
          __floats2bfloat162_rn(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    if ((lane & 3) == 0)
      lse[(static_cast<std::int64_t>(b) * NH + h) * T + row[r]] = (m[r] + log2f(l[r])) / k_log2e;
  }
}

// ---------------------------------------------------------------- backward
// D[b,h,t] = sum_d dO[b,t,h,d] * O[b,t,h,d] (fp32), a warp per (b, t, h); and dq_acc zeroed.
__global__ void flash_backward_pre_kernel(float* D, float* dq_acc, const __nv_bfloat16* dout,
                                          const __nv_bfloat16* out, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const std::int64_t warps = static_cast<std::int64_t>(B) * T * NH;
  const int lane = threadIdx.x & 31;
  for (std::int64_t w = global_index() / 32; w < warps; w += global_stride() / 32) {
    const std::int64_t bt = w / NH;
    const int h = static_cast<int>(w % NH);
    const std::int64_t off = bt * C + h * hs;
    float acc = 0.0f;
    for (int d = lane; d < hs; d += 32) {
      acc += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
      dq_acc[off + d] = 0.0f;
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const std::int64_t b = bt / T, t = bt % T;
      D[(b * NH + h) * T + t] = acc;
    }
  }
}

// dq (bf16, the q columns of dqkv) = dq_acc * scale
__global__ void flash_backward_post_kernel(__nv_bfloat16* dqkv, const float* dq_acc,
                                           std::int64_t BT, int C, float scale) {
  const std::int64_t n = BT * C;
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    const std::int64_t bt = i / C, col = i % C;
    dqkv[bt * 3 * C + col] = __float2bfloat16(dq_acc[i] * scale);
  }
}

template <int HS>
struct BwdShared {
  Tile<HS> q[2], dout[2], k;  // Q and dO double-buffered: the next tile loads during this one
  Tile<k_tile> ds;            // dS^T of this key tile: [key][query]
  float lse[2][k_tile], D[2][k_tile];
};

// Block (key tile, head, batch); warp w owns keys 16w..16w+15 of the tile and loops over the
// query tiles at or after the key tile. Per query tile, with S^T = K Q^T (keys x queries):
//   P^T = exp(scale S^T - lse[q]),  dV += P^T dO,  dP^T = V dO^T,
//   dS^T = P^T (dP^T - D[q]),  dK += scale dS^T Q,  dq_acc[q] += dS K  (atomics; scale later).
template <int HS>
__global__ void __launch_bounds__(k_threads, k_bwd_blocks<HS>)
    flash_backward_kernel(__nv_bfloat16* dqkv, float* dq_acc, const __nv_bfloat16* dout,
                          const __nv_bfloat16* qkv, const float* lse, const float* D, int T, int C,
                          int NH, float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<BwdShared<HS>*>(smem_raw);
  const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = 2 * (lane & 3);
  const std::int64_t C3 = 3LL * C;
  const __nv_bfloat16* base = qkv + static_cast<std::int64_t>(b) * T * C3 + h * HS;
  const __nv_bfloat16* dobase = dout + static_cast<std::int64_t>(b) * T * C + h * HS;
  const float* lse_bh = lse + (static_cast<std::int64_t>(b) * NH + h) * T;
  const float* D_bh = D + (static_cast<std::int64_t>(b) * NH + h) * T;
  const int k0 = kt * k_tile;
  const float sl2 = scale * k_log2e;

  // K and V rows of this warp as A fragments, for the whole loop (V passes through sm.q[1]).
  std::uint32_t ka[HS / 16][4], va[HS / 16][4];
  load_tile_async(sm.k, base + C, C3, k0, T);
  load_tile_async(sm.q[1], base + 2 * C, C3, k0, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    load_a(ka[kk], sm.k, 16 * warp, 16 * kk, lane);
    load_a(va[kk], sm.q[1], 16 * warp, 16 * kk, lane);
  }
  __syncthreads();  // V is in registers everywhere before sm.q[1] is reused
  float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
  for (int d = 0; d < HS / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.0f;
  const int key[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
  const int n_qt = (T + k_tile - 1) / k_tile;
  load_tile_async(sm.q[0], base, C3, k0, T);
  load_tile_async(sm.dout[0], dobase, C, k0, T);
  cp_async_commit();

  for (int qt = kt; qt < n_qt; ++qt) {
    const int q0 = qt * k_tile;
    const int buf = (qt - kt) & 1;
    Tile<HS>& tq = sm.q[buf];
    Tile<HS>& tdo = sm.dout[buf];
    const float* slse = sm.lse[buf];  // -lse * log2(e)
    const float* sD = sm.D[buf];
    if (qt + 1 < n_qt) {  // prefetch; the other buffers were last read before the last barrier
      load_tile_async(sm.q[buf ^ 1], base, C3, q0 + k_tile, T);
      load_tile_async(sm.dout[buf ^ 1], dobase, C, q0 + k_tile, T);
      cp_async_commit();
    }
    for (int i = threadIdx.x; i < k_tile; i += k_threads) {
      const bool in = q0 + i < T;
      sm.lse[buf][i] = in ? -lse_bh[q0 + i] * k_log2e : 0.0f;
      sm.D[buf][i] = in ? D_bh[q0 + i] : 0.0f;
    }
    if (qt + 1 < n_qt)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    __syncthreads();  // tiles, lse and D of qt are in place; every warp is done with dS of qt-1
    // S^T (16 keys x 64 queries) = K_w Q^T
    float s[k_tile / 8][4];
    rows_times_tile_t<HS>(s, ka, tq, lane);
    // P^T = 2^(S^T scale log2e - lse log2e) (slse holds -lse log2e), masked where query < key
    // (the diagonal tile) or past T (the last tiles)
#pragma unroll
    for (int j = 0; j < k_tile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = ex2(fmaf(s[j][e], sl2, slse[8 * j + c + (e & 1)]));
    if (qt == kt || q0 + k_tile > T || k0 + k_tile > T) {
#pragma unroll
      for (int j = 0; j < k_tile / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = q0 + 8 * j + c + (e & 1);
          if (q < key[e >> 1] || q >= T || key[e >> 1] >= T) s[j][e] = 0.0f;
        }
    }
    // dV += P^T dO  (A = P^T from registers, B = dO stored [query][dim])
    accumulate_times_tile<HS>(dv, s, tdo, lane);
    // dP^T (16 keys x 64 queries) = V_w dO^T, then dS^T = P^T (dP^T - D[q]) in place
    float dp[k_tile / 8][4];
    rows_times_tile_t<HS>(dp, va, tdo, lane);
#pragma unroll
    for (int j = 0; j < k_tile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = s[j][e] * (dp[j][e] - sD[8 * j + c + (e & 1)]);
    // dK += dS^T Q (scale applied at the end); and dS^T to shared memory for dQ
    accumulate_times_tile<HS>(dk, s, tq, lane);
#pragma unroll
    for (int kk = 0; kk < k_tile / 16; ++kk) {
      std::uint32_t da[4];
      a_fragment(da, s, kk);
      // rows (keys) 16w+g and 16w+g+8, columns (queries) 16kk + c.. and 16kk + 8 + c..
      __nv_bfloat16* r0 = sm.ds.row(16 * warp + g) + 16 * kk + c;
      __nv_bfloat16* r1 = sm.ds.row(16 * warp + g + 8) + 16 * kk + c;
      *reinterpret_cast<std::uint32_t*>(r0) = da[0];
      *reinterpret_cast<std::uint32_t*>(r1) = da[1];
      *reinterpret_cast<std::uint32_t*>(r0 + 8) = da[2];
      *reinterpret_cast<std::uint32_t*>(r1 + 8) = da[3];
    }
    __syncthreads();  // dS^T complete
    // dq_acc (queries 16w.. of the tile) += dS K: A = dS (stored transposed), B = K [key][dim]
    float dq[HS / 8][4];
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < k_tile / 16; ++kk) {
      std::uint32_t a[4];
      load_a_trans(a, sm.ds, 16 * warp, 16 * kk, lane);
#pragma unroll
      for (int d = 0; d < HS / 8; d += 2) {
        std::uint32_t kb[4];
        load_b_kn(kb, sm.k, 16 * kk, 8 * d, lane);
        mma(dq[d], a, kb[0], kb[1]);
        mma(dq[d + 1], a, kb[2], kb[3]);
      }
    }
    // dq_acc += dq: on sm_90 one 16-byte vector atomic per 4 columns (lanes 2i and 2i+1 swap
    // halves so that each holds 4 adjacent columns of one row: the even lane row g, the odd
    // lane row g+8); elsewhere scalar atomics.
    const bool odd = lane & 1;
    const int q_row = q0 + 16 * warp + g + (odd ? 8 : 0);
    float* dst = dq_acc + (static_cast<std::int64_t>(b) * T + q_row) * C + h * HS + (c & ~3);
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) {
      const float r0 = __shfl_xor_sync(0xffffffffu, odd ? dq[d][0] : dq[d][2], 1);
      const float r1 = __shfl_xor_sync(0xffffffffu, odd ? dq[d][1] : dq[d][3], 1);
      const float4 v =
          odd ? make_float4(r0, r1, dq[d][2], dq[d][3]) : make_float4(dq[d][0], dq[d][1], r0, r1);
      if (q_row < T) red_add_v4(dst + 8 * d, v);
    }
  }
  // dK (scaled) and dV to the k and v columns of dqkv
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= T) continue;
    __nv_bfloat16* row = dqkv + (static_cast<std::int64_t>(b) * T + key[r]) * C3 + h * HS;
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) {
      *reinterpret_cast<__nv_bfloat162*>(row + C + 8 * d + c) =
          __floats2bfloat162_rn(dk[d][2 * r] * scale, dk[d][2 * r + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(row + 2 * C + 8 * d + c) =
          __floats2bfloat162_rn(dv[d][2 * r], dv[d][2 * r + 1]);
    }
  }
}

template <int HS>
void launch_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int C,
                    int NH, cudaStream_t st) {
  const int smem = sizeof(FwdShared<HS>);
  TESSERA_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<HS>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  TESSERA_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<HS>,
                                          cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
  dim3 grid((T + k_tile - 1) / k_tile, NH, B);
  flash_forward_kernel<HS>
      <<<grid, k_threads, smem, st>>>(out, lse, qkv, T, C, NH, 1.0f / std::sqrt(float(HS)));
  TESSERA_CUDA_CHECK_LAUNCH();
}

template <int HS>
void launch_backward(__nv_bfloat16* dqkv, float* dq_acc, const __nv_bfloat16* dout,
                     const __nv_bfloat16* qkv, const float* lse, const float* D, int B, int T,
                     int C, int NH, cudaStream_t st) {
  const int smem = sizeof(BwdShared<HS>);
  TESSERA_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_kernel<HS>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  TESSERA_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_kernel<HS>,
                                          cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
  dim3 grid((T + k_tile - 1) / k_tile, NH, B);
  flash_backward_kernel<HS><<<grid, k_threads, smem, st>>>(dqkv, dq_acc, dout, qkv, lse, D, T, C,
                                                           NH, 1.0f / std::sqrt(float(HS)));
  TESSERA_CUDA_CHECK_LAUNCH();
}

void check_shape(int C, int NH) {
  TESSERA_CUDA_REQUIRE(NH > 0 && C % NH == 0, "flash attention: C must be a multiple of NH");
  const int hs = C / NH;
  TESSERA_CUDA_REQUIRE(hs == 32 || hs == 64 || hs == 128,
                       "flash attention: head size must be 32, 64 or 128");
}

}  // namespace

bool flash_attention_supports(int C, int NH) {
  if (NH <= 0 || C % NH != 0) return false;
  const int hs = C / NH;
  return hs == 32 || hs == 64 || hs == 128;
}

std::size_t flash_attention_workspace_bytes(int B, int T, int C, int NH) {
  // dq_acc (B,T,C) fp32 and D (B,NH,T) fp32
  return (static_cast<std::size_t>(B) * T * C + static_cast<std::size_t>(B) * NH * T) *
         sizeof(float);
}

void flash_attention_forward(std::uint16_t* out, float* lse, const std::uint16_t* qkv, int B, int T,
                             int C, int NH, void* stream) {
  check_shape(C, NH);
  if (B == 0 || T == 0) return;
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  auto* q = reinterpret_cast<const __nv_bfloat16*>(qkv);
  cudaStream_t st = as_stream(stream);
  switch (C / NH) {
    case 32:
      launch_forward<32>(o, lse, q, B, T, C, NH, st);
      break;
    case 64:
      launch_forward<64>(o, lse, q, B, T, C, NH, st);
      break;
    default:
      launch_forward<128>(o, lse, q, B, T, C, NH, st);
      break;
  }
}

void flash_attention_backward(std::uint16_t* dqkv, const std::uint16_t* dout,
                              const std::uint16_t* qkv, const std::uint16_t* out, const float* lse,
                              float* workspace, int B, int T, int C, int NH, void* stream) {
  check_shape(C, NH);
  if (B == 0 || T == 0) return;
  auto* dq = reinterpret_cast<__nv_bfloat16*>(dqkv);
  auto* dO = reinterpret_cast<const __nv_bfloat16*>(dout);
  auto* q = reinterpret_cast<const __nv_bfloat16*>(qkv);
  auto* o = reinterpret_cast<const __nv_bfloat16*>(out);
  cudaStream_t st = as_stream(stream);
  float* dq_acc = workspace;
  float* D = workspace + static_cast<std::size_t>(B) * T * C;
  const std::int64_t rows = static_cast<std::int64_t>(B) * T * NH;
  flash_backward_pre_kernel<<<grid_for(rows * 32), k_block, 0, st>>>(D, dq_acc, dO, o, B, T, C, NH);
  TESSERA_CUDA_CHECK_LAUNCH();
  switch (C / NH) {
    case 32:
      launch_backward<32>(dq, dq_acc, dO, q, lse, D, B, T, C, NH, st);
      break;
    case 64:
      launch_backward<64>(dq, dq_acc, dO, q, lse, D, B, T, C, NH, st);
      break;
    default:
      launch_backward<128>(dq, dq_acc, dO, q, lse, D, B, T, C, NH, st);
      break;
  }
  const std::int64_t BT = static_cast<std::int64_t>(B) * T;
  flash_backward_post_kernel<<<grid_for(BT * C), k_block, 0, st>>>(dq, dq_acc, BT, C,
                                                                   1.0f / std::sqrt(float(C / NH)));
  TESSERA_CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::kernels::cuda
