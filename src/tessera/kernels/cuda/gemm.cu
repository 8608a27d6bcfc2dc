// Row-major GEMM (the kernels::gemm convention) on cuBLASLt, which is column-major.
//
// A row-major (r, c) matrix with row stride ld is, as stored, the column-major (c, r) matrix
// with leading dimension ld, i.e. its transpose. So the row-major product
//   C (M,N) = op(A) (M,K) op(B) (K,N)
// is computed as the column-major product
//   C^T (N,M) = op(B)^T (N,K) op(A)^T (K,M)
// with the operands swapped and the SAME transpose flags: cuBLASLt's "A" is our B (stored
// column-major as (N,K) if !transb, (K,N) if transb) and its "B" is our A ((K,M) if !transa,
// (M,K) if transa); its C is (N,M) with leading dimension ldc.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "tessera/kernels/cuda/check.hpp"
#include "tessera/kernels/cuda/cublaslt.hpp"
#include "tessera/kernels/cuda/kernel_util.cuh"
#include "tessera/kernels/cuda/ops.hpp"

namespace tessera::kernels::cuda {

namespace {

constexpr std::size_t k_workspace_bytes = 32u << 20;  // cuBLASLt's recommendation for Hopper

// One cuBLASLt handle per device, and one workspace per (device, stream): work on different
// streams may overlap, so they cannot share a workspace. Both live until the process exits
// (deliberately not freed: destroying them at static destruction races the CUDA runtime's own
// teardown). A stream destroyed and another created at the same address reuses the workspace,
// which is safe as long as the old stream's GEMMs have finished.
// A GEMM configuration: what the choice of a cuBLASLt algorithm depends on.
struct AlgoKey {
  int dev, ab_type, c_type, epilogue;
  bool transa, transb;
  std::int64_t M, N, K, lda, ldb, ldc;
  bool operator<(const AlgoKey& o) const {
    return std::tie(dev, ab_type, c_type, epilogue, transa, transb, M, N, K, lda, ldb, ldc) <
           std::tie(o.dev, o.ab_type, o.c_type, o.epilogue, o.transa, o.transb, o.M, o.N, o.K,
                    o.lda, o.ldb, o.ldc);
  }
};

struct LtState {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, void*>, void*> workspaces;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;  // chosen once per configuration
};

LtState& lt_state() {
  static LtState* s = new LtState;  // never destroyed, see above
  return *s;
}

struct LtContext {
  cublasLtHandle_t handle;
  void* workspace;
};

LtContext lt_context(void* stream) {
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  LtState& s = lt_state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto h = s.handles.find(dev);
  if (h == s.handles.end()) {
    cublasLtHandle_t handle = nullptr;
    TESSERA_CUBLAS_CHECK(cublaslt().Create(&handle));
    h = s.handles.emplace(dev, handle).first;
  }
  auto key = std::make_pair(dev, stream);
  auto w = s.workspaces.find(key);
  if (w == s.workspaces.end()) {
    void* ws = nullptr;
    TESSERA_CUDA_CHECK(cudaMalloc(&ws, k_workspace_bytes));
    w = s.workspaces.emplace(key, ws).first;
  }
  return {h->second, w->second};
}

// RAII for the descriptor objects of one call.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() {
    if (d) cublaslt().MatmulDescDestroy(d);
  }
};
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  ~Layout() {
    if (d) cublaslt().MatrixLayoutDestroy(d);
  }
};
struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  ~Preference() {
    if (d) cublaslt().MatmulPreferenceDestroy(d);
  }
};

// C (M,N) *= beta, row stride ldc: the K == 0 case (an empty product), which cuBLASLt layouts
// cannot express. beta == 0 writes zeros (no NaN propagation from C), as BLAS does.
template <class T>
__global__ void scale_matrix_kernel(T* C, std::int64_t M, std::int64_t N, std::int64_t ldc,
                                    float beta) {
  for (std::int64_t e = global_index(); e < M * N; e += global_stride()) {
    std::int64_t r = e / N, c = e - r * N;
    T* x = C + r * ldc + c;
    *x = beta == 0.0f ? T(0.0f) : T(beta * static_cast<float>(*x));
  }
}

// The algorithm for a new GEMM configuration: cuBLASLt's heuristic's first choice. (Timing its
// other candidates on the call's own operands and keeping the fastest gained nothing on an H100
// for the GPT-2 124M and 350M training steps, within the 1-2% noise of a step, so the choice is
// only cached: the heuristic runs once per configuration instead of once per call.)
cublasLtMatmulAlgo_t choose_algo(const LtContext& ctx, cublasLtMatmulDesc_t op,
                                 cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                 cublasLtMatrixLayout_t lc) {
  Preference pref;
  TESSERA_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pref.d));
  std::uint64_t ws = k_workspace_bytes;
  TESSERA_CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(
      pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  TESSERA_CUBLAS_CHECK(cublaslt().MatmulAlgoGetHeuristic(ctx.handle, op, la, lb, lc, lc, pref.d, 1,
                                                      &heuristic, &found));
  if (found == 0)
    TESSERA_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);  // no algorithm for this shape/layout
  return heuristic.algo;
}

// The row-major GEMM above with element types ab (A and B) and c (C), fp32 compute and scale.
void lt_gemm(cudaDataType_t ab_type, cudaDataType_t c_type, bool transa, bool transb,
             std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const void* A,
             std::int64_t lda, const void* B, std::int64_t ldb, float beta, void* C,
             std::int64_t ldc, void* stream, const GemmEpilogue& epi = {}) {
  const void* bias = epi.bias;
  TESSERA_CUDA_REQUIRE(M >= 0 && N >= 0 && K >= 0, "gemm: negative dimension");
  if (M == 0 || N == 0) return;
  TESSERA_CUDA_REQUIRE(!bias || K > 0, "gemm: a bias needs K > 0");
  // Row strides of the row-major operands as stored: at least their number of columns.
  TESSERA_CUDA_REQUIRE(lda >= (transa ? M : K) && lda >= 1, "gemm: lda < columns of A");
  TESSERA_CUDA_REQUIRE(ldb >= (transb ? K : N) && ldb >= 1, "gemm: ldb < columns of B");
  TESSERA_CUDA_REQUIRE(ldc >= N, "gemm: ldc < N");
  if (K == 0) {
    if (c_type == CUDA_R_32F)
      scale_matrix_kernel<<<grid_for(M * N), k_block, 0, as_stream(stream)>>>(
          static_cast<float*>(C), M, N, ldc, beta);
    else
      scale_matrix_kernel<<<grid_for(M * N), k_block, 0, as_stream(stream)>>>(
          static_cast<__nv_bfloat16*>(C), M, N, ldc, beta);
    TESSERA_CUDA_CHECK_LAUNCH();
    return;
  }
  LtContext ctx = lt_context(stream);

  MatmulDesc op;
  TESSERA_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&op.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is our B, its B is our A (see the top of the file).
  cublasOperation_t op_lt_a = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_lt_b = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  TESSERA_CUBLAS_CHECK(
      cublaslt().MatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)));
  TESSERA_CUBLAS_CHECK(
      cublaslt().MatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)));

  // C's rows in cuBLASLt's column-major view are our columns: the bias has N elements (in C's
  // type, the epilogue's default) and is added to every row of our C; the GELU auxiliary matrix
  // has C's shape, type and row stride.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (epi.act) {
    case GemmEpilogue::Act::None:
      epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      break;
    case GemmEpilogue::Act::Gelu:
      epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      break;
    case GemmEpilogue::Act::DGelu:
      TESSERA_CUDA_REQUIRE(!bias, "gemm: the DGELU epilogue takes no bias");
      epilogue = CUBLASLT_EPILOGUE_DGELU;
      break;
  }
  TESSERA_CUDA_REQUIRE(epi.act == GemmEpilogue::Act::None || (epi.aux && ldc % 8 == 0),
                       "gemm: a GELU epilogue needs its auxiliary matrix and ldc % 8 == 0");
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    TESSERA_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epilogue, sizeof(epilogue)));
  if (bias)
    TESSERA_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof(bias)));
  if (epi.act != GemmEpilogue::Act::None) {
    void* aux = epi.aux;
    std::int64_t aux_ld = ldc;
    std::int32_t aux_type = c_type;
    TESSERA_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(
        op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    TESSERA_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                        &aux_ld, sizeof(aux_ld)));
    TESSERA_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(
        op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
  }
  // Column-major shapes as stored (rows, cols, ld):
  //   Lt A = our B: (N, K) if !transb else (K, N), ld ldb
  //   Lt B = our A: (K, M) if !transa else (M, K), ld lda
  //   Lt C:         (N, M), ld ldc
  Layout la, lb, lc;
  TESSERA_CUBLAS_CHECK(
      cublaslt().MatrixLayoutCreate(&la.d, ab_type, transb ? K : N, transb ? N : K, ldb));
  TESSERA_CUBLAS_CHECK(
      cublaslt().MatrixLayoutCreate(&lb.d, ab_type, transa ? M : K, transa ? K : M, lda));
  TESSERA_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&lc.d, c_type, N, M, ldc));

  const void* c_in = epi.c_in ? epi.c_in : C;  // the beta term's matrix
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  const AlgoKey key{dev, ab_type, c_type, static_cast<int>(epilogue), transa, transb, M, N, K,
                    lda, ldb,     ldc};
  cublasLtMatmulAlgo_t algo;
  {
    LtState& st = lt_state();
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.algos.find(key);
    if (it == st.algos.end())
      it = st.algos.emplace(key, choose_algo(ctx, op.d, la.d, lb.d, lc.d)).first;
    algo = it->second;
  }
  TESSERA_CUBLAS_CHECK(cublaslt().Matmul(ctx.handle, op.d, &alpha, B, la.d, A, lb.d, &beta, c_in, lc.d,
                                      C, lc.d, &algo, ctx.workspace, k_workspace_bytes,
                                      as_stream(stream)));
}

}  // namespace

void gemm(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
          const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
          std::int64_t ldc, void* stream) {
  lt_gemm(CUDA_R_32F, CUDA_R_32F, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
          stream);
}

void gemm_bf16(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
               std::int64_t ldb, float beta, float* C, std::int64_t ldc, void* stream) {
  lt_gemm(CUDA_R_16BF, CUDA_R_32F, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
          stream);
}

void gemm_bf16(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
               std::int64_t ldb, float beta, std::uint16_t* C, std::int64_t ldc, void* stream) {
  lt_gemm(CUDA_R_16BF, CUDA_R_16BF, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
          stream);
}

void gemm_ex(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
             const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
             float* C, std::int64_t ldc, const GemmEpilogue& epi, void* stream) {
  lt_gemm(CUDA_R_32F, CUDA_R_32F, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
          stream, epi);
}

void gemm_bf16_ex(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
                  std::int64_t ldb, float beta, float* C, std::int64_t ldc, const GemmEpilogue& epi,
                  void* stream) {
  lt_gemm(CUDA_R_16BF, CUDA_R_32F, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
          stream, epi);
}

void gemm_bf16_ex(bool transa, bool transb, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
                  std::int64_t ldb, float beta, std::uint16_t* C, std::int64_t ldc,
                  const GemmEpilogue& epi, void* stream) {
  lt_gemm(CUDA_R_16BF, CUDA_R_16BF, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
          stream, epi);
}

}  // namespace tessera::kernels::cuda
