// Error checks of the CUDA backend. The throwing helpers are plain C++ (check.cpp, compiled by
// the host compiler, so nvcc never sees fmt); the macros are for .cu files and for host .cpp
// files that include the CUDA runtime (include it before this header).
#pragma once

namespace tessera::kernels::cuda::detail {

// Throws tessera::Error("<library> call failed: <call>: <name> (<message>) at <file>:<line>",
// hint). library is "CUDA" or "cuBLASLt".
[[noreturn]] void throw_api_error(const char* library, const char* call, int code, const char* name,
                                  const char* message, const char* file, int line);
// Throws tessera::InternalError for a violated precondition of a kernel wrapper (a bug in the
// caller inside tessera, like TESSERA_CHECK).
[[noreturn]] void throw_check_failed(const char* cond, const char* what, const char* file,
                                     int line);

}  // namespace tessera::kernels::cuda::detail

#if defined(__CUDACC__) || defined(CUDART_VERSION)
#define TESSERA_CUDA_CHECK(call)                                                             \
  do {                                                                                       \
    cudaError_t tessera_err_ = (call);                                                       \
    if (tessera_err_ != cudaSuccess) {                                                       \
      cudaGetLastError(); /* clear a non-sticky error so later launch checks don't see it */ \
      ::tessera::kernels::cuda::detail::throw_api_error(                                     \
          "CUDA", #call, static_cast<int>(tessera_err_), cudaGetErrorName(tessera_err_),     \
          cudaGetErrorString(tessera_err_), __FILE__, __LINE__);                             \
    }                                                                                        \
  } while (0)

// After a kernel launch: launch-configuration errors are reported at once; faults inside the
// kernel surface at the next synchronizing call.
#define TESSERA_CUDA_CHECK_LAUNCH() TESSERA_CUDA_CHECK(cudaGetLastError())
#endif

#define TESSERA_CUDA_REQUIRE(cond, what)                                                     \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::tessera::kernels::cuda::detail::throw_check_failed(#cond, what, __FILE__, __LINE__); \
  } while (0)
