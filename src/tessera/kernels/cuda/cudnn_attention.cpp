// cuDNN fused attention (see cudnn_attention.hpp). With TESSERA_WITH_CUDNN (CMake found cuDNN's and
// the frontend's headers next to the CUDA toolkit) the frontend is compiled with dynamic loading:
// every cuDNN call goes through the handle this file opens, so the binary never links libcudnn.
#include "tessera/kernels/cuda/cudnn_attention.hpp"

#include <fmt/format.h>

#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/load_library.hpp"

#if defined(TESSERA_WITH_CUDNN)

#include <cuda_runtime_api.h>

#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <cudnn_frontend.h>

// The frontend's dynamic loading reads the library handle from this variable (its own
// declaration); it is set once per process and never closed.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace tessera::kernels::cuda {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorAttrs = fe::graph::Tensor_attributes;

enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

// Loads libcudnn.so.9 once; "" on success, else why not.
std::string load_cudnn() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    std::string why;
    void* h = open_cuda_library("libcudnn.so.9", why);
    if (!h) {
      error = fmt::format("libcudnn.so.9 could not be loaded ({})", why);
      return;
    }
    fe::cudnn_dlhandle = h;
  });
  return error;
}

void check(fe::error_object e, const char* what) {
  if (e.is_bad()) throw Error(fmt::format("cuDNN attention: {} failed: {}", what, e.get_message()));
}

std::shared_ptr<Graph> new_graph() {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// A (B, heads, T, hs) view with the row stride of its buffer (a qkv row or an out row).
std::shared_ptr<TensorAttrs> head_view(Graph& g, const char* name, Uid uid, std::int64_t B,
                                       std::int64_t NH, std::int64_t T, std::int64_t hs,
                                       std::int64_t row) {
  return g.tensor(TensorAttrs()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, NH, T, hs})
                      .set_stride({T * row, hs, row, 1}));
}

void set_head_output(TensorAttrs& t, Uid uid, std::int64_t B, std::int64_t NH, std::int64_t T,
                     std::int64_t hs, std::int64_t row) {
  t.set_output(true).set_uid(uid).set_dim({B, NH, T, hs}).set_stride({T * row, hs, row, 1});
}

void finish(Graph& g, cudnnHandle_t handle) {
  check(g.validate(), "validate");
  check(g.build_operation_graph(handle), "build_operation_graph");
  check(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  check(g.check_support(), "check_support");
  check(g.build_plans(handle), "build_plans");
}

struct Shape {
  std::int64_t B, T, NH, KV, hs;
  std::int64_t W() const { return (NH + 2 * KV) * hs; }  // a qkv row
  std::int64_t OC() const { return NH * hs; }            // an out row
};

std::shared_ptr<TensorAttrs> qkv_views(Graph& g, const Shape& s, std::shared_ptr<TensorAttrs>* k,
                                       std::shared_ptr<TensorAttrs>* v) {
  *k = head_view(g, "k", kK, s.B, s.KV, s.T, s.hs, s.W());
  *v = head_view(g, "v", kV, s.B, s.KV, s.T, s.hs, s.W());
  return head_view(g, "q", kQ, s.B, s.NH, s.T, s.hs, s.W());
}

std::shared_ptr<Graph> forward_graph(const Shape& s, cudnnHandle_t handle) {
  auto g = new_graph();
  std::shared_ptr<TensorAttrs> k, v;
  auto q = qkv_views(*g, s, &k, &v);
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("causal_attention")
                  .set_generate_stats(true)
                  .set_causal_mask(true)
                  .set_attn_scale(1.0f / std::sqrt(static_cast<float>(s.hs)));
  auto [o, stats] = g->sdpa(q, k, v, opts);
  set_head_output(*o, kO, s.B, s.NH, s.T, s.hs, s.OC());
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({s.B, s.NH, s.T, 1})
      .set_stride({s.NH * s.T, s.T, 1, 1});
  finish(*g, handle);
  return g;
}

std::shared_ptr<Graph> backward_graph(const Shape& s, cudnnHandle_t handle) {
  auto g = new_graph();
  std::shared_ptr<TensorAttrs> k, v;
  auto q = qkv_views(*g, s, &k, &v);
  auto o = head_view(*g, "o", kO, s.B, s.NH, s.T, s.hs, s.OC());
  auto dout = head_view(*g, "dout", kdO, s.B, s.NH, s.T, s.hs, s.OC());
  auto stats = g->tensor(TensorAttrs()
                             .set_name("stats")
                             .set_uid(kStats)
                             .set_dim({s.B, s.NH, s.T, 1})
                             .set_stride({s.NH * s.T, s.T, 1, 1})
                             .set_data_type(fe::DataType_t::FLOAT));
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("causal_attention_backward")
                  .set_causal_mask(true)
                  .set_attn_scale(1.0f / std::sqrt(static_cast<float>(s.hs)));
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
  set_head_output(*dq, kdQ, s.B, s.NH, s.T, s.hs, s.W());
  set_head_output(*dk, kdK, s.B, s.KV, s.T, s.hs, s.W());
  set_head_output(*dv, kdV, s.B, s.KV, s.T, s.hs, s.W());
  finish(*g, handle);
  return g;
}

void check_status(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(fmt::format("cuDNN attention: {} failed: status {}", what, static_cast<int>(st)));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(fmt::format("cuDNN attention: {} failed: {}", what, cudaGetErrorString(e)));
}

}  // namespace

struct CudnnAttention::Impl {
  int NH = 0, KV = 0, hs = 0;
  cudnnHandle_t handle = nullptr;
  struct Graphs {
    std::shared_ptr<Graph> fwd, bwd;  // both null: cuDNN has no engine for the shape
  };
  std::map<std::pair<int, int>, Graphs> graphs;
  void* workspace = nullptr;
  std::size_t workspace_size = 0;

  ~Impl() {
    if (workspace) cudaFree(workspace);
    if (handle) fe::detail::destroy_handle(handle);
  }

  // The graphs of (B, T), built on first use; a shape without an engine is remembered as such.
  const Graphs& get(int B, int T) {
    auto it = graphs.find({B, T});
    if (it != graphs.end()) return it->second;
    Graphs gs;
    try {
      const Shape s{B, T, NH, KV, hs};
      gs.fwd = forward_graph(s, handle);
      gs.bwd = backward_graph(s, handle);
      reserve(static_cast<std::size_t>(
          std::max(gs.fwd->get_workspace_size(), gs.bwd->get_workspace_size())));
    } catch (const Error&) {
      gs = {};
    }
    return graphs.emplace(std::make_pair(B, T), gs).first->second;
  }

  void reserve(std::size_t bytes) {
    if (bytes <= workspace_size) return;
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the old one may be in use
    if (workspace) check_cuda(cudaFree(workspace), "cudaFree");
    workspace = nullptr;
    workspace_size = 0;
    check_cuda(cudaMalloc(&workspace, bytes), "cudaMalloc(workspace)");
    workspace_size = bytes;
  }

  void run(const Graph& g, std::unordered_map<std::int64_t, void*>& pack, void* stream) {
    check_status(fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream)), "set_stream");
    check(g.execute(handle, pack, workspace), "execute");
  }
};

std::unique_ptr<CudnnAttention> CudnnAttention::create(int NH, int KV, int hs, std::string* why) {
  std::string err = load_cudnn();
  if (err.empty() && fe::detail::get_backend_version() < 90000)
    err = fmt::format("cuDNN {} is older than 9.0", fe::detail::get_backend_version());
  auto impl = std::make_unique<Impl>();
  impl->NH = NH;
  impl->KV = KV;
  impl->hs = hs;
  if (err.empty()) {
    try {
      check_status(fe::detail::create_handle(&impl->handle), "cudnnCreate");
    } catch (const std::exception& e) {
      err = e.what();
      impl->handle = nullptr;
    }
  }
  if (!err.empty()) {
    if (why) *why = err;
    return nullptr;
  }
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
}

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : p_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::supports(int B, int T) {
  return p_->get(B, T).fwd != nullptr;
}

void CudnnAttention::forward(std::uint16_t* out, float* lse, const std::uint16_t* qkv, int B, int T,
                             void* stream) {
  const auto& g = p_->get(B, T);
  if (!g.fwd) throw Error(fmt::format("cuDNN has no attention engine for B={} T={}", B, T));
  auto* q = const_cast<std::uint16_t*>(qkv);
  const int k = p_->NH * p_->hs, v = (p_->NH + p_->KV) * p_->hs;  // column offsets in a row
  std::unordered_map<std::int64_t, void*> pack{
      {kQ, q}, {kK, q + k}, {kV, q + v}, {kO, out}, {kStats, lse}};
  p_->run(*g.fwd, pack, stream);
}

void CudnnAttention::backward(std::uint16_t* dqkv, const std::uint16_t* dout,
                              const std::uint16_t* qkv, const std::uint16_t* out, const float* lse,
                              int B, int T, void* stream) {
  const auto& g = p_->get(B, T);
  if (!g.bwd) throw Error(fmt::format("cuDNN has no attention engine for B={} T={}", B, T));
  auto* q = const_cast<std::uint16_t*>(qkv);
  const int k = p_->NH * p_->hs, v = (p_->NH + p_->KV) * p_->hs;
  std::unordered_map<std::int64_t, void*> pack{{kQ, q},
                                               {kK, q + k},
                                               {kV, q + v},
                                               {kO, const_cast<std::uint16_t*>(out)},
                                               {kdO, const_cast<std::uint16_t*>(dout)},
                                               {kStats, const_cast<float*>(lse)},
                                               {kdQ, dqkv},
                                               {kdK, dqkv + k},
                                               {kdV, dqkv + v}};
  p_->run(*g.bwd, pack, stream);
}

std::string CudnnAttention::version() const {
  const auto v = fe::detail::get_backend_version();
  return fmt::format("cuDNN {}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

std::size_t CudnnAttention::workspace_bytes() const {
  return p_->workspace_size;
}

}  // namespace tessera::kernels::cuda

#else  // no cuDNN headers in this build

namespace tessera::kernels::cuda {

struct CudnnAttention::Impl {};

std::unique_ptr<CudnnAttention> CudnnAttention::create(int, int, int, std::string* why) {
  if (why) *why = "this build has no cuDNN (its headers come with scripts/setup --with-cuda)";
  return nullptr;
}
CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : p_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;
bool CudnnAttention::supports(int, int) {
  return false;
}
void CudnnAttention::forward(std::uint16_t*, float*, const std::uint16_t*, int, int, void*) {
  throw Error("cuDNN attention is not in this build");
}
void CudnnAttention::backward(std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
                              const std::uint16_t*, const float*, int, int, void*) {
  throw Error("cuDNN attention is not in this build");
}
std::string CudnnAttention::version() const {
  return "";
}
std::size_t CudnnAttention::workspace_bytes() const {
  return 0;
}

}  // namespace tessera::kernels::cuda

#endif
