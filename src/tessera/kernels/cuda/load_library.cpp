// Compiled in every configuration; empty without CUDA.
#if defined(TESSERA_WITH_CUDA)
#include "tessera/kernels/cuda/load_library.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <filesystem>

namespace tessera::kernels::cuda {

void* open_cuda_library(const std::string& name, std::string& why) {
  dlerror();
  if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const char* e = dlerror();
  why = e ? e : "not found";
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) && info.dli_fname) {
    const auto beside = std::filesystem::path(info.dli_fname).parent_path() / name;
    if (void* h = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return nullptr;
}

}  // namespace tessera::kernels::cuda
#endif
