// The model (both families, model/config.hpp) on one CUDA device: the blocks of model/gpt_block.hpp
// (the ones the CPU model runs) over the CUDA op table (kernels/cuda/ops.hpp), with the parameters
// (fp32 masters), gradients (fp32), AdamW moments and activations each in one device allocation,
// and the same ParamLayout as the CPU model, so parameters and gradients move between the two as
// flat buffers.
//
// Precision::Bf16 is mixed precision: the tensors that feed GEMMs and attention (LayerNorm
// outputs, qkv, attention output, MLP activations, logits) are bf16, read by bf16 GEMMs with fp32
// accumulation and by the attention kernels (cuDNN's fused attention or tessera's flash kernels),
// from a bf16 copy of the parameters that the optimizer rewrites after each update. The residual
// stream and its gradient, LayerNorm statistics, softmax and losses, all gradients and the
// optimizer state stay fp32.
// Precision::Fp32 runs the same code with fp32 everywhere (no TF32), as the reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/kernels/cuda/ops.hpp"
#include "tessera/kernels/profile.hpp"
#include "tessera/model/layout.hpp"
#include "tessera/optim/adamw.hpp"

namespace tessera::model {

enum class DevicePrecision { Fp32, Bf16 };

const char* precision_name(DevicePrecision p);

// Which causal attention kernels bf16 runs: cuDNN's fused attention where the machine has cuDNN 9
// and it has an engine for the shape (Auto), tessera's own flash kernels, or cuDNN or an error.
// fp32 always runs the plain reference kernels.
enum class DeviceAttention { Auto, Flash, Cudnn };

class DeviceGpt {
 public:
  // Allocates everything for micro-batches of up to (B, T) on the current device; throws
  // tessera::Error when CUDA is unavailable, when T exceeds the block size, or (Bf16) when the
  // attention cannot run (a GPT-2 head size without flash kernel and no cuDNN; llama without
  // cuDNN, whose attention has the grouped kv heads). Parameters start at zero: upload_params().
  DeviceGpt(const ModelConfig& cfg, DevicePrecision precision, int B, int T,
            DeviceAttention attention = DeviceAttention::Auto);
  ~DeviceGpt();
  DeviceGpt(const DeviceGpt&) = delete;
  DeviceGpt& operator=(const DeviceGpt&) = delete;

  const ParamLayout& layout() const;
  DevicePrecision precision() const;
  std::size_t device_bytes() const;  // everything this model allocated
  // The attention kernels in use: "reference (fp32)", "flash", or "cuDNN 9.x.y"; and, when Auto
  // fell back to flash, why cuDNN is not used ("" otherwise).
  std::string attention_backend() const;
  std::string attention_fallback_reason() const;

  void upload_params(const float* host);  // (layout.total()); refreshes the bf16 copy
  void download_params(float* host) const;
  void download_grads(float* host) const;
  // AdamW moments m, v (layout.total() each), e.g. to checkpoint and resume a run.
  void upload_moments(const float* m_host, const float* v_host);
  void download_moments(float* m_host, float* v_host) const;
  void zero_grads();

  // inputs, targets: host (B, T) token ids with B, T within the constructor's. targets may be
  // null (logits only; returns 0); targets < 0 are ignored. Returns the mean loss over the other
  // targets. training: the logits are replaced by dloss * dlogits, ready for backward().
  float forward(const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
                bool training, float dloss);
  // Gradients ACCUMULATE into the gradient buffer; needs a training forward() just before.
  void backward();
  // The logits of the last non-training forward, (B, T, Vp) in fp32; or one row of them (Vp).
  std::vector<float> download_logits() const;
  void download_logits_row(std::int64_t row, float* host) const;

  // The gradient buffer in device memory (layout().total() floats) and the stream every call of
  // this model queues its work on: data parallelism sums the gradients over its ranks between
  // the last backward() of a step and grad_norm().
  float* device_grads();
  void* stream() const;

  double grad_norm();  // L2 norm of the whole gradient buffer
  // One AdamW update of every tensor (decay per ParamTensor::decay), gradients multiplied by
  // grad_scale (clipping); rewrites the bf16 copy.
  void adamw_step(const optim::AdamWConfig& cfg, float lr, std::int64_t step, float grad_scale);

  // Device time per op family of the forward, backward and optimizer calls that follow, added
  // to *profile when they finish (null: no timing, the default).
  void set_profile(kernels::Profile* profile);
  void synchronize();

 private:
  friend class DeviceDecoder;
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// Incremental decoding on the device, for sampling: the interface of the CPU's Decoder. Every
// layer's keys and values for up to capacity() positions stay in one device buffer, in the
// model's precision, so each new token runs the blocks over its one row. A prompt enters in one
// pass; each later token is one launch of a CUDA graph of the whole step (graphs = false: its
// kernels launched one by one, the reference). The work runs on a stream of the decoder's own.
// The model's parameters are read as uploaded; its activation buffers serve as scratch, so a
// forward between two calls invalidates nothing kept here (but the logits it leaves are the
// decoder's afterwards).
class DeviceDecoder {
 public:
  // capacity: at most the model's T (its constructor's), which is at most the block size.
  DeviceDecoder(DeviceGpt& model, int capacity, bool graphs = true);
  DeviceDecoder(const DeviceDecoder&) = delete;
  DeviceDecoder& operator=(const DeviceDecoder&) = delete;
  // n tokens from position 0 (the prompt: position() must be 0; 0 < n <= capacity()); returns
  // the logits (Vp, host memory, valid until the next call) of the token after them.
  const float* prefill(const std::int32_t* tokens, int n);
  // One token at the next position; the logits of the token after it.
  const float* step(std::int32_t token);
  int position() const { return pos_; }
  int capacity() const { return capacity_; }
  void reset() { pos_ = 0; }
  std::size_t kv_cache_bytes() const;  // the keys and values of capacity() positions

 private:
  DeviceGpt& model_;
  int capacity_;
  bool graphs_;
  int pos_ = 0;
  bool stepped_ = false;  // a step has run as queued (the graph is captured from the next)
  kernels::cuda::Stream stream_;
  kernels::cuda::DeviceBuffer cache_;  // keys, values, scores, and a step's token and position
  kernels::cuda::Graph graph_;         // one step after the prompt
  std::vector<float> logits_;
  std::size_t element_bytes() const;
  const float* run(const std::int32_t* tokens, int n);
};

}  // namespace tessera::model
