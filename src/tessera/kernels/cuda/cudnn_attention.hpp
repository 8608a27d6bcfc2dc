// Causal multi-head attention through cuDNN's fused scaled-dot-product attention (its graph API,
// built with the header-only cuDNN frontend), in bf16 with fp32 softmax statistics: the same
// contract as flash_attention_forward/backward in ops.hpp, so the model can use either.
//
// cuDNN is optional at build time (its headers: scripts/setup --with-cuda) and at run time: the
// library, libcudnn.so.9, is loaded when an object is created, from the loader's search path (a
// CUDA installation, or the nvidia-cudnn wheel next to PyTorch). create() says why when it cannot
// be used, and the caller keeps its own kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tessera::kernels::cuda {

class CudnnAttention {
 public:
  // For qkv rows (NH + 2 KV) hs wide holding q (NH heads), k and v (KV heads each; grouped-query
  // attention when KV < NH). Null (and *why set) when this build has no cuDNN headers,
  // libcudnn.so.9 cannot be loaded, or it is older than 9.0.
  static std::unique_ptr<CudnnAttention> create(int NH, int KV, int hs, std::string* why);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether cuDNN has an engine for micro-batches (B, T): builds (once per shape) the forward and
  // backward graphs. Forward and backward of one shape always go to the same implementation.
  bool supports(int B, int T);
  // out (B,T,NH*hs) and lse (B,NH,T) (natural-log sum of exponentials of the scaled scores).
  void forward(std::uint16_t* out, float* lse, const std::uint16_t* qkv, int B, int T,
               void* stream);
  // dqkv = (overwrite) the gradients of q, k and v, from the forward's out and lse.
  void backward(std::uint16_t* dqkv, const std::uint16_t* dout, const std::uint16_t* qkv,
                const std::uint16_t* out, const float* lse, int B, int T, void* stream);

  std::string version() const;  // "cuDNN 9.x.y"
  std::size_t workspace_bytes() const;

 private:
  struct Impl;
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> p_;
};

}  // namespace tessera::kernels::cuda
