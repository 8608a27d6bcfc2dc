// Compiled in every configuration; empty without CUDA.
#if defined(TESSERA_WITH_CUDA)
#include "tessera/kernels/cuda/cublaslt.hpp"

#include <dlfcn.h>

#include <string>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/kernels/cuda/load_library.hpp"

namespace tessera::kernels::cuda {

namespace {

std::string library_name() {
  return "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
}

void* open_library() {
  const std::string name = library_name();
  std::string why;
  if (void* h = open_cuda_library(name, why)) return h;
  throw Error(fmt::format("cannot load cuBLASLt ({}): {}", name, why),
              "install the CUDA toolkit's cuBLAS (scripts/setup --with-cuda unpacks it into "
              ".cuda/lib) or put its directory on LD_LIBRARY_PATH");
}

template <class F>
void bind(void* h, const char* symbol, F& f) {
  f = reinterpret_cast<F>(dlsym(h, symbol));
  if (!f)
    throw Error(fmt::format("{} has no {}", library_name(), symbol),
                "use the cuBLAS of the CUDA toolkit this build was made with");
}

CublasLt load() {
  void* h = open_library();
  CublasLt t{};
#define TESSERA_CUBLASLT_BIND(name) bind(h, "cublasLt" #name, t.name);
  TESSERA_CUBLASLT_ENTRY_POINTS(TESSERA_CUBLASLT_BIND)
#undef TESSERA_CUBLASLT_BIND
  return t;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt table = load();  // (a throw leaves it to the next call to try again)
  return table;
}

void load_cublaslt() {
  cublaslt();
}

bool cublaslt_loaded() {
  void* h = dlopen(library_name().c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);  // (RTLD_NOLOAD took a reference)
  return h != nullptr;
}

}  // namespace tessera::kernels::cuda
#endif
