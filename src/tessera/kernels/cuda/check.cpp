// Compiled in every configuration (no CUDA types); only the CUDA build calls it.
#include "tessera/kernels/cuda/check.hpp"

#include <string>

#include "tessera/core/error.hpp"

namespace tessera::kernels::cuda::detail {

void throw_api_error(const char* library, const char* call, int code, const char* name,
                     const char* message, const char* file, int line) {
  throw Error(fmt::format("{} call failed: {}: {} ({}, code {}) at {}:{}", library, call, name,
                          message, code, file, line),
              "check the GPU with nvidia-smi (driver, free memory, other processes); rerun with "
              "CUDA_LAUNCH_BLOCKING=1 to attribute an asynchronous kernel fault to its launch");
}

void throw_check_failed(const char* cond, const char* what, const char* file, int line) {
  throw InternalError(fmt::format("internal check failed at {}:{}: {} {}", file, line, cond, what));
}

}  // namespace tessera::kernels::cuda::detail
