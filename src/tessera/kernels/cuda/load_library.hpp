// The CUDA libraries tessera opens at run time instead of linking (cuBLASLt, cuDNN): linked, they
// would be loaded, and cost memory, in every process, GPU or not.
#pragma once

#include <string>

namespace tessera::kernels::cuda {

// dlopen(name) from the library path (LD_LIBRARY_PATH, the binary's run path, the system's), else
// from the directory of the CUDA runtime this process linked (a toolkit unpacked beside the
// build). The handle, or null with `why` set to the loader's message. CUDA builds only.
void* open_cuda_library(const std::string& name, std::string& why);

}  // namespace tessera::kernels::cuda
