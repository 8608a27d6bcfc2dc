// cuBLASLt, loaded at its first use instead of linked. Linking libcublasLt costs every process
// about 150 MB of resident memory from the moment it starts (the library's static data and the
// pages its loading touches), whether or not it ever uses a GPU: a CUDA build's CPU runs, each
// rank of a CPU job, `tessera --version`. Only the GPU GEMM (gemm.cu) calls it, through this
// table of its entry points.
#pragma once

#include <cublasLt.h>

#include "tessera/kernels/cuda/check.hpp"

namespace tessera::kernels::cuda {

// The entry points used, listed once: X(name) for each cublasLt<name>.
// clang-format off
#define TESSERA_CUBLASLT_ENTRY_POINTS(X)                                                  \
  X(Create) X(Matmul) X(MatmulDescCreate) X(MatmulDescDestroy) X(MatmulDescSetAttribute) \
  X(MatrixLayoutCreate) X(MatrixLayoutDestroy) X(MatmulPreferenceCreate)                 \
  X(MatmulPreferenceDestroy) X(MatmulPreferenceSetAttribute) X(MatmulAlgoGetHeuristic)   \
  X(GetStatusName) X(GetStatusString)
// clang-format on

struct CublasLt {
#define TESSERA_CUBLASLT_FIELD(name) decltype(&::cublasLt##name) name;
  TESSERA_CUBLASLT_ENTRY_POINTS(TESSERA_CUBLASLT_FIELD)
#undef TESSERA_CUBLASLT_FIELD
};

// The entry points, the library loaded on the first call (libcublasLt.so.<major> of the headers
// this was built with: from the library path, else beside the CUDA runtime this process uses).
// Throws tessera::Error (with a hint) when it cannot be loaded or lacks an entry point.
const CublasLt& cublaslt();

}  // namespace tessera::kernels::cuda

#define TESSERA_CUBLAS_CHECK(call)                                                          \
  do {                                                                                      \
    cublasStatus_t tessera_st_ = (call);                                                    \
    if (tessera_st_ != CUBLAS_STATUS_SUCCESS) {                                             \
      const auto& tessera_lt_ = ::tessera::kernels::cuda::cublaslt();                       \
      ::tessera::kernels::cuda::detail::throw_api_error(                                    \
          "cuBLASLt", #call, static_cast<int>(tessera_st_),                                 \
          tessera_lt_.GetStatusName(tessera_st_), tessera_lt_.GetStatusString(tessera_st_), \
          __FILE__, __LINE__);                                                              \
    }                                                                                       \
  } while (0)
